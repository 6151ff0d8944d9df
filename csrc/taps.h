// Where a kernel tap reads, in both directions, for every device. Forward: the input index that
// an output index reads at a tap. Backward (the gathers: col2im and the depthwise input
// gradient): the output index that reads an input index at a tap. Host-and-device functions, so
// that the CPU kernels, the CUDA kernels and the CPU harness of the CUDA threads share one piece
// of arithmetic.
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>

#include "shape.h"

namespace torch_convbp {

// Along one axis: the input index that output index `out` reads at kernel index k (outside
// [0, size) in the padding).
template <typename index_t>
C10_HOST_DEVICE inline index_t input_index(index_t out, index_t stride, index_t pad, index_t k,
                                           index_t dilation) {
  return out * stride - pad + k * dilation;
}

// Along one axis: the output index that reads input index `in` at kernel index k, or -1 where
// none does (in is not on that tap's stride, or the output index is outside [0, out_size)). The
// inverse of input_index.
template <typename index_t>
C10_HOST_DEVICE inline index_t output_index(index_t in, index_t pad, index_t k, index_t dilation,
                                            index_t stride, index_t out_size) {
  const index_t scaled = in + pad - k * dilation;  // = out * stride
  if (scaled < 0 || scaled % stride != 0 || scaled / stride >= out_size) return -1;
  return scaled / stride;
}

// The input rows [first, first + count) that output rows [row_start, row_start + rows) of a
// chunk read: the rows col2im writes. count is 0 when the band reaches only padding.
struct InputRows {
  int64_t first, count;
};
inline InputRows input_rows_reached(const ColumnGeometry& g) {
  const int64_t first =
      std::max<int64_t>(0, input_index(g.row_start, g.stride_h, g.pad_h, int64_t{0}, g.dilation_h));
  const int64_t last = std::min(g.height - 1, input_index(g.row_start + g.rows - 1, g.stride_h,
                                                          g.pad_h, g.kernel_h - 1, g.dilation_h));
  return {first, g.rows == 0 || last < first ? 0 : last - first + 1};
}

// For a chunk of a column matrix (ColumnGeometry, or cuda/columns_thread.h's ColumnDims): the row
// of the chunk's band (output row - row_start) whose kernel row ki reads input row ih, or -1
// where none does.
template <typename Dims, typename index_t>
C10_HOST_DEVICE inline index_t band_row_reading(const Dims& g, index_t ih, index_t ki) {
  const index_t oh =
      output_index<index_t>(ih, g.pad_h, ki, g.dilation_h, g.stride_h, g.row_start + g.rows);
  return oh >= g.row_start ? oh - g.row_start : -1;
}

// The output column whose kernel column kj reads input column iw, or -1 where none does.
template <typename Dims, typename index_t>
C10_HOST_DEVICE inline index_t out_column_reading(const Dims& g, index_t iw, index_t kj) {
  return output_index<index_t>(iw, g.pad_w, kj, g.dilation_w, g.stride_w, g.out_width);
}

// The gather of col2im: f(ki, kj, band_row, ow) for each tap (ki, kj), in (ki, kj) order, that
// reads input pixel (ih, iw) from an output pixel (band_row, ow) of the chunk.
template <typename Dims, typename index_t, typename F>
C10_HOST_DEVICE inline void for_each_tap_reading(const Dims& g, index_t ih, index_t iw, F&& f) {
  for (index_t ki = 0; ki < g.kernel_h; ++ki) {
    const index_t band_row = band_row_reading(g, ih, ki);
    if (band_row < 0) continue;
    for (index_t kj = 0; kj < g.kernel_w; ++kj) {
      const index_t ow = out_column_reading(g, iw, kj);
      if (ow >= 0) f(ki, kj, band_row, ow);
    }
  }
}

}  // namespace torch_convbp
