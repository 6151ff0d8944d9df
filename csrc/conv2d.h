// The convolution operators of torch_convbp (conv2d.cpp), in 2-D and 3-D, registered for every
// device in ops.cpp. The rest of the C++ code is laid out by job (README, "How it is built"):
//   shape.h, checks.h   the sizes of a call and every check of its arguments
//   route.h             which route each operator takes, chosen in one place
//   conv2d.cpp          the orchestration: a switch over the routes
//   volume_planes.h     3-D convolutions that are 2-D ones on views of their tensors
//   device_kernels.h    the device kernels, reached through the dispatcher
//   plan.h, gemm.h      how a call is cut into pieces, and its GEMMs
//   cpu/, cuda/         the device kernels, which include only what they compute with
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                      int64_t groups);
Tensor conv2d_input_grad(const Tensor& grad_output, const Tensor& weight, IntArrayRef input_size,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t groups);
Tensor conv2d_weight_grad(const Tensor& input, const Tensor& grad_output, IntArrayRef weight_size,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t groups);

// The same three for [N, C, D, H, W] tensors, on the same engine (shape.h).
Tensor conv3d_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                      int64_t groups);
Tensor conv3d_input_grad(const Tensor& grad_output, const Tensor& weight, IntArrayRef input_size,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t groups);
Tensor conv3d_weight_grad(const Tensor& input, const Tensor& grad_output, IntArrayRef weight_size,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t groups);

}  // namespace torch_convbp
