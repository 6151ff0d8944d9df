// The float32 NCHW depthwise forward and input gradient with each pixel's sum in vector registers
// (depthwise_planes_cpu.cpp), which the NCHW depthwise kernels (depthwise_cpu.cpp) call where
// these take the convolution. They sum in those kernels' order, so they give their bits.
#pragma once

#include "../shape.h"

namespace torch_convbp {

// Whether these compute the forward (any channel multiplier and dilation) and the input gradient
// (one output channel per input channel) of this depthwise convolution: a 3x3 kernel at stride 1
// along the rows (the input gradient: stride 1), or a kernel of at most 9 taps strided.
bool vector_planes_take_forward(const ConvShape& s);
bool vector_planes_take_input_grad(const ConvShape& s);

// NCHW operands, contiguous, of the checked shape s.
void vector_planes_forward(const float* input, const float* weight, float* output,
                           const ConvShape& s);
void vector_planes_input_grad(const float* grad_output, const float* weight, float* grad_input,
                              const ConvShape& s);

}  // namespace torch_convbp
