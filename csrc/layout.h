// Which memory layout an operator computes in: the choice, made once per operator from its
// operands' strides (docs/design.md, "Memory formats"). The fake kernels mirror it
// (torch_convbp/_meta.py, _computes_in_nhwc).
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>

namespace torch_convbp {

// Whether every operand is channels_last by its strides (as suggest_memory_format decides), dense
// in it, and not empty: the operator then computes in NHWC where it has a route for the shape
// (pointwise_nhwc.h, and the depthwise kernels), and returns channels_last activations.
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

// An operand in the layout the operator computes in (a copy only where it is not already).
inline at::Tensor in_layout(const at::Tensor& t, bool nhwc) {
  return t.contiguous(nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
}

// An empty activation of `size` in that layout.
inline at::Tensor empty_in_layout(at::IntArrayRef size, const at::Tensor& like, bool nhwc) {
  return at::empty(size, like.options().memory_format(nhwc ? at::MemoryFormat::ChannelsLast
                                                           : at::MemoryFormat::Contiguous));
}

}  // namespace torch_convbp
