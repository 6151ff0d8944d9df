// The CUDA kernels of narrow groups: the launch sequences of grouped_launch.h on the GPU, under a
// device guard, on the current stream.
#include <torch/library.h>

#include "cuda_launcher.cuh"
#include "grouped_launch.h"

namespace torch_convbp {
namespace {

void grouped_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                         IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                         const at::Tensor& output) {
  CudaLauncher launcher;
  launch_grouped_forward(launcher, "torch_convbp.grouped_conv2d", input, weight, stride, padding,
                         dilation, groups, output);
}

void grouped_weight_grad_cuda(const at::Tensor& input, const at::Tensor& grad_output,
                              IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                              int64_t groups, const at::Tensor& grad_weight) {
  CudaLauncher launcher;
  launch_grouped_weight_grad(launcher, "torch_convbp.grouped_weight_grad", input, grad_output,
                             stride, padding, dilation, groups, grad_weight);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("grouped_conv2d", &grouped_conv2d_cuda);
  m.impl("grouped_weight_grad", &grouped_weight_grad_cuda);
}

}  // namespace torch_convbp
