// A 2-D convolution's sizes (ConvShape) in a direct kernel's index type: what every thread of
// the depthwise and grouped kernels reads. Each kernel's dims add their own (depthwise_thread.h,
// grouped_thread.h).
#pragma once

#include "../shape.h"

namespace torch_convbp {

template <typename index_t>
struct PlaneDims {
  index_t channels, height, width, out_channels, kernel_h, kernel_w, stride_h, stride_w, pad_h,
      pad_w, dilation_h, dilation_w, out_height, out_width;
  explicit PlaneDims(const ConvShape& s)
      : channels(s.in_channels),
        height(s.height),
        width(s.width),
        out_channels(s.out_channels),
        kernel_h(s.kernel_h),
        kernel_w(s.kernel_w),
        stride_h(s.stride_h),
        stride_w(s.stride_w),
        pad_h(s.pad_h),
        pad_w(s.pad_w),
        dilation_h(s.dilation_h),
        dilation_w(s.dilation_w),
        out_height(s.out_height),
        out_width(s.out_width) {}
};

}  // namespace torch_convbp
