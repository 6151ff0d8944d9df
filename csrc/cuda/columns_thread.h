// What one CUDA thread of im2col or col2im computes, as host-and-device functions: the kernels in
// columns_cuda.cu are grid-stride loops over these, and the CPU harness (tests/cuda_harness/) runs
// the same functions for every index of the grid and compares them bitwise with the CPU kernels.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include "../conv2d.h"

namespace torch_convbp {

// ColumnGeometry in the kernel's index type, so that a 32-bit kernel does 32-bit arithmetic.
template <typename index_t>
struct ColumnDims {
  index_t images, channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, out_width, row_start, rows;
  explicit ColumnDims(const ColumnGeometry& g)
      : images(g.images), channels(g.channels), height(g.height), width(g.width),
        kernel_h(g.kernel_h), kernel_w(g.kernel_w), stride_h(g.stride_h), stride_w(g.stride_w),
        pad_h(g.pad_h), pad_w(g.pad_w), dilation_h(g.dilation_h), dilation_w(g.dilation_w),
        out_width(g.out_width), row_start(g.row_start), rows(g.rows) {}
};

// Column-matrix entry i: the input pixel it copies, or 0 in the padding. One thread per entry,
// consecutive threads along an output row, so the writes are coalesced (and the reads too, for
// stride 1).
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline column_t im2col_entry(const image_t* images, const ColumnDims<index_t>& g,
                                             index_t i) {
  // i = ((row * images + image) * rows + oh - row_start) * out_width + ow, row = (c, ki, kj)
  const index_t ow = i % g.out_width;
  index_t rest = i / g.out_width;
  const index_t oh = rest % g.rows + g.row_start;
  rest /= g.rows;
  const index_t image = rest % g.images;
  const index_t row = rest / g.images;
  const index_t kj = row % g.kernel_w;
  const index_t ki = row / g.kernel_w % g.kernel_h;
  const index_t c = row / (g.kernel_w * g.kernel_h);
  const index_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
  const index_t iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
  if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) return column_t(0);
  return static_cast<column_t>(images[((image * g.channels + c) * g.height + ih) * g.width + iw]);
}

// col2im as a gather: input pixel i (of the rows the band reaches, from first_ih on) adds to
// itself the sum of the column entries that im2col copied from it, taken in the order (ki, kj),
// the CPU kernel's order for every pixel. No atomics, and no two threads write one pixel.
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline void col2im_pixel(const column_t* columns, image_t* images,
                                         const ColumnDims<index_t>& g, index_t first_ih,
                                         index_t reached_rows, index_t i) {
  using acc_t = at::opmath_type<image_t>;
  const index_t block = g.rows * g.out_width;  // a column-matrix row's stretch for one image
  // i = ((image * channels + c) * reached_rows + ih - first_ih) * width + iw
  const index_t iw = i % g.width;
  const index_t rest = i / g.width;
  const index_t ih = rest % reached_rows + first_ih;
  const index_t plane = rest / reached_rows;  // image * channels + c
  const index_t c = plane % g.channels, image = plane / g.channels;
  acc_t sum = 0;
  for (index_t ki = 0; ki < g.kernel_h; ++ki) {
    const index_t oh_scaled = ih + g.pad_h - ki * g.dilation_h;  // = oh * stride_h
    if (oh_scaled < 0 || oh_scaled % g.stride_h != 0) continue;
    const index_t oh = oh_scaled / g.stride_h - g.row_start;
    if (oh < 0 || oh >= g.rows) continue;
    for (index_t kj = 0; kj < g.kernel_w; ++kj) {
      const index_t ow_scaled = iw + g.pad_w - kj * g.dilation_w;
      if (ow_scaled < 0 || ow_scaled % g.stride_w != 0) continue;
      const index_t ow = ow_scaled / g.stride_w;
      if (ow >= g.out_width) continue;
      const index_t row = (c * g.kernel_h + ki) * g.kernel_w + kj;
      sum += static_cast<acc_t>(columns[(row * g.images + image) * block + oh * g.out_width + ow]);
    }
  }
  const index_t pixel = (plane * g.height + ih) * g.width + iw;
  images[pixel] = static_cast<image_t>(static_cast<acc_t>(images[pixel]) + sum);
}

}  // namespace torch_convbp
