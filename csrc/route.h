// The ways an operator can compute a call (routes), and the one function that chooses among them
// (route.cpp). The orchestration (conv2d.cpp) is a switch over the route chosen here; no kernel
// hands a call to another route. torch_convbp.explain() asks the same function from Python.
//
// Each route's GEMMs, for one group g of G (K = kh*kw*Cin/G, P = pixels of a chunk):
//   columns              forward      Y_g [Cout/G, P] = W_g [Cout/G, K] @ im2col(x) [K, P]
//                        weight grad  dW_g [Cout/G, K] += dY_g [Cout/G, P] @ im2col(x)^T [P, K]
//                        input grad   dcol [K, P] = W_g^T [K, Cout/G] @ dY_g [Cout/G, P], then
//                                     dx = col2im(dcol)
//   transposed_columns   input grad of stride 1: the forward convolution of dY with the weight
//                        flipped and transposed, dx_g [Cin/G, P] = W'_g [Cin/G, K'] @ im2col(dY)
//   pointwise_by_images  [N, Cout, HW] = W [Cout, Cin] (broadcast) @ x [N, Cin, HW], one batched
//                        GEMM (the input grad: the same with W^T on dY)
//   pointwise_nhwc       Y [P, Cout] = X [P, C] @ W^T; dX [P, C] = dY [P, Cout] @ W;
//                        dW [Cout, C] = dY^T [Cout, P] @ X [P, C], on the tensors' own memory
//   implicit_nhwc        an output row Y_g [OW, Cout/G] += X_tap [OW, C/G] @ W_tap [C/G, Cout/G]
//                        for each tap, X_tap a strided view of the input row (no column matrix);
//                        the input grad of stride 1 likewise, as a forward convolution of dY;
//                        the weight grad of stride 1 dW_tap^T [C/G, Cout/G] += Xt [C/G, e]
//                        @ dY_ext [e, Cout/G] on padded copies, e the pixels of a padded row width
//   depthwise, grouped   no GEMM: direct kernels (cpu/, cuda/)
#pragma once

#include <ATen/core/Tensor.h>

#include "shape.h"

namespace torch_convbp {

enum class Operator { forward, input_grad, weight_grad };

enum class Route {
  columns,              // im2col -> GEMM (forward, weight grad); GEMM -> col2im (input grad)
  transposed_columns,   // the input grad of stride 1 as a forward convolution: im2col of dY -> GEMM
  pointwise_by_images,  // 1x1, one group, NCHW: one batched GEMM over the images, no im2col
  pointwise_nhwc,       // 1x1, one group, channels_last: one GEMM on the pixel matrices, no copy
  implicit_nhwc,        // float32, bfloat16 on the CPU, in NHWC: GEMMs per tap on views, no columns
  depthwise,            // one input channel per group: the depthwise kernels
  grouped,              // narrow groups, channels_last: the direct grouped kernels
};

struct RouteChoice {
  Route route;
  Layout layout;          // the layout it computes in; operands in the other are copied to it
  const char* why_route;  // the rules that chose them, in a line each
  const char* why_layout;
};

// The route of operator `op` for a call of shape `s` (checked) whose activation operands are
// `activations`: the input (forward), the output gradient (input grad), or both (weight grad).
// It reads their strides, dtype and device, never their values, so meta tensors do.
RouteChoice choose_route(Operator op, const ConvShape& s, at::TensorList activations);

// Whether the implicit route's GEMMs of convolution `s` (a forward one, not the scattered
// products of a strided input gradient) take a kernel row's kw taps in one call, K = kw*C, rather
// than a call per tap, K = C: with one group and undilated along the width, those taps read one
// run of kw*C consecutive values of an NHWC input row. Where a tap alone has fewer input channels
// than a GEMM's worth (an RGB stem's 3), cpu/implicit_nhwc_cpu.cpp.
bool implicit_merges_kernel_rows(const ConvShape& s);

const char* route_name(Route route);
const char* layout_name(Layout layout);

// The memory format of an operator's activation result, from its operands alone, never from the
// route: channels_last where the activation operand or the weight suggests it, as F.conv2d
// decides on the CPU (an empty batch stays contiguous, and so do meta tensors, as with F.conv2d). A
// route that computes in the other layout copies its result into this one. The fake kernels mirror
// it (torch_convbp/_meta.py).
at::MemoryFormat result_format(const at::Tensor& activation, const at::Tensor& weight);

// The memory format of the weight gradient, from the input alone (the weight_grad operators see
// no weight): channels_last where the input suggests it, as ATen returns dW where the input or the
// weight suggests it (so that a channels_last model's AccumulateGrad copies nothing), else
// contiguous; an empty batch and meta tensors as above. The fake kernels mirror it.
at::MemoryFormat weight_grad_format(const at::Tensor& input);

}  // namespace torch_convbp
