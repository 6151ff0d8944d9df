// The weight gradient of 3-D convolutions as sums over their depth taps of 2-D ones on views
// (depth_taps.cpp), so that volumes take the 2-D implicit route's weight gradient (GEMMs on shifted
// views of padded copies) instead of the 3-D column route, whose vol2col writes kd*kh*kw values
// per input value; and the rule of the volumes that take it, whose forward and input gradient the
// implicit route computes whole (choose_route, cpu/implicit_nhwc_cpu.cpp).
//
// For a depth stride of 1, output slice od of volume n takes, at depth tap t, input slice
// id = od - pd + t*dd (none where that is outside the volume):
//
//   dW[:, :, t] = sum over n in order of  conv2d_weight_grad(X[n, :, id], dY[n, :, od])
//
// For one volume and one tap, the slices that take part are a run of consecutive ones on either
// side: in channels_last_3d memory the slices of a volume [D, H, W, C] are NHWC images, a view.
// The sums are added in the order above, each term computed by the 2-D route, whose bits do not
// depend on the thread count, so neither do these. Only where the slices' 2-D route has no column
// matrix: the implicit one (a depthwise volume has kernels of its own, depthwise_nhwc_cpu.h); on
// the column route the slices would write the same column values as vol2col. NCDHW operands are
// copied into channels_last_3d first, where the plane's kernel reads at least as many values as
// the plane holds (the 27 taps of a 3x3x3 kernel per value copied outweigh the copies; a plane
// strided 4x4 keeps the 3-D route). Measured: benchmarks/NOTES.md, sections 124, 127, 130, 136.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>

#include "route.h"
#include "shape.h"

namespace torch_convbp {

// The slices' 2-D route, where operator `op` of 3-D convolution `s` with these activation
// operands (the forward's input, the input gradient's output gradient, the weight gradient's
// both) takes the implicit route (the forward, the input gradient) or runs as depth taps (the
// weight gradient): float32 CPU operands in channels_last_3d or NCDHW (copied into
// channels_last_3d, where kh*kw*OH*OW >= H*W), a kernel deeper than one slice, depth stride 1, a
// batch, not depthwise, and slices whose 2-D route, in channels_last_3d, is the implicit one.
std::optional<RouteChoice> depth_taps_route(Operator op, const ConvShape& s,
                                            at::TensorList activations);

// explain()'s words for the weight gradient by depth taps.
const char* depth_taps_why();

// The 2-D weight gradient on batches of slices, [count, C, H, W] channels_last, for the weight of
// one tap [Cout, C/G, kh, kw] (stride, padding and dilation those of the plane).
using SliceWeightGrad = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& dy,
                                                 at::IntArrayRef weight_size)>;

// The weight gradient by depth taps, for `s` of which depth_taps_route gave a route (NCDHW
// operands copied into channels_last_3d): contiguous.
at::Tensor weight_grad_by_depth_taps(const at::Tensor& input, const at::Tensor& grad_output,
                                     at::IntArrayRef weight_size, const ConvShape& s,
                                     const SliceWeightGrad& conv2d_weight_grad);

}  // namespace torch_convbp
