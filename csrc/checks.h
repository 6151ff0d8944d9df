// Every check of the operators' arguments (checks.cpp), beside the shapes they return. The fake
// kernels in torch_convbp/_meta.py mirror these checks, message for message.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <utility>

#include "shape.h"

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

// Checks everything F.conv2d (dims 2) or F.conv3d (dims 3) checks about sizes and arguments,
// with messages that name the problem, and returns the convolution's shape. `op` names the caller
// in the messages.
ConvShape check_convolution(const char* op, int64_t dims, IntArrayRef input_size,
                            IntArrayRef weight_size, IntArrayRef stride, IntArrayRef padding,
                            IntArrayRef dilation, int64_t groups);
inline ConvShape check_conv2d(const char* op, IntArrayRef input_size, IntArrayRef weight_size,
                              IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                              int64_t groups) {
  return check_convolution(op, 2, input_size, weight_size, stride, padding, dilation, groups);
}

// Checks that the tensors of one call share a dtype, a device and the strided layout; the first
// one names the dtype and device expected of the others.
using NamedTensors = std::initializer_list<std::pair<const char*, const Tensor*>>;
void check_same_kind(const char* op, NamedTensors operands);

// The same, for a convolution's operands, whose dtype is a floating one (float64/32/16, bfloat16).
void check_operands(const char* op, NamedTensors operands);

// Checks an output gradient's size against the convolution's output [N, Cout, (OD,) OH, OW].
void check_grad_output(const char* op, const Tensor& grad_output, const ConvShape& s);

// Checks the arguments of the im2col / col2im operators of one layout and returns their
// geometry: images [n, C, H, W] contiguous (NCHW) or dense channels_last (NHWC); columns
// contiguous, of the images' dtype (or float32 for half-precision images) and device, and of the
// layout's size: any shape of C*kh*kw*P elements in NCHW, exactly [G, P, kh*kw*C/G] in NHWC
// (G, the groups, divides C).
ColumnGeometry check_columns(const char* op, Layout layout, const Tensor& images,
                             const Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, int64_t row_start,
                             int64_t rows);

// A direct kernel's call that takes its activations in either layout: the convolution's shape,
// and whether the input and output are NHWC in memory (else both NCHW, contiguous).
struct LayoutCall {
  ConvShape shape;
  bool channels_last;
};

// Checks the arguments of the depthwise operators: input [N, C, H, W], weight [C*m, 1, kh, kw]
// and output [N, C*m, OH, OW] (for the gradient operators: their gradients), of one dtype and
// device, the weight contiguous, the input and output both contiguous or both dense
// channels_last. Returns the convolution's shape, with groups = C, and the layout.
LayoutCall check_depthwise(const char* op, const Tensor& input, const Tensor& weight,
                           const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                           IntArrayRef dilation);

// Checks the arguments of the depthwise operators of volumes: input [N, C, D, H, W], weight
// [C*m, 1, kd, kh, kw] contiguous and output [N, C*m, OD, OH, OW] (for the input gradient: their
// gradients), float32 or float64, the input and output both contiguous or both dense
// channels_last_3d. Returns the convolution's shape, with groups = C, and the layout.
LayoutCall check_depthwise_volumes(const char* op, const Tensor& input, const Tensor& weight,
                                   const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                                   IntArrayRef dilation);

// Checks the arguments of the direct grouped kernels: input [N, C, H, W], weight [Cout, C/G, kh,
// kw] and output [N, Cout, OH, OW] of one dtype and device, the weight contiguous, the input and
// output dense channels_last. Returns the convolution's shape.
ConvShape check_grouped(const char* op, const Tensor& input, const Tensor& weight,
                        const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups);

// As check_grouped, but the weight contiguous or dense channels_last (which the implicit route
// transposes into its tap matrices in one pass from either) and the result the call writes dense
// channels_last or contiguous (NCHW): the implicit route's forward (which writes the output) and
// input gradient (which writes its input's gradient); the operand it reads dense channels_last.
// Returns the shape and whether the result is channels_last. Volumes (dims 3): channels_last_3d.
enum class Written { output, input };
LayoutCall check_implicit_call(const char* op, const Tensor& input, const Tensor& weight,
                               const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                               IntArrayRef dilation, int64_t groups, Written written,
                               int64_t dims = 2);

// As check_grouped, but the input and output both contiguous or both dense channels_last, and the
// weight contiguous or dense channels_last: the implicit route's weight gradient, which reads
// either layout and writes the weight in either. Returns the shape and the activations' layout.
// Volumes (dims 3): the same with channels_last_3d.
LayoutCall check_implicit_weight_grad_call(const char* op, const Tensor& input,
                                           const Tensor& weight, const Tensor& output,
                                           IntArrayRef stride, IntArrayRef padding,
                                           IntArrayRef dilation, int64_t groups, int64_t dims);

// Checks the arguments of the transposing copy: source [B, R, C] and target [B, C, R] of one
// dtype (of 1 to 8 bytes) and device, each with unit stride along its last dimension, and the
// target's elements each in memory of their own, outside the source's storage.
void check_transpose_copy(const char* op, const Tensor& source, const Tensor& target);

// Checks the arguments of the weight's transposing copy: a contiguous source [G, A, B, taps] and
// a target [G, B, A, taps] (any strides) of one dtype (of 1 to 8 bytes) and device, the target's
// elements each in memory of their own, outside the source's storage.
void check_transpose_taps(const char* op, const Tensor& source, const Tensor& target);

}  // namespace torch_convbp
