// Which memory layout an operator computes in: the choice, made once per operator from its
// operands' strides (docs/design.md, "Memory formats"). The fake kernels mirror it
// (torch_convbp/_meta.py, _returns_channels_last).
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>

#include "conv2d.h"

namespace torch_convbp {

// Whether every operand is channels_last by its strides (as suggest_memory_format decides), dense
// in it, and not empty: the operator then computes in NHWC, where its shape has an NHWC route,
// and returns channels_last activations.
inline bool computes_in_nhwc(std::initializer_list<const at::Tensor*> operands) {
  for (const at::Tensor* t : operands) {
    if (t->dim() != 4 || t->numel() == 0 ||
        t->suggest_memory_format() != at::MemoryFormat::ChannelsLast ||
        !t->is_contiguous(at::MemoryFormat::ChannelsLast)) {
      return false;
    }
  }
  return true;
}

// The NHWC column matrix pays where each group's GEMM writes rows of at least this many output
// channels, and, with several groups, im2col copies runs of at least this many input channels
// per tap. With one group a kernel row's taps are one run of kw*C channels whatever C is, so an
// RGB stem (3 channels in, 32 out) takes it: its forward took 0.88x, its weight gradient 0.45x
// the time of the NCHW route with the layout copies. Narrower groups, ResNeXt's 3x3 (4 per
// group), and narrow outputs (a 3x3 to 3 or 8 channels, LeNet's 1>6) took 1.3-6x that time:
// runs and rows far below a cache line and a GEMM tile (benchmarks/NOTES.md, sections 17 and
// 19). The fake kernels mirror it (torch_convbp/_meta.py).
constexpr int64_t kMinNhwcGroupChannels = 16;

// A convolution of several groups (not depthwise) with at most this many output channels per
// group is computed by the direct grouped kernel (cpu/grouped_nhwc_cpu.cpp,
// cuda/grouped_thread.h), in NHWC: each group's GEMMs would be a few rows thin, and ResNeXt's
// 3x3 layers (4 to 32 channels per group) ran at 2-3x oneDNN's time through the column matrix in
// either layout (benchmarks/NOTES.md, sections 20 and 21).
constexpr int64_t kMaxDirectGroupChannels = 32;
inline bool has_direct_grouped_kernel(const ConvShape& s) {
  return s.groups > 1 && !s.is_depthwise() && s.out_channels / s.groups <= kMaxDirectGroupChannels;
}

// The layout an operator of shape `s` computes in, for these operands: NHWC where they are all
// channels_last and the layer has an NHWC route, else NCHW (the operands copied in, the results
// copied back). The operator's direct kernel, where it takes one (`direct_kernel`: depthwise, or
// narrow groups), computes in NHWC; a layer computed by im2col + GEMM has an NHWC route where its
// groups are wide enough (above).
inline Layout operator_layout(const ConvShape& s, std::initializer_list<const at::Tensor*> operands,
                              bool direct_kernel) {
  const bool wide_inputs = s.groups == 1 || s.in_channels / s.groups >= kMinNhwcGroupChannels;
  const bool wide = wide_inputs && s.out_channels / s.groups >= kMinNhwcGroupChannels;
  return (direct_kernel || wide) && computes_in_nhwc(operands) ? Layout::nhwc : Layout::nchw;
}

inline at::MemoryFormat memory_format(Layout layout) {
  return layout == Layout::nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// An operand in the layout the operator computes in (a copy only where it is not already).
inline at::Tensor in_layout(const at::Tensor& t, Layout layout) {
  return t.contiguous(memory_format(layout));
}

// An empty activation of `size` in that layout.
inline at::Tensor empty_in_layout(at::IntArrayRef size, const at::Tensor& like, Layout layout) {
  return at::empty(size, like.options().memory_format(memory_format(layout)));
}

}  // namespace torch_convbp
