// Route implicit_nhwc's bfloat16 kernels on padded rows (padded_rows_cpu.cpp): the forward of one
// group, and the input gradient of a strided layer as phase convolutions of dY, each a kernel
// row's taps in one micro-kernel call over blocks of pixels across rows.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "../shape.h"
#include "implicit_nhwc.h"

namespace torch_convbp {

// Whether the forward of convolution `s` takes padded rows: a 2-D one of one group, undilated
// along the width, up to most_merged_channels() input channels (volumes take the tiles).
bool takes_padded_rows(const ConvShape& s);

// y (NHWC) = the convolution `s` of x (NHWC), bfloat16, w the forward's tap matrices.
void padded_convolution(const at::Tensor& x, const TapMatrices<c10::BFloat16>& w,
                        const ConvShape& s, const at::Tensor& y);

// Whether the input gradient of convolution `s` takes phase convolutions on padded rows: one
// that is not itself a stride-1 convolution of dY (input_grad_convolution: a strided layer, or
// one padded past the kernel's reach), of one group, undilated along the width, up to
// most_merged_channels() output channels.
bool takes_padded_input_grad(const ConvShape& s);

// dx (NHWC) = the input gradient of convolution `s` from dy (NHWC), bfloat16, w the input
// gradient's tap matrices (tap_matrices(..., input_grad=true)).
void padded_input_grad(const at::Tensor& dy, const TapMatrices<c10::BFloat16>& w,
                       const ConvShape& s, const at::Tensor& dx);

}  // namespace torch_convbp
