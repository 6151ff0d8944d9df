// The launch sequences of the CUDA im2col and col2im kernels of both layouts, written once over a
// Launcher (launch.h): columns_cuda.cu runs them on the GPU, the CPU harness on the CPU.
//
// im2col: in NCHW one thread per output pixel of each channel, writing its kh*kw entries (one
// thread per entry spent most of its time dividing: NOTES section 12); in NHWC one thread per
// channel of each output pixel, likewise. col2im: a gather, one thread per input pixel (NCHW) or
// per channel of one (NHWC), summing in the fixed order (ki, kj) with no atomics, so the result
// is bitwise the same on every run and equal to the CPU's (columns_thread.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>

#include "../checks.h"
#include "../column_types.h"
#include "../taps.h"
#include "columns_thread.h"
#include "launch.h"

namespace torch_convbp {

// `launch(image, column, index)` on the images' device, with type tags for the images' and the
// columns' element types and for the index type every element offset of the call fits in.
template <class Launcher, class Launch>
void launch_on_column_types(Launcher& launcher, const at::Tensor& images, const at::Tensor& columns,
                            Launch&& launch) {
  launcher.use_device(images.device());
  dispatch_column_types(images, columns, [&](auto image, auto column) {
    launcher.with_index(std::max(columns.numel(), images.numel()),
                        [&](auto index) { launch(image, column, index); });
  });
}

template <Layout layout, class Launcher>
void launch_im2col(Launcher& launcher, const char* op, const at::Tensor& images,
                   IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                   IntArrayRef dilation, int64_t row_start, int64_t rows,
                   const at::Tensor& columns) {
  const ColumnGeometry g = check_columns(op, layout, images, columns, kernel_size, stride, padding,
                                         dilation, row_start, rows);
  if (columns.numel() == 0) return;
  const int64_t total = layout == Layout::nhwc ? im2col_nhwc_threads(g) : im2col_threads(g);
  launch_on_column_types(launcher, images, columns, [&](auto image, auto column, auto index) {
    using image_t = typename decltype(image)::type;
    using column_t = typename decltype(column)::type;
    using index_t = decltype(index);
    launcher.template grid<index_t>(
        total, Im2colThread<layout, image_t, column_t, index_t>{
                   images.const_data_ptr<image_t>(), columns.mutable_data_ptr<column_t>(),
                   ColumnDims<index_t>(g)});
  });
}

template <Layout layout, class Launcher>
void launch_col2im(Launcher& launcher, const char* op, const at::Tensor& columns,
                   IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                   IntArrayRef dilation, int64_t row_start, int64_t rows,
                   const at::Tensor& images) {
  const ColumnGeometry g = check_columns(op, layout, images, columns, kernel_size, stride, padding,
                                         dilation, row_start, rows);
  const InputRows reached = input_rows_reached(g);
  if (reached.count == 0 || images.numel() == 0) return;
  const int64_t total = layout == Layout::nhwc ? col2im_nhwc_threads(g, reached.count)
                                               : col2im_threads(g, reached.count);
  launch_on_column_types(launcher, images, columns, [&](auto image, auto column, auto index) {
    using image_t = typename decltype(image)::type;
    using column_t = typename decltype(column)::type;
    using index_t = decltype(index);
    launcher.template grid<index_t>(
        total, Col2imThread<layout, image_t, column_t, index_t>{
                   columns.const_data_ptr<column_t>(), images.mutable_data_ptr<image_t>(),
                   ColumnDims<index_t>(g), static_cast<index_t>(reached.first),
                   static_cast<index_t>(reached.count)});
  });
}

}  // namespace torch_convbp
