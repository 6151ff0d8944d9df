// The CUDA im2col and col2im kernels of both layouts.
//
// Each kernel is a grid-stride loop over one thread's work, written once in columns_thread.h as
// host-and-device functions, which the CPU harness (tests/cuda_harness/) checks bitwise against
// the CPU kernels. im2col: in NCHW one thread per output pixel of each channel, writing its kh*kw
// entries (one thread per entry spent most of its time dividing: NOTES); in NHWC one thread per
// channel of each output pixel, likewise. col2im: a gather, one thread per input pixel (NCHW) or
// per channel of one (NHWC), summing in the fixed order (ki, kj) with no atomics, so the result
// is bitwise the same on every run and equal to the CPU's. Index arithmetic is 32-bit where every
// index fits, 64-bit where it does not (past 2^31 elements).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "../column_types.h"
#include "../conv2d.h"
#include "columns_thread.h"
#include "launch.h"

namespace torch_convbp {
namespace {

// Both layouts' kernels: NCHW one thread per patch (im2col) or input pixel (col2im), NHWC one
// thread per channel of those (columns_thread.h).
template <Layout layout, typename image_t, typename column_t, typename index_t>
__global__ void im2col_kernel(const image_t* __restrict__ images, column_t* __restrict__ columns,
                              ColumnDims<index_t> g, index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t i) {
    if constexpr (layout == Layout::nhwc) {
      im2col_nhwc_channel(images, columns, g, i);
    } else {
      im2col_patch(images, columns, g, i);
    }
  });
}

template <Layout layout, typename image_t, typename column_t, typename index_t>
__global__ void col2im_kernel(const column_t* __restrict__ columns, image_t* __restrict__ images,
                              ColumnDims<index_t> g, index_t first_ih, index_t reached_rows,
                              index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t i) {
    if constexpr (layout == Layout::nhwc) {
      col2im_nhwc_channel(columns, images, g, first_ih, reached_rows, i);
    } else {
      col2im_pixel(columns, images, g, first_ih, reached_rows, i);
    }
  });
}

template <Layout layout>
void im2col_cuda(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
                 IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                 const at::Tensor& columns) {
  const char* op = layout == Layout::nhwc ? "torch_convbp.im2col_nhwc" : "torch_convbp.im2col";
  const ColumnGeometry g = check_columns(op, layout, images, columns, kernel_size, stride, padding,
                                         dilation, row_start, rows);
  if (columns.numel() == 0) return;
  const int64_t total = layout == Layout::nhwc ? im2col_nhwc_threads(g) : im2col_threads(g);
  const c10::cuda::CUDAGuard guard(images.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const image_t* src = images.const_data_ptr<image_t>();
    column_t* dst = columns.mutable_data_ptr<column_t>();
    with_index_type(std::max(columns.numel(), images.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      im2col_kernel<layout, image_t, column_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          src, dst, ColumnDims<index_t>(g), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

template <Layout layout>
void col2im_cuda(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                 IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                 const at::Tensor& images) {
  const char* op = layout == Layout::nhwc ? "torch_convbp.col2im_nhwc" : "torch_convbp.col2im";
  const ColumnGeometry g = check_columns(op, layout, images, columns, kernel_size, stride, padding,
                                         dilation, row_start, rows);
  const InputRows reached = input_rows_reached(g);
  if (reached.count == 0 || images.numel() == 0) return;
  const int64_t total = layout == Layout::nhwc ? col2im_nhwc_threads(g, reached.count)
                                               : col2im_threads(g, reached.count);
  const c10::cuda::CUDAGuard guard(images.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const column_t* src = columns.const_data_ptr<column_t>();
    image_t* dst = images.mutable_data_ptr<image_t>();
    with_index_type(std::max(columns.numel(), images.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      col2im_kernel<layout, image_t, column_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          src, dst, ColumnDims<index_t>(g), static_cast<index_t>(reached.first),
          static_cast<index_t>(reached.count), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("im2col", &im2col_cuda<Layout::nchw>);
  m.impl("col2im", &col2im_cuda<Layout::nchw>);
  m.impl("im2col_nhwc", &im2col_cuda<Layout::nhwc>);
  m.impl("col2im_nhwc", &col2im_cuda<Layout::nhwc>);
}

}  // namespace torch_convbp
