// A pointwise convolution (1x1, stride 1, unpadded, one group) of channels_last operands,
// computed in NHWC with no copy at all (pointwise_nhwc.cpp). One of the native channels_last
// routes, with the depthwise kernels (docs/design.md, "Memory formats").
#pragma once

#include <initializer_list>

#include "conv2d.h"

namespace torch_convbp {

// Whether this route takes a call: the shape is pointwise with one group, the operands compute
// in NHWC (computes_in_nhwc, layout.h), and the GEMMs run in the operands' own dtype (not in
// float32 for float16/bfloat16 on a CPU without instructions for them). The fake kernels mirror
// it (torch_convbp/_meta.py).
bool takes_pointwise_nhwc(const ConvShape& s, std::initializer_list<const Tensor*> operands);

// The three operators on this route. The output and grad-input are channels_last; the weight
// gradient is contiguous, like the weight gradient of every other call.
Tensor pointwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s);
Tensor pointwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight,
                                 const ConvShape& s);
Tensor pointwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output,
                                  IntArrayRef weight_size, const ConvShape& s);

}  // namespace torch_convbp
