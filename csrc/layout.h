// The operands and results of an operator in the layout its route computes in (route.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "scratch.h"
#include "shape.h"

namespace torch_convbp {

// The memory format of `layout` for a tensor of `rank` dimensions: channels last is
// channels_last for [N, C, H, W], channels_last_3d for [N, C, D, H, W].
inline at::MemoryFormat memory_format(Layout layout, int64_t rank) {
  if (layout == Layout::nchw) return at::MemoryFormat::Contiguous;
  return rank == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
}

// `t` in `format` (a copy only where it is not already). A dense activation that changes between
// NCHW and channels last goes through the transposing copy kernel (layout.cpp).
at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format,
                            Memory memory = Memory::result);

// An operand in that layout, copied (where it is not in it) into scratch memory.
inline at::Tensor in_layout(const at::Tensor& t, Layout layout) {
  return to_memory_format(t, memory_format(layout, t.dim()), Memory::scratch);
}

// An empty tensor of `size` in `format`, its memory a result's or scratch.
at::Tensor empty_in_format(at::IntArrayRef size, at::TensorOptions options, at::MemoryFormat format,
                           Memory memory);

// An empty activation (or weight) of `size` in that layout.
inline at::Tensor empty_in_layout(at::IntArrayRef size, const at::Tensor& like, Layout layout,
                                  Memory memory = Memory::result) {
  return empty_in_format(size, like.options(), memory_format(layout, size.size()), memory);
}

}  // namespace torch_convbp
