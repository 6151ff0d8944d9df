// 3-D convolutions as sums over their depth taps of 2-D convolutions on views (depth_taps.cpp), so
// that volumes take the 2-D implicit route (GEMMs on shifted views of the input) instead of the
// 3-D column route, whose vol2col writes kd*kh*kw values per input value.
//
// For a depth stride of 1, output slice od of volume n takes, at depth tap t, input slice
// id = od - pd + t*dd (none where that is outside the volume):
//
//   Y[n, :, od] = sum over t in order of  conv2d(X[n, :, id], W[:, :, t])        (kh x kw kernel)
//   dX[n, :, id] = sum over t in order of conv2d_input_grad(dY[n, :, od], W[:, :, t])
//   dW[:, :, t] = sum over n in order of  conv2d_weight_grad(X[n, :, id], dY[n, :, od])
//
// For one volume and one tap, the slices that take part are a run of consecutive ones on either
// side: in channels_last_3d memory the slices of a volume [D, H, W, C] are NHWC images, a view.
// The forward and the input gradient take each tap's runs of every volume in one 2-D call (one
// batch of images, copied where the runs are not every slice), the weight gradient a call per
// volume and tap. The sums are added in the order above, each term computed by the 2-D route,
// whose bits depend neither on the thread count nor on the batch a slice is computed in, so
// neither do these. Only where the slices' 2-D route has no column matrix: the implicit one (a
// depthwise volume has kernels of its own, depthwise_nhwc_cpu.h);
// on the column route the slices would write the same column values as vol2col, and the sums
// cost a pass of the result each. NCDHW operands are copied into channels_last_3d first, where
// the plane's kernel reads at least as many values as the plane holds (the 27 taps of a 3x3x3
// kernel per value copied outweigh the copies; a plane strided 4x4 keeps the 3-D route).
// Measured: benchmarks/NOTES.md, sections 124, 127 and 130.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>

#include "route.h"
#include "shape.h"

namespace torch_convbp {

// The slices' 2-D route, where operator `op` of 3-D convolution `s` with these activation
// operands (the forward's input, the input gradient's output gradient, the weight gradient's
// both) runs as depth taps: float32 CPU operands in channels_last_3d or NCDHW (copied into
// channels_last_3d, where kh*kw*OH*OW >= H*W), a kernel deeper than one slice, depth stride 1, a
// batch, and slices whose 2-D route, in channels_last_3d, is the implicit one (choose_route gives
// a depthwise volume its own kernels).
std::optional<RouteChoice> depth_taps_route(Operator op, const ConvShape& s,
                                            at::TensorList activations);

// explain()'s words for the form.
const char* depth_taps_why();

// The 2-D operators on batches of slices, [count, C, H, W] channels_last, with the weight of one
// tap [Cout, C/G, kh, kw] (stride, padding and dilation those of the plane).
using SliceForward = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& w)>;
using SliceInputGrad = std::function<at::Tensor(const at::Tensor& dy, const at::Tensor& w,
                                                at::IntArrayRef input_size)>;
using SliceWeightGrad = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& dy,
                                                 at::IntArrayRef weight_size)>;

// The three operators by depth taps, for `s` of which depth_taps_route gave a route (NCDHW
// operands copied into channels_last_3d). The activation results are channels_last_3d; the
// weight gradient contiguous.
at::Tensor forward_by_depth_taps(const at::Tensor& input, const at::Tensor& weight,
                                 const ConvShape& s, const SliceForward& conv2d);
at::Tensor input_grad_by_depth_taps(const at::Tensor& grad_output, const at::Tensor& weight,
                                    const ConvShape& s, const SliceInputGrad& conv2d_input_grad);
at::Tensor weight_grad_by_depth_taps(const at::Tensor& input, const at::Tensor& grad_output,
                                     at::IntArrayRef weight_size, const ConvShape& s,
                                     const SliceWeightGrad& conv2d_weight_grad);

}  // namespace torch_convbp
