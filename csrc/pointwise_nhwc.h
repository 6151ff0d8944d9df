// Route pointwise_nhwc (route.h): a pointwise convolution (1x1, stride 1, unpadded, one group) of
// channels_last operands, computed in NHWC with no copy at all (pointwise_nhwc.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "shape.h"

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

// The three operators on this route, on dense channels_last activations. The output and
// grad-input are written into the given channels_last tensors; the weight gradient is returned
// contiguous, like the weight gradient of every other route.
void pointwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s,
                            const Tensor& output);
void pointwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                               const Tensor& grad_input);
Tensor pointwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output,
                                  IntArrayRef weight_size, const ConvShape& s);

}  // namespace torch_convbp
