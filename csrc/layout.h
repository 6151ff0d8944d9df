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

// The NHWC column matrix pays where every group has at least this many input and output
// channels. Its im2col copies a run of C/G channels per kernel tap, and its GEMMs write rows of
// Cout/G; with 3 channels (an RGB stem) or 4 per group (ResNeXt's 32 groups) both are far below a
// cache line and a GEMM tile, and those layers took 1.55x and 2.6x the time of computing in NCHW
// with the layout copies (benchmarks/NOTES.md, section 17). Layers with 64 or more per group
// took 0.67-0.94x it. The fake kernels mirror it (torch_convbp/_meta.py).
constexpr int64_t kMinNhwcGroupChannels = 16;

// The layout an operator of shape `s` computes in, for these operands: NHWC where they are all
// channels_last and the layer has an NHWC route, else NCHW (the operands copied in, the results
// copied back). The depthwise kernels have one in either layout; a layer computed by im2col +
// GEMM has one where its groups are wide enough.
inline Layout operator_layout(const ConvShape& s, std::initializer_list<const at::Tensor*> operands) {
  const bool wide = s.in_channels / s.groups >= kMinNhwcGroupChannels &&
                    s.out_channels / s.groups >= kMinNhwcGroupChannels;
  return (s.is_depthwise() || wide) && computes_in_nhwc(operands) ? Layout::nhwc : Layout::nchw;
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
