// The CPU's transposing copy (transpose_copy_cpu.cpp), for the CPU kernels that rearrange an
// operand themselves: target[b, j, i] = source[b, i, j], for source [B, R, C] and target
// [B, C, R], each with contiguous rows; checked as the operator checks it.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_convbp {

void transpose_copy_cpu(const at::Tensor& source, const at::Tensor& target);

}  // namespace torch_convbp
