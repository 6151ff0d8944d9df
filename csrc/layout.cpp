// An operand or result changed between NCHW and channels last (layout.h).
#include "layout.h"

#include <ATen/ops/empty.h>

#include <vector>

#include "device_kernels.h"
#include "scratch.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// Below this many channels ATen's copy is as fast as the tiled one: its rows of C elements are
// short, and one of the tiles' sides would be mostly empty (benchmarks/NOTES.md, section 30).
constexpr int64_t kMinTransposedChannels = 16;

// A dense activation's memory as one matrix per image: [C, pixels] in NCHW, [pixels, C] in
// channels last. A view.
Tensor image_matrices(const Tensor& t) {
  const int64_t n = t.size(0), c = t.size(1), pixels = t.numel() / (n * c);
  if (t.is_contiguous()) return t.view({n, c, pixels});
  return t.movedim(1, -1).view({n, pixels, c});
}

}  // namespace

Tensor empty_in_format(at::IntArrayRef size, at::TensorOptions options, at::MemoryFormat format,
                       Memory memory) {
  if (memory == Memory::result) return at::empty(size, options.memory_format(format));
  if (format == at::MemoryFormat::Contiguous) return empty_scratch(size, options);
  // Channels last: [N, (D,) H, W, C] in memory, viewed as [N, C, (D,) H, W].
  std::vector<int64_t> memory_order(size.begin(), size.end()), dims(size.size());
  memory_order.erase(memory_order.begin() + 1);
  memory_order.push_back(size[1]);
  dims[0] = 0;
  dims[1] = static_cast<int64_t>(size.size()) - 1;
  for (size_t d = 2; d < size.size(); ++d) dims[d] = static_cast<int64_t>(d) - 1;
  return empty_scratch(memory_order, options).permute(dims);
}

Tensor to_memory_format(const Tensor& t, at::MemoryFormat format, Memory memory) {
  if (t.is_contiguous(format)) return t;
  const bool activation = (t.dim() == 4 || t.dim() == 5) && t.numel() > 0;
  const auto channels_last = memory_format(Layout::nhwc, t.dim());
  const bool to_nchw = format == at::MemoryFormat::Contiguous && t.is_contiguous(channels_last);
  const bool to_channels_last = format == channels_last && t.is_contiguous();
  if (!activation || !(to_nchw || to_channels_last) || t.size(1) < kMinTransposedChannels) {
    if (memory == Memory::result) return t.contiguous(format);
    return empty_in_format(t.sizes(), t.options(), format, memory).copy_(t);
  }
  Tensor result = empty_in_format(t.sizes(), t.options(), format, memory);
  call_transpose_copy(image_matrices(t), image_matrices(result));
  return result;
}

}  // namespace torch_convbp
