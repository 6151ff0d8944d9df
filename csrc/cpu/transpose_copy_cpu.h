// The CPU's transposing copies (transpose_copy_cpu.cpp), for the CPU kernels that rearrange an
// operand themselves: of a batch of matrices, as the operator does it, and of one matrix.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torch_convbp {

// target[b, j, i] = source[b, i, j], for source [B, R, C] and target [B, C, R], each with
// contiguous rows; checked as the operator checks it.
void transpose_copy_cpu(const at::Tensor& source, const at::Tensor& target);

// target[g, b, a, t] = source[g, a, b, t] (reverse_taps: source[g, a, b, taps-1-t]), for a
// contiguous source [G, A, B, taps] and a target [G, B, A, taps] of any memory order; checked as
// the operator checks it.
void transpose_taps_cpu(const at::Tensor& source, const at::Tensor& target, bool reverse_taps);

// target[j * target_stride + i] = source[i * source_stride + j] for i < rows and j < cols: one
// matrix of `element_size`-byte elements (1, 2, 4 or 8), on the calling thread. A copy moves
// bits: the elements are seen only by their size.
void transpose_matrix(const void* source, int64_t source_stride, void* target,
                      int64_t target_stride, int64_t rows, int64_t cols, int64_t element_size);

}  // namespace torch_convbp
