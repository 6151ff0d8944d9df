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

// The depth slice of a row that counts the rows of all depth slices together (slice * height +
// row, for output rows, input rows or kernel rows). With one slice, as for every image, no
// division: per pixel or per tap a division costs more than the rest of the index arithmetic.
template <typename index_t>
C10_HOST_DEVICE inline index_t slice_of(index_t merged_row, index_t height, index_t slices) {
  return slices == 1 ? index_t(0) : merged_row / height;
}

// Along one axis, the output index that reads input index `in` at kernel index k, or -1 where
// none does (in + pad - k * dilation is not on the stride, or the output index is outside
// [0, out_size)): the inverse of input_index, for k = 0, 1, 2, ... in turn. It keeps
// in + pad - k * dilation = out * stride + rest, with 0 <= rest < stride, and a step subtracts
// dilation = step_out * stride + step_rest with one carry: two divisions for the first k and none
// after (none at all at stride 1). A division per tap took most of a strided depthwise input
// gradient's time on the GPU (benchmarks/NOTES.md, section 46).
template <typename index_t>
struct OutputIndexByTap {
  index_t out, rest, stride, step_out, step_rest;
  C10_HOST_DEVICE OutputIndexByTap(index_t in, index_t pad, index_t dilation, index_t stride)
      : stride(stride) {
    if (stride == 1) {  // no division at all
      out = in + pad, rest = 0, step_out = dilation, step_rest = 0;
      return;
    }
    out = (in + pad) / stride;
    rest = in + pad - out * stride;
    step_out = dilation / stride;
    step_rest = dilation - step_out * stride;
  }
  // The output index that reads `in` at the current k, or -1 where none does.
  C10_HOST_DEVICE index_t at(index_t out_size) const {
    return rest == 0 && out >= 0 && out < out_size ? out : index_t(-1);
  }
  C10_HOST_DEVICE void next() {
    out -= step_out;
    rest -= step_rest;
    if (rest < 0) {
      rest += stride;
      --out;
    }
  }
};

// The input rows [first, first + count) that output rows [row_start, row_start + rows) of a
// chunk read, rows of all depth slices counted together (input row R is depth slice R / height,
// row R % height): the rows col2im writes. Within one output depth slice the band reads a tight
// range of rows of each input slice; a band over several output slices is given whole input
// slices. count is 0 when the band reaches only padding.
struct InputRows {
  int64_t first, count;
};
inline InputRows input_rows_reached(const ColumnGeometry& g) {
  if (g.rows == 0) return {0, 0};
  const int64_t first_row = g.row_start, last_row = g.row_start + g.rows - 1;
  const int64_t first_slice = first_row / g.out_height, last_slice = last_row / g.out_height;
  const int64_t id_first =
      std::max<int64_t>(0, input_index(first_slice, g.stride_d, g.pad_d, int64_t{0}, g.dilation_d));
  const int64_t id_last = std::min(
      g.depth - 1, input_index(last_slice, g.stride_d, g.pad_d, g.kernel_d - 1, g.dilation_d));
  int64_t ih_first = 0, ih_last = g.height - 1;
  if (first_slice == last_slice) {
    ih_first = std::max<int64_t>(
        0, input_index(first_row % g.out_height, g.stride_h, g.pad_h, int64_t{0}, g.dilation_h));
    ih_last = std::min(g.height - 1, input_index(last_row % g.out_height, g.stride_h, g.pad_h,
                                                 g.kernel_h - 1, g.dilation_h));
  }
  if (id_last < id_first || ih_last < ih_first) return {0, 0};
  const int64_t first = id_first * g.height + ih_first;
  return {first, id_last * g.height + ih_last - first + 1};
}

// The input row (depth slice and row counted together: id * height + ih) that output depth
// slice od, row oh reads at kernel depth kd and kernel row ki, or -1 in the padding.
template <typename Dims, typename index_t>
C10_HOST_DEVICE inline index_t input_row_reading(const Dims& g, index_t od, index_t oh, index_t kd,
                                                 index_t ki) {
  const index_t id = input_index(od, g.stride_d, g.pad_d, kd, g.dilation_d);
  const index_t ih = input_index(oh, g.stride_h, g.pad_h, ki, g.dilation_h);
  return id >= 0 && id < g.depth && ih >= 0 && ih < g.height ? id * g.height + ih : -1;
}

// The band of a chunk (ColumnGeometry) as runs of output rows within one depth slice: f(od,
// oh_begin, oh_end) for each slice the band crosses, in order (one call for an image). The CPU
// kernels walk each run as they walk an image's rows, with the depth's arithmetic once per run:
// per row and tap it slowed the 2-D layers' col2im by up to a half (benchmarks/NOTES.md, 29).
template <typename F>
inline void for_each_band_slice(const ColumnGeometry& g, F&& f) {
  if (g.out_depth == 1) return f(int64_t{0}, g.row_start, g.row_start + g.rows);  // no division
  for (int64_t row = g.row_start, end = g.row_start + g.rows; row < end;) {
    const int64_t od = row / g.out_height, oh = row % g.out_height;
    const int64_t oh_end = std::min(g.out_height, oh + end - row);
    f(od, oh, oh_end);
    row += oh_end - oh;
  }
}

// The gather of col2im (and the terms of the CPU's depthwise input gradient, whose "band" is every
// output row): f(tap, band_row, ow) for each tap (kd, ki, kj), in that order (tap =
// (kd * kernel_h + ki) * kernel_w + kj), that reads input pixel (id, ih, iw) from an output pixel
// (band_row, ow) of the chunk. The output indices are stepped tap by tap (OutputIndexByTap).
template <typename Dims, typename index_t, typename F>
C10_HOST_DEVICE inline void for_each_tap_reading(const Dims& g, index_t id, index_t ih, index_t iw,
                                                 F&& f) {
  const index_t band_end = g.row_start + g.rows;
  // Each axis's first tap found once (its divisions), then copied for every pass over that axis.
  const OutputIndexByTap<index_t> first_height(ih, g.pad_h, g.dilation_h, g.stride_h);
  const OutputIndexByTap<index_t> first_width(iw, g.pad_w, g.dilation_w, g.stride_w);
  OutputIndexByTap<index_t> depth(id, g.pad_d, g.dilation_d, g.stride_d);
  for (index_t kd = 0; kd < g.kernel_d; ++kd, depth.next()) {
    const index_t od = depth.at(g.out_depth);
    if (od < 0) continue;
    OutputIndexByTap<index_t> height = first_height;
    for (index_t ki = 0; ki < g.kernel_h; ++ki, height.next()) {
      const index_t oh = height.at(g.out_height);
      const index_t row = od * g.out_height + oh;  // of the output, depth slices counted together
      if (oh < 0 || row < g.row_start || row >= band_end) continue;
      OutputIndexByTap<index_t> width = first_width;
      for (index_t kj = 0; kj < g.kernel_w; ++kj, width.next()) {
        const index_t ow = width.at(g.out_width);
        if (ow >= 0) f((kd * g.kernel_h + ki) * g.kernel_w + kj, row - g.row_start, ow);
      }
    }
  }
}

}  // namespace torch_convbp
