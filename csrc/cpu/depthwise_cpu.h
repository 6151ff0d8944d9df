// What the depthwise CPU kernels share: the taps' geometry, the parallel grain, and the NHWC
// kernels (depthwise_nhwc_cpu.cpp) that the NCHW ones (depthwise_cpu.cpp) hand channels_last
// calls to. Both sum in the same orders as the CUDA kernels (cuda/depthwise_thread.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../conv2d.h"
#include "../taps.h"
#include "cpu_kernels.h"

namespace torch_convbp {

// Enough multiply-adds per parallel task to be worth a thread.
constexpr int64_t kGrainWork = 32768;
inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kGrainWork / std::max<int64_t>(work_per_item, 1));
}

// The input row that output row oh reads at kernel row ki, or -1 in the padding.
inline int64_t input_row(const ConvShape& s, int64_t oh, int64_t ki) {
  const int64_t ih = oh * s.stride_h - s.pad_h + ki * s.dilation_h;
  return ih >= 0 && ih < s.height ? ih : -1;
}

// The output columns of a row that kernel column kj reads inside the image, and the offset:
// output column ow reads input column ow * stride_w + offset.
struct Tap {
  int64_t offset;
  Span columns;
};
inline Tap tap_columns(const ConvShape& s, int64_t kj) {
  const int64_t offset = kj * s.dilation_w - s.pad_w;
  return {offset, valid_columns(offset, s.stride_w, s.width, s.out_width)};
}

// Calls f(ow, iw) for each output column ow of the tap, with iw = ow * stride + offset its input
// column. The unit stride is spelt out, so that the compiler vectorizes the (inlined) body.
template <typename F>
inline void for_each_column(int64_t stride, const Tap& tap, F&& f) {
  if (stride == 1) {
    for (int64_t ow = tap.columns.begin; ow < tap.columns.end; ++ow) f(ow, ow + tap.offset);
  } else {
    for (int64_t ow = tap.columns.begin; ow < tap.columns.end; ++ow) {
      f(ow, ow * stride + tap.offset);
    }
  }
}

// The depthwise kernels on channels_last (NHWC) activations, with the arguments checked by
// check_depthwise; the weight is contiguous. Bitwise the same results as the NCHW kernels.
void depthwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s,
                            const Tensor& output);
void depthwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                               const Tensor& grad_input);
void depthwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                                const Tensor& grad_weight);

}  // namespace torch_convbp
