// The device kernels as the orchestration calls them: through the dispatcher, which picks the
// CPU or CUDA kernel by the tensors' device (device_kernels.cpp). Each kernel writes its last
// argument; the arguments are checked by the kernel (checks.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "shape.h"

namespace torch_convbp {

// im2col of output rows [row_start, row_start + rows) of `images` into `columns`, or col2im of
// `columns` added into `images`, in `layout`; `columns` in the form that layout's operators take
// (matrices.h, column_kernel_operand).
void call_im2col(Layout layout, const at::Tensor& images, const ConvShape& s, int64_t row_start,
                 int64_t rows, const at::Tensor& columns);
void call_col2im(Layout layout, const at::Tensor& columns, const ConvShape& s, int64_t row_start,
                 int64_t rows, const at::Tensor& images);

// The depthwise kernels: output = conv(input, weight); grad_input from (grad_output, weight);
// grad_weight from (input, grad_output). Of a 3-D convolution all three on the CPU (float32,
// float64; NDHWC or NCDHW), the kernels of volumes.
enum class DepthwiseKernel { forward, input_grad, weight_grad };
void call_depthwise(DepthwiseKernel kernel, const at::Tensor& a, const at::Tensor& b,
                    const ConvShape& s, const at::Tensor& result);

// The direct grouped kernels (NHWC activations): output = conv(input, weight), weight
// [Cout, Cin/G, kh, kw] contiguous; grad_weight (contiguous) from (input, grad_output).
enum class GroupedKernel { forward, weight_grad };
void call_grouped(GroupedKernel kernel, const at::Tensor& a, const at::Tensor& b,
                  const ConvShape& s, const at::Tensor& result);

// The implicit-GEMM kernels (CPU, NHWC activations), weight [Cout, Cin/G, kh, kw] contiguous:
// output = conv(input, weight); grad_input from (grad_output, weight), stride 1; grad_weight
// (contiguous or channels_last) from (input, grad_output), stride 1, NCHW or NHWC activations.
// Volumes too (NDHWC activations, or NCDHW ones for the weight gradient; a 5-D weight).
enum class ImplicitKernel { forward, input_grad, weight_grad };
void call_implicit(ImplicitKernel kernel, const at::Tensor& a, const at::Tensor& weight,
                   const ConvShape& s, const at::Tensor& result);

// target[b, j, i] = source[b, i, j], for source [B, R, C] and target [B, C, R], each with
// contiguous rows (layout.cpp: an activation between NCHW and channels_last).
void call_transpose_copy(const at::Tensor& source, const at::Tensor& target);

// target[g, b, a, t] = source[g, a, b, t] (reverse_taps: source[g, a, b, taps-1-t]), for a
// contiguous source [G, A, B, taps] and a target [G, B, A, taps] of any memory order.
void call_transpose_taps(const at::Tensor& source, const at::Tensor& target, bool reverse_taps);

}  // namespace torch_convbp
