// The operands and results of an operator in the layout its route computes in (route.h).
#pragma once

#include <ATen/ATen.h>

#include "shape.h"

namespace torch_convbp {

inline at::MemoryFormat memory_format(Layout layout) {
  return layout == Layout::nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// An operand in that layout (a copy only where it is not already).
inline at::Tensor in_layout(const at::Tensor& t, Layout layout) {
  return t.contiguous(memory_format(layout));
}

// An empty activation of `size` in that layout.
inline at::Tensor empty_in_layout(at::IntArrayRef size, const at::Tensor& like, Layout layout) {
  return at::empty(size, like.options().memory_format(memory_format(layout)));
}

}  // namespace torch_convbp
