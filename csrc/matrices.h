// How the tensors of each memory layout are seen as the GEMMs' matrices, without copies
// (matrices.cpp).
//
// The orchestration (conv2d.cpp) writes every GEMM once, on these matrices, per group g of G:
//   an activation chunk [n, C, h, w]   [G, C/G, P]      channels by its P = n*h*w pixels
//   the column matrix                  [G, K, P]        K = kh*kw*C/G rows by pixels
//   the weight [Cout, C/G, kh, kw]     [G, Cout/G, K]
// In NCHW these are views of row-major memory. In NHWC the memory holds the same matrices
// transposed (pixels by channels: a chunk is [P, C], the column matrix [G, P, K]), and the views
// are transposed ones, which ATen's GEMMs (MKL, cuBLAS) read and write through their transpose
// flags. K's order follows the layout: (c, ki, kj) in NCHW, (ki, kj, c) in NHWC, which is the
// memory order of a channels_last weight's rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "shape.h"

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

// t.narrow(dim, start, length), or t itself where that is all of it: the same elements without a
// view op (three dispatcher calls), which a small layer's host time pays for (benchmarks/NOTES.md,
// section 32).
Tensor part_of(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// t.to(dtype), or t itself where it has that dtype (no dispatcher call), likewise.
Tensor in_dtype(const Tensor& t, at::ScalarType dtype);

// A chunk [n, C, h, w] of an activation in `layout` as its group matrices [G, C/G, n*h*w], when
// its memory allows a view (in NCHW: one image at a time) and it has `dtype`.
std::optional<Tensor> group_matrix_view(const Tensor& chunk, int64_t groups, at::ScalarType dtype,
                                        Layout layout);

// A chunk of `size` [n, C, h, w] laid over `buffer` (at least its numel) so that its group
// matrices are a view: channel-major [C, n, h, w] in NCHW, [n, h, w, C] in NHWC. For the
// operands of a GEMM that are not views of the activations (copied in, or copied out after).
Tensor staging_chunk(const Tensor& buffer, IntArrayRef size, Layout layout);

// The column matrix [G, K, P] of `pixels` pixels laid over `buffer`, and the tensor the layout's
// im2col/col2im operators take for it (shape.h, ColumnGeometry): [G, K, P] in NCHW, [G, P, K] in
// NHWC, both contiguous.
Tensor column_matrix(const Tensor& buffer, const ConvShape& s, int64_t pixels, Layout layout);
Tensor column_kernel_operand(const Tensor& column_matrix, Layout layout);

// The weight [Cout, C/G, kh, kw] as its G matrices [Cout/G, K], K in the layout's order (a copy
// only where the weight is not in that memory format), and back: [G, Cout/G, K] matrices as a
// weight of `weight_size` and `dtype` in the layout's memory format (contiguous for NCHW,
// channels_last for NHWC: the matrices' own memory where they are contiguous and of `dtype`).
Tensor weight_matrices(const Tensor& weight, const ConvShape& s, Layout layout);
Tensor weight_of_matrices(const Tensor& matrices, IntArrayRef weight_size, at::ScalarType dtype,
                          Layout layout);

}  // namespace torch_convbp
