// Narrow groups summed across the groups (the direct grouped kernels, grouped_forward_cpu.cpp and
// grouped_weight_grad_cpu.cpp): where a group has half a vector of output channels (4 floats or 2
// doubles in 32 bytes), vector v of the output channels holds group 2v's channels in its first
// half and group 2v+1's in its second. A term's input value differs between the halves, so the
// input is first spread over the output channels: each input value copied to its group's half of
// a vector, as many times as the group has output channels. Every lane then does work, where a
// vector of one group's channels left half of them idle (benchmarks/NOTES.md, section 49).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../shape.h"
#include "cpu_kernels.h"
#include "vector_ops.h"

namespace torch_convbp {

// Whether a layer's groups are half a vector of acc_t wide, and so summed across the groups.
template <typename acc_t>
inline bool groups_are_half_a_vector(const ConvShape& s) {
  return 2 * (s.out_channels / s.groups) == Vector<acc_t>::lanes;
}

// `size` values of `buffer`, grown as needed, from its first cache line boundary: a vector of
// the spread read across two cache lines each time its first address is not a multiple of 32
// bytes, as a large block from malloc's is not (16 past a page), and the kernels' times had moved
// by a third from one process to the next (benchmarks/NOTES.md, section 49).
template <typename acc_t>
acc_t* cache_aligned(std::vector<acc_t>& buffer, int64_t size) {
  constexpr int64_t line = 64 / sizeof(acc_t);
  if (static_cast<int64_t>(buffer.size()) < size + line) buffer.resize(size + line);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (line - static_cast<int64_t>(address % 64) / sizeof(acc_t)) % line;
}

// The vectors [first_vector, first_vector + vectors) of `pixels` input pixels of x (NHWC, from its
// first pixel), spread:
//   out[p * pixel_size + i * channel_step + (v - first_vector) * lanes + l]
//     = x[p, (2v + (l < lanes / 2 ? 0 : 1)) * C/G + i],
// 0 for a group past the last (an odd number of groups), in the sums' type.
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void spread_pixels(const scalar_t* x, int64_t pixels, const ConvShape& s,
                                       int64_t first_vector, int64_t vectors, int64_t pixel_size,
                                       int64_t channel_step, acc_t* out) {
  using V = typename Vector<acc_t>::type;
  constexpr int64_t lanes = Vector<acc_t>::lanes;
  const int64_t group_in = s.in_channels / s.groups;
  // the vectors whose second half is a group too; the last may not be (locals, not members of
  // `s`: read through `s`, they were loaded again after every store)
  const int64_t pairs = std::min(first_vector + vectors, s.groups / 2) - first_vector;
  const int64_t in_channels = s.in_channels;
  for (int64_t p = 0; p < pixels; ++p, x += in_channels, out += pixel_size) {
    for (int64_t v = 0; v < vectors; ++v) {
      const scalar_t* low = x + 2 * (first_vector + v) * group_in;
      const scalar_t* high = low + group_in;
      for (int64_t i = 0; i < group_in; ++i) {
        const acc_t second = v < pairs ? static_cast<acc_t>(high[i]) : acc_t(0);
        const V halves = Ops::template splat_halves<V>(static_cast<acc_t>(low[i]), second);
        std::memcpy(out + i * channel_step + v * lanes, &halves, sizeof(V));
      }
    }
  }
}

}  // namespace torch_convbp
