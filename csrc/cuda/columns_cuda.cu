// The CUDA im2col and col2im kernels of both layouts: the launch sequences of columns_launch.h on
// the GPU, under a device guard, on the current stream.
#include <torch/library.h>

#include "columns_launch.h"
#include "cuda_launcher.cuh"

namespace torch_convbp {
namespace {

template <Layout layout>
void im2col_cuda(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
                 IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                 const at::Tensor& columns) {
  CudaLauncher launcher;
  launch_im2col<layout>(launcher,
                        layout == Layout::nhwc ? "torch_convbp.im2col_nhwc" : "torch_convbp.im2col",
                        images, kernel_size, stride, padding, dilation, row_start, rows, columns);
}

template <Layout layout>
void col2im_cuda(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                 IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                 const at::Tensor& images) {
  CudaLauncher launcher;
  launch_col2im<layout>(launcher,
                        layout == Layout::nhwc ? "torch_convbp.col2im_nhwc" : "torch_convbp.col2im",
                        columns, kernel_size, stride, padding, dilation, row_start, rows, images);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("im2col", &im2col_cuda<Layout::nchw>);
  m.impl("col2im", &col2im_cuda<Layout::nchw>);
  m.impl("im2col_nhwc", &im2col_cuda<Layout::nhwc>);
  m.impl("col2im_nhwc", &col2im_cuda<Layout::nhwc>);
}

}  // namespace torch_convbp
