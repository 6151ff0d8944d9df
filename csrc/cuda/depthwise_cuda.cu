// The CUDA depthwise kernels: the launch sequences of depthwise_launch.h on the GPU, under a
// device guard, on the current stream.
#include <torch/library.h>

#include "cuda_launcher.cuh"
#include "depthwise_launch.h"

namespace torch_convbp {
namespace {

void depthwise_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                           IntArrayRef padding, IntArrayRef dilation, const at::Tensor& output) {
  CudaLauncher launcher;
  launch_depthwise_forward(launcher, "torch_convbp.depthwise_conv2d", input, weight, stride,
                           padding, dilation, output);
}

void depthwise_input_grad_cuda(const at::Tensor& grad_output, const at::Tensor& weight,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               const at::Tensor& grad_input) {
  CudaLauncher launcher;
  launch_depthwise_input_grad(launcher, "torch_convbp.depthwise_input_grad", grad_output, weight,
                              stride, padding, dilation, grad_input);
}

void depthwise_weight_grad_cuda(const at::Tensor& input, const at::Tensor& grad_output,
                                IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                const at::Tensor& grad_weight) {
  CudaLauncher launcher;
  launch_depthwise_weight_grad(launcher, "torch_convbp.depthwise_weight_grad", input, grad_output,
                               stride, padding, dilation, grad_weight);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("depthwise_conv2d", &depthwise_conv2d_cuda);
  m.impl("depthwise_input_grad", &depthwise_input_grad_cuda);
  m.impl("depthwise_weight_grad", &depthwise_weight_grad_cuda);
}

}  // namespace torch_convbp
