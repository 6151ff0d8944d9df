// Which memory layout an operator computes in: the choice, made once per operator from its
// operands' strides (docs/design.md, "Memory formats"). The fake kernels mirror it
// (torch_convbp/_meta.py, _computes_in_nhwc).
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>

#include "conv2d.h"

namespace torch_convbp {

// Whether every operand is channels_last by its strides (as suggest_memory_format decides), dense
// in it, and not empty: the operator then computes in NHWC and returns channels_last
// activations.
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

inline Layout compute_layout(std::initializer_list<const at::Tensor*> operands) {
  return computes_in_nhwc(operands) ? Layout::nhwc : Layout::nchw;
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
