// The GEMMs' matrices of each layout, as views (see matrices.h).
#include "matrices.h"

#include <ATen/TensorUtils.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

#include "device_kernels.h"
#include "layout.h"

namespace torch_convbp {
namespace {

// `t` viewed as `shape`, when its strides allow it.
std::optional<Tensor> view_if_possible(const Tensor& t, IntArrayRef shape) {
  if (!at::detail::computeStride(t.sizes(), t.strides(), shape)) return std::nullopt;
  return t.view(shape);
}

}  // namespace

Tensor part_of(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  if (start == 0 && length == t.size(dim)) return t;
  return t.narrow(dim, start, length);
}

Tensor in_dtype(const Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

std::optional<Tensor> group_matrix_view(const Tensor& chunk, int64_t groups, at::ScalarType dtype,
                                        Layout layout) {
  if (chunk.scalar_type() != dtype) return std::nullopt;
  const int64_t channels = chunk.size(1), pixels = chunk.numel() / channels;
  if (layout == Layout::nchw) {
    // [C, n, h, w] -> [G, C/G, P]
    return view_if_possible(chunk.transpose(0, 1), {groups, channels / groups, pixels});
  }
  // [n, h, w, C] -> [P, G, C/G] -> [G, C/G, P]
  const auto by_pixel =
      view_if_possible(chunk.permute({0, 2, 3, 1}), {pixels, groups, channels / groups});
  if (!by_pixel) return std::nullopt;
  return by_pixel->permute({1, 2, 0});
}

Tensor staging_chunk(const Tensor& buffer, IntArrayRef size, Layout layout) {
  const int64_t n = size[0], c = size[1], h = size[2], w = size[3];
  const Tensor memory = part_of(buffer, 0, 0, n * c * h * w);
  return layout == Layout::nchw ? memory.view({c, n, h, w}).transpose(0, 1)
                                : memory.view({n, h, w, c}).permute({0, 3, 1, 2});
}

Tensor column_matrix(const Tensor& buffer, const ConvShape& s, int64_t pixels, Layout layout) {
  const int64_t g = s.groups, rows = s.column_rows() / g;
  const Tensor memory = part_of(buffer, 0, 0, s.column_rows() * pixels);
  return layout == Layout::nchw ? memory.view({g, rows, pixels})
                                : memory.view({g, pixels, rows}).transpose(1, 2);
}

Tensor column_kernel_operand(const Tensor& column_matrix, Layout layout) {
  return layout == Layout::nchw ? column_matrix : column_matrix.transpose(1, 2);
}

Tensor weight_matrices(const Tensor& weight, const ConvShape& s, Layout layout) {
  const std::vector<int64_t> matrices{s.groups, s.out_channels / s.groups, -1};
  if (layout == Layout::nchw) return weight.contiguous().view(matrices);
  // [Cout, (kd,) kh, kw, C/G] rows: the channels_last weight's memory, copied into it where the
  // weight is contiguous by the transposing copy (layout.h: ATen's copy of the permuted view,
  // converting the dtype as it went, took twice as long, up to a tenth of a deep layer's weight
  // gradient: benchmarks/NOTES.md, section 60)
  return in_layout(weight, layout).movedim(1, -1).view(matrices);
}

// Matrices [G, M, N] in contiguous memory: themselves, or a copy, by the transposing copy kernel
// where they are the transposed view of [G, N, M] (the micro-kernel driver's weight gradient:
// gemm.h, empty_gemm_result), which ATen's copy ran at a few GB/s (benchmarks/NOTES.md, 30).
Tensor contiguous_matrices(const Tensor& matrices) {
  if (matrices.is_contiguous()) return matrices;
  if (!matrices.transpose(1, 2).is_contiguous()) return matrices.contiguous();
  Tensor result = at::empty(matrices.sizes(), matrices.options());
  call_transpose_copy(matrices.transpose(1, 2), result);
  return result;
}

Tensor weight_of_matrices(const Tensor& matrices, IntArrayRef weight_size, at::ScalarType dtype,
                          Layout layout) {
  const int64_t out_channels = weight_size[0], channels = weight_size[1];
  // converted while contiguous: [G, Cout/G, K] as [Cout, K]
  const Tensor rows = in_dtype(contiguous_matrices(matrices), dtype).view({out_channels, -1});
  if (layout == Layout::nchw) return rows.view(weight_size);
  // [Cout, (kd,) kh, kw, C/G] rows: the channels_last weight's memory, viewed as it
  std::vector<int64_t> nhwc_rows{out_channels};
  nhwc_rows.insert(nhwc_rows.end(), weight_size.begin() + 2, weight_size.end());
  nhwc_rows.push_back(channels);
  return rows.view(nhwc_rows).movedim(-1, 1);
}

}  // namespace torch_convbp
