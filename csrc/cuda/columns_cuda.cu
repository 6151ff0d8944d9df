// The CUDA im2col and col2im kernels: the only CUDA-specific code of torch_convbp.
//
// im2col: one thread per column entry, consecutive threads along an output row, so the writes
// are coalesced (and, for stride 1, the reads too).
// col2im: a gather. One thread per input pixel sums, in the fixed order (ki, kj), the column
// entries that im2col copied from it, and adds the sum to the pixel. No atomics, no two threads
// write one pixel: the result is bitwise the same on every run, and the same order as the CPU's.
// Index arithmetic is 32-bit where every index fits, 64-bit where it does not (past 2^31 elements).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "../column_types.h"
#include "../conv2d.h"
#include "launch.cuh"

namespace torch_convbp {
namespace {

// ColumnGeometry in the kernel's index type, so that 32-bit kernels do 32-bit arithmetic.
template <typename index_t>
struct Dims {
  index_t images, channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, out_width, row_start, rows;
  explicit Dims(const ColumnGeometry& g)
      : images(g.images), channels(g.channels), height(g.height), width(g.width),
        kernel_h(g.kernel_h), kernel_w(g.kernel_w), stride_h(g.stride_h), stride_w(g.stride_w),
        pad_h(g.pad_h), pad_w(g.pad_w), dilation_h(g.dilation_h), dilation_w(g.dilation_w),
        out_width(g.out_width), row_start(g.row_start), rows(g.rows) {}
};

template <typename image_t, typename column_t, typename index_t>
__global__ void im2col_kernel(const image_t* __restrict__ images, column_t* __restrict__ columns,
                              Dims<index_t> g, index_t total) {
  const index_t step = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    // i = ((row * images + image) * rows + oh') * out_width + ow, with row = (c, ki, kj)
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
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    columns[i] = inside ? static_cast<column_t>(
                              images[((image * g.channels + c) * g.height + ih) * g.width + iw])
                        : column_t(0);
  }
}

template <typename image_t, typename column_t, typename index_t>
__global__ void col2im_kernel(const column_t* __restrict__ columns, image_t* __restrict__ images,
                              Dims<index_t> g, index_t first_ih, index_t reached_rows,
                              index_t total) {
  using acc_t = at::opmath_type<image_t>;
  const index_t step = static_cast<index_t>(gridDim.x) * blockDim.x;
  const index_t block = g.rows * g.out_width;  // a column-matrix row's stretch for one image
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    // i = ((image * channels + c) * reached_rows + ih') * width + iw
    const index_t iw = i % g.width;
    index_t rest = i / g.width;
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
}

void im2col_cuda(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
                 IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                 const at::Tensor& columns) {
  const ColumnGeometry g = check_columns("torch_convbp.im2col", images, columns, kernel_size,
                                         stride, padding, dilation, row_start, rows);
  const int64_t total = columns.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(images.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const image_t* src = images.const_data_ptr<image_t>();
    column_t* dst = columns.mutable_data_ptr<column_t>();
    if (fits_int32(total) && fits_int32(images.numel())) {
      im2col_kernel<image_t, column_t, int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
          src, dst, Dims<int32_t>(g), static_cast<int32_t>(total));
    } else {
      im2col_kernel<image_t, column_t, int64_t><<<blocks_for(total), kThreads, 0, stream>>>(
          src, dst, Dims<int64_t>(g), total);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void col2im_cuda(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                 IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                 const at::Tensor& images) {
  const ColumnGeometry g = check_columns("torch_convbp.col2im", images, columns, kernel_size,
                                         stride, padding, dilation, row_start, rows);
  // The input rows that output rows [row_start, row_start + rows) reach.
  const int64_t first_ih = std::max<int64_t>(0, g.row_start * g.stride_h - g.pad_h);
  const int64_t last_ih =
      std::min(g.height - 1, (g.row_start + g.rows - 1) * g.stride_h - g.pad_h +
                                 (g.kernel_h - 1) * g.dilation_h);
  if (g.rows == 0 || last_ih < first_ih || images.numel() == 0) return;
  const int64_t reached = last_ih - first_ih + 1;
  const int64_t total = g.images * g.channels * reached * g.width;
  const c10::cuda::CUDAGuard guard(images.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const column_t* src = columns.const_data_ptr<column_t>();
    image_t* dst = images.mutable_data_ptr<image_t>();
    if (fits_int32(columns.numel()) && fits_int32(images.numel())) {
      col2im_kernel<image_t, column_t, int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
          src, dst, Dims<int32_t>(g), static_cast<int32_t>(first_ih),
          static_cast<int32_t>(reached), static_cast<int32_t>(total));
    } else {
      col2im_kernel<image_t, column_t, int64_t><<<blocks_for(total), kThreads, 0, stream>>>(
          src, dst, Dims<int64_t>(g), first_ih, reached, total);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("im2col", &im2col_cuda);
  m.impl("col2im", &col2im_cuda);
}

}  // namespace torch_convbp
