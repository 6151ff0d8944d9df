// What one CUDA thread of the direct grouped kernel computes, as a host-and-device function: the
// kernel in grouped_cuda.cu is a loop over it, and the CPU harness (tests/cuda_harness/) runs it
// for every thread of the grid and compares it bitwise with the CPU kernel
// (cpu/grouped_nhwc_cpu.cpp), which sums in the same order.
//
// A grouped convolution whose groups are too narrow for the column matrix's GEMMs (layout.h,
// has_direct_grouped_kernel), on NHWC activations: input [N, H, W, C] and output [N, OH, OW, Cout] in memory
// (dense channels_last), the weight [Cout, C/G, kh, kw] contiguous. Output channel o of group
// g = o / (Cout/G) reads the group's input channels g * C/G + i.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include "../conv2d.h"
#include "../summation.h"

namespace torch_convbp {

// ConvShape in the kernel's index type, with each group's channel counts.
template <typename index_t>
struct GroupedDims {
  index_t channels, height, width, out_channels, kernel_h, kernel_w, stride_h, stride_w, pad_h,
      pad_w, dilation_h, dilation_w, out_height, out_width, group_in, group_out;
  explicit GroupedDims(const ConvShape& s)
      : channels(s.in_channels), height(s.height), width(s.width), out_channels(s.out_channels),
        kernel_h(s.kernel_h), kernel_w(s.kernel_w), stride_h(s.stride_h), stride_w(s.stride_w),
        pad_h(s.pad_h), pad_w(s.pad_w), dilation_h(s.dilation_h), dilation_w(s.dilation_w),
        out_height(s.out_height), out_width(s.out_width), group_in(s.in_channels / s.groups),
        group_out(s.out_channels / s.groups) {}
};

// The output element at NHWC offset i: the sum over the taps in (ki, kj) order, and within a
// tap over the group's input channels i in order, of weight times input; one rounding per term
// (multiply_add), one rounding to scalar_t at the end. Taps in the padding add nothing.
template <typename scalar_t, typename index_t>
C10_HOST_DEVICE inline scalar_t grouped_output(const scalar_t* input, const scalar_t* weight,
                                               const GroupedDims<index_t>& s, index_t i) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t o = i % s.out_channels, pixel = i / s.out_channels;
  const index_t ow = pixel % s.out_width, oh = pixel / s.out_width % s.out_height;
  const index_t n = pixel / (s.out_width * s.out_height);
  const index_t first_channel = o / s.group_out * s.group_in;
  const index_t taps = s.kernel_h * s.kernel_w;
  const scalar_t* w = weight + o * s.group_in * taps;  // w[c * taps + tap]: [C/G, kh, kw]
  acc_t sum = 0;
  for (index_t ki = 0; ki < s.kernel_h; ++ki) {
    const index_t ih = oh * s.stride_h - s.pad_h + ki * s.dilation_h;
    if (ih < 0 || ih >= s.height) continue;
    for (index_t kj = 0; kj < s.kernel_w; ++kj) {
      const index_t iw = ow * s.stride_w - s.pad_w + kj * s.dilation_w;
      if (iw < 0 || iw >= s.width) continue;
      const scalar_t* x = input + ((n * s.height + ih) * s.width + iw) * s.channels + first_channel;
      const index_t tap = ki * s.kernel_w + kj;
      for (index_t c = 0; c < s.group_in; ++c) {
        sum = multiply_add(static_cast<acc_t>(w[c * taps + tap]), static_cast<acc_t>(x[c]), sum);
      }
    }
  }
  return static_cast<scalar_t>(sum);
}

}  // namespace torch_convbp
