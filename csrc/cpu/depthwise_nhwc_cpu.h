// The depthwise CPU kernels on channels_last (NHWC) activations (depthwise_nhwc_cpu.cpp), which
// the registered depthwise kernels (depthwise_cpu.cpp) call for NHWC operands. The forward and
// input gradient sum in the same orders as the NCHW kernels and the CUDA kernels
// (cuda/depthwise_thread.h); so does the weight gradient in the order of lanes.
#pragma once

#include <ATen/core/Tensor.h>

#include "../shape.h"

namespace torch_convbp {

using at::Tensor;

// The depthwise convolution of `count` input channels of one image, as a shape of its own.
inline ConvShape depthwise_channel_block(const ConvShape& s, int64_t count) {
  ConvShape block = s;
  block.batch = 1;
  block.in_channels = block.groups = count;
  block.out_channels = count * (s.out_channels / s.in_channels);
  return block;
}

// With the arguments checked by check_depthwise; the weight is contiguous. Bitwise the same
// results as the NCHW kernels. The forward and input gradient take operands in `layout`: NCHW
// ones a block of channels of one image at a time, transposed to NHWC in cache and back. The
// forward and input gradient also take volumes (checked by check_depthwise_volumes: NDHWC or
// NCDHW, float32 or float64; NCDHW ones in blocks of channels as NCHW ones): each result value the
// sum over its terms in (kd, kh, kw) order ((o, kd, kh, kw) for the input gradient), the 2-D terms
// with a depth.
void depthwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s,
                            const Tensor& output, Layout layout);
void depthwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                               const Tensor& grad_input, Layout layout);
void depthwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                                const Tensor& grad_weight);

// The weight gradient in the order of rows (depthwise_rows_cpu.cpp), the CPU's default
// (cpu_depthwise_order()): not the CUDA kernels' bits, the same on any thread count; from
// operands in `layout` (NCHW ones a band of rows at a time transposed in cache), the same bits
// from either. Volumes too (NDHWC or NCDHW, checked by check_depthwise_volumes).
void depthwise_weight_grad_rows(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                                const Tensor& grad_weight, Layout layout);

}  // namespace torch_convbp
