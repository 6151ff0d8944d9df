// What one CUDA thread of im2col or col2im computes, as host-and-device functions: the launch
// sequences of columns_launch.h run grid-stride loops over the functors at the end, on the GPU
// and, through the CPU harness (tests/cuda_harness/), on the CPU, where the results are compared
// bitwise with the CPU kernels.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include "../shape.h"
#include "../taps.h"

namespace torch_convbp {

// ColumnGeometry in the kernel's index type, so that a 32-bit kernel does 32-bit arithmetic.
template <typename index_t>
struct ColumnDims {
  index_t images, channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, out_width, row_start, rows, groups, depth, kernel_d, stride_d, pad_d,
      dilation_d, out_height, out_depth;
  explicit ColumnDims(const ColumnGeometry& g)
      : images(g.images),
        channels(g.channels),
        height(g.height),
        width(g.width),
        kernel_h(g.kernel_h),
        kernel_w(g.kernel_w),
        stride_h(g.stride_h),
        stride_w(g.stride_w),
        pad_h(g.pad_h),
        pad_w(g.pad_w),
        dilation_h(g.dilation_h),
        dilation_w(g.dilation_w),
        out_width(g.out_width),
        row_start(g.row_start),
        rows(g.rows),
        groups(g.groups),
        depth(g.depth),
        kernel_d(g.kernel_d),
        stride_d(g.stride_d),
        pad_d(g.pad_d),
        dilation_d(g.dilation_d),
        out_height(g.out_height),
        out_depth(g.out_depth) {}
  C10_HOST_DEVICE index_t taps() const { return kernel_d * kernel_h * kernel_w; }
  C10_HOST_DEVICE index_t volume() const { return depth * height * width; }  // one channel's
};

// How many threads each kernel's grid-stride loop covers: im2col one per patch (output pixel of
// one channel of one image), col2im one per input pixel of the `reached_rows` rows a band
// reaches (rows of all depth slices counted together: taps.h, input_rows_reached).
inline int64_t im2col_threads(const ColumnGeometry& g) {
  return g.images * g.channels * g.rows * g.out_width;
}
inline int64_t col2im_threads(const ColumnGeometry& g, int64_t reached_rows) {
  return g.images * g.channels * reached_rows * g.width;
}

// The patch of one channel that output pixel (band_row, ow) of the chunk sees: for each tap
// (kd, ki, kj), the input pixel (od*stride_d - pad_d + kd*dilation_d, oh*stride_h - pad_h +
// ki*dilation_h, ow*stride_w - pad_w + kj*dilation_w), 0 in the padding, written to
// dst[tap * dst_step], tap = (kd*kernel_h + ki)*kernel_w + kj. `channel` is the channel's pixel
// (0, 0, 0), its pixels `pixel_step` apart (1 in NCHW, the channel count in NHWC).
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline void copy_patch(const image_t* channel, index_t pixel_step, column_t* dst,
                                       index_t dst_step, const ColumnDims<index_t>& g,
                                       index_t band_row, index_t ow) {
  const index_t row = band_row + g.row_start;  // of the output, depth slices counted together
  const index_t od = slice_of(row, g.out_height, g.out_depth), oh = row - od * g.out_height;
  const index_t id0 = input_index(od, g.stride_d, g.pad_d, index_t(0), g.dilation_d);
  const index_t ih0 = input_index(oh, g.stride_h, g.pad_h, index_t(0), g.dilation_h);
  const index_t iw0 = input_index(ow, g.stride_w, g.pad_w, index_t(0), g.dilation_w);
  for (index_t kd = 0; kd < g.kernel_d; ++kd) {
    const index_t id = id0 + kd * g.dilation_d;
    const bool slice_inside = id >= 0 && id < g.depth;
    for (index_t ki = 0; ki < g.kernel_h; ++ki) {
      const index_t ih = ih0 + ki * g.dilation_h;
      const bool row_inside = slice_inside && ih >= 0 && ih < g.height;
      for (index_t kj = 0; kj < g.kernel_w; ++kj) {
        const index_t iw = iw0 + kj * g.dilation_w;
        const bool inside = row_inside && iw >= 0 && iw < g.width;
        dst[((kd * g.kernel_h + ki) * g.kernel_w + kj) * dst_step] =
            inside
                ? static_cast<column_t>(channel[((id * g.height + ih) * g.width + iw) * pixel_step])
                : column_t(0);
      }
    }
  }
}

// im2col for one thread: the patch that output pixel (band_row, ow) of channel c of one image
// sees, copied into the column-matrix rows (c, kd, ki, kj) of that pixel, 0 in the padding. The
// index decomposition (the divisions) is paid once per patch; consecutive threads take
// consecutive output pixels, so every row's writes are coalesced (and the reads too, for stride
// 1). i < images * channels * rows * out_width.
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline void im2col_patch(const image_t* images, column_t* columns,
                                         const ColumnDims<index_t>& g, index_t i) {
  // i = ((image * channels + c) * rows + band_row) * out_width + ow
  const index_t ow = i % g.out_width;
  index_t rest = i / g.out_width;
  const index_t band_row = rest % g.rows;
  rest /= g.rows;
  const index_t c = rest % g.channels;
  const index_t image = rest / g.channels;
  const image_t* volume = images + (image * g.channels + c) * g.volume();
  // Column-matrix row r = (c, kd, ki, kj) holds, for each image, a stretch of rows * out_width.
  const index_t block = g.rows * g.out_width;
  const index_t row_step = g.images * block;
  column_t* first =
      columns + (c * g.taps() * g.images + image) * block + band_row * g.out_width + ow;
  copy_patch(volume, index_t(1), first, row_step, g, band_row, ow);
}

// col2im as a gather: input pixel i (of the rows the band reaches, from first_row on) adds to
// itself the sum of the column entries that im2col copied from it, taken in the order
// (kd, ki, kj), the CPU kernel's order for every pixel. No atomics, and no two threads write one
// pixel.
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline void col2im_pixel(const column_t* columns, image_t* images,
                                         const ColumnDims<index_t>& g, index_t first_row,
                                         index_t reached_rows, index_t i) {
  using acc_t = at::opmath_type<image_t>;
  const index_t block = g.rows * g.out_width;  // a column-matrix row's stretch for one image
  // i = ((image * channels + c) * reached_rows + row - first_row) * width + iw
  const index_t iw = i % g.width;
  const index_t rest = i / g.width;
  const index_t row = rest % reached_rows + first_row;  // id * height + ih
  const index_t plane = rest / reached_rows;            // image * channels + c
  const index_t c = plane % g.channels, image = plane / g.channels;
  acc_t sum = 0;
  const index_t id = slice_of(row, g.height, g.depth);
  for_each_tap_reading(
      g, id, row - id * g.height, iw, [&](index_t tap, index_t band_row, index_t ow) {
        const index_t column_row = c * g.taps() + tap;
        sum += static_cast<acc_t>(
            columns[(column_row * g.images + image) * block + band_row * g.out_width + ow]);
      });
  const index_t pixel = (plane * g.depth * g.height + row) * g.width + iw;
  images[pixel] = static_cast<image_t>(static_cast<acc_t>(images[pixel]) + sum);
}

// The NHWC kernels: one thread per channel of a pixel, so that consecutive threads touch
// consecutive channels, adjacent in memory on both sides (coalesced reads and writes).
inline int64_t im2col_nhwc_threads(const ColumnGeometry& g) {
  return g.images * g.rows * g.out_width * g.channels;
}
inline int64_t col2im_nhwc_threads(const ColumnGeometry& g, int64_t reached_rows) {
  return g.images * reached_rows * g.width * g.channels;
}

// NHWC im2col for one thread: channel c of output pixel p, copied from each of the input pixels
// the kernel sees (0 in the padding) into its group's column-matrix row p, entries
// (kd, ki, kj, c mod C/G). i = p * channels + c, with p = (image * rows + band_row) * out_width
// + ow.
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline void im2col_nhwc_channel(const image_t* images, column_t* columns,
                                                const ColumnDims<index_t>& g, index_t i) {
  const index_t c = i % g.channels;
  const index_t p = i / g.channels;
  const index_t ow = p % g.out_width;
  const index_t rest = p / g.out_width;
  const index_t band_row = rest % g.rows;
  const index_t image = rest / g.rows;
  const index_t group_channels = g.channels / g.groups;
  const index_t pixels = g.images * g.rows * g.out_width;
  const index_t row_length = g.taps() * group_channels;
  column_t* row = columns + (c / group_channels * pixels + p) * row_length + c % group_channels;
  const image_t* channel = images + image * g.volume() * g.channels + c;
  copy_patch(channel, g.channels, row, group_channels, g, band_row, ow);
}

// NHWC col2im as a gather: channel c of input pixel (image, row, iw), of the rows the band
// reaches, adds to itself the column entries im2col copied from it, in the order (kd, ki, kj):
// the NCHW kernels' order, so the same columns give the same bits in both layouts.
// i = ((image * reached_rows + row - first_row) * width + iw) * channels + c.
template <typename image_t, typename column_t, typename index_t>
C10_HOST_DEVICE inline void col2im_nhwc_channel(const column_t* columns, image_t* images,
                                                const ColumnDims<index_t>& g, index_t first_row,
                                                index_t reached_rows, index_t i) {
  using acc_t = at::opmath_type<image_t>;
  const index_t c = i % g.channels;
  const index_t pixel = i / g.channels;
  const index_t iw = pixel % g.width;
  const index_t rest = pixel / g.width;
  const index_t row = rest % reached_rows + first_row;  // id * height + ih
  const index_t image = rest / reached_rows;
  const index_t group_channels = g.channels / g.groups;
  const index_t pixels = g.images * g.rows * g.out_width;
  const index_t row_length = g.taps() * group_channels;
  // Row p of this channel's group, at entry (0, 0, 0, c mod C/G).
  const column_t* group_rows =
      columns + c / group_channels * pixels * row_length + c % group_channels;
  acc_t sum = 0;
  const index_t id = slice_of(row, g.height, g.depth);
  for_each_tap_reading(
      g, id, row - id * g.height, iw, [&](index_t tap, index_t band_row, index_t ow) {
        const index_t p = (image * g.rows + band_row) * g.out_width + ow;
        sum += static_cast<acc_t>(group_rows[p * row_length + tap * group_channels]);
      });
  const index_t at = ((image * g.depth * g.height + row) * g.width + iw) * g.channels + c;
  images[at] = static_cast<image_t>(static_cast<acc_t>(images[at]) + sum);
}

// The threads of each kernel, as the functors a Launcher's grid runs (launch.h).
template <Layout layout, typename image_t, typename column_t, typename index_t>
struct Im2colThread {
  const image_t* images;
  column_t* columns;
  ColumnDims<index_t> g;
  C10_HOST_DEVICE void operator()(index_t i) const {
    if constexpr (layout == Layout::nhwc) {
      im2col_nhwc_channel(images, columns, g, i);
    } else {
      im2col_patch(images, columns, g, i);
    }
  }
};

template <Layout layout, typename image_t, typename column_t, typename index_t>
struct Col2imThread {
  const column_t* columns;
  image_t* images;
  ColumnDims<index_t> g;
  index_t first_row, reached_rows;
  C10_HOST_DEVICE void operator()(index_t i) const {
    if constexpr (layout == Layout::nhwc) {
      col2im_nhwc_channel(columns, images, g, first_row, reached_rows, i);
    } else {
      col2im_pixel(columns, images, g, first_row, reached_rows, i);
    }
  }
};

}  // namespace torch_convbp
