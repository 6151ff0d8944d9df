// The rule of the 3-D convolutions that the implicit route computes whole, with no column matrix
// (cpu/implicit_nhwc_cpu.cpp, cpu/implicit_weight_grad_cpu.cpp): the volumes whose depth slices,
// as images, would take the 2-D implicit route. Their kernels see a volume's depth slices as
// one image's rows:
// - the forward and the input gradient: output row (od, oh) of the [N, C, D*H, W] view at kernel
//   row (kd, ki) reads input row (od*sd - pd + kd*dd, oh*sh - ph + ki*dh), its kernel rows the
//   (depth tap, kernel row) pairs, each output entry summing its kd*kh*kw taps in one pass of its
//   tile; operands channels_last_3d, NCDHW ones copied into that format first, where the plane's
//   kernel reads at least as many values as the plane holds (the 27 taps of a 3x3x3 kernel per
//   value copied outweigh the copies; a plane strided 4x4 keeps the 3-D route);
// - the weight gradient (stride 1): the padded depth slices one after another in one plane, so
//   that each tap (kd, ki, kj) is one more fixed offset into it, kd*dd*Hp*Wp further; NCDHW and
//   channels_last_3d operands read as they are; where the slices' forward takes the implicit
//   route, and one volume's padded copies fit the workspace limit.
// Depthwise volumes have kernels of their own (depthwise_nhwc_cpu.h). Measured:
// benchmarks/NOTES.md, sections 124, 127, 130, 136, 137.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "route.h"
#include "shape.h"

namespace torch_convbp {

// The slices' 2-D route, where operator `op` of 3-D convolution `s` with these activation
// operands (the forward's input, the input gradient's output gradient, the weight gradient's
// both) takes the implicit route whole: float32 CPU operands in channels_last_3d or NCDHW (where
// kh*kw*OH*OW >= H*W), a kernel deeper than one slice, depth stride 1, a batch, not depthwise,
// and slices whose 2-D route, in channels_last_3d, is the implicit one.
std::optional<RouteChoice> implicit_volume_route(Operator op, const ConvShape& s,
                                                 at::TensorList activations);

}  // namespace torch_convbp
