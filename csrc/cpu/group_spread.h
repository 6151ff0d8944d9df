// Narrow groups summed across the groups (the direct grouped kernels, grouped_forward_cpu.cpp and
// grouped_weight_grad_cpu.cpp): where a group has fewer output channels than a vector has lanes
// (4 floats of 8 in 32 bytes, or of 16 in 64), vector v of the output channels holds several
// whole groups, each in its part of the lanes. A term's input value differs between the parts,
// so the input is first spread over the output channels: each input value copied to its group's
// part of a vector, as many times as the group has output channels. Every lane then does work,
// where a vector of one group's channels left half of them idle (benchmarks/NOTES.md, section 49).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../shape.h"
#include "cpu_kernels.h"
#include "vector_ops.h"

namespace torch_convbp {

// Whether a layer's groups are summed across the groups with vectors of `lanes` lanes: a group
// narrower than a vector, a whole number of groups to a vector, and at most 4 output channels a
// group. The spread holds Cout/G copies of the input: at 8 (ResNeXt's 256@28 on AVX-512, 2
// groups a vector) its reads from the L2 cache took 3.5x the time of the kernel group by group
// (benchmarks/NOTES.md, section 51).
inline bool summed_across_groups(const ConvShape& s, int64_t lanes) {
  const int64_t group_out = s.out_channels / s.groups;
  return group_out < lanes && lanes % group_out == 0 && group_out <= 4;
}

// The share of the lanes that do a group's work, with vectors of `lanes` lanes.
inline double lanes_used(const ConvShape& s, int64_t lanes) {
  const int64_t group_out = s.out_channels / s.groups;
  if (summed_across_groups(s, lanes)) return 1.0;
  return static_cast<double>(group_out) / ((group_out + lanes - 1) / lanes * lanes);
}

// Calls run(ops) with the vector operations (vector_ops.h) a layer's sums of acc_t run on: the
// widest this CPU has that uses as large a share of its lanes as narrower ones (so 32 bytes for 8
// output channels a group on an AVX-512 CPU: half of a 64-byte vector's lanes would idle). The
// kernels size their vectors, blocks and layouts by Ops::kBytes; every choice gives the same bits.
template <typename acc_t, typename Run>
inline void with_ops_for_groups(const ConvShape& s, Run&& run) {
#ifdef TORCH_CONVBP_AVX512_BANDS
  constexpr int64_t narrow = 32 / sizeof(acc_t), wide = 64 / sizeof(acc_t);
  if (cpu_has_avx512() && lanes_used(s, wide) >= lanes_used(s, narrow)) return run(Avx512Ops{});
#endif
#ifdef TORCH_CONVBP_AVX2_BANDS
  if (cpu_has_avx2_fma()) return run(Avx2Ops{});
#endif
  with_lane_ops(run);
}

// `size` values of `buffer`, grown as needed, from its first cache line boundary: a vector of
// the spread read across two cache lines each time its first address is not a multiple of 32
// bytes, as a large block from malloc's is not (16 past a page), and the kernels' times had moved
// by a third from one process to the next (benchmarks/NOTES.md, section 49).
template <typename T>
T* cache_aligned(std::vector<T>& buffer, int64_t size) {
  constexpr int64_t line = 64 / sizeof(T);
  if (static_cast<int64_t>(buffer.size()) < size + line) buffer.resize(size + line);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (line - static_cast<int64_t>(address % 64) / sizeof(T)) % line;
}

// Term i of `count` values `step` apart (a group's input channels, or its weights of one output
// channel and tap) as a vector lane of the sums holds it: value i in the sums' type; or, for terms
// in pairs (kTermsInPairs, vector_ops.h), the bits of values 2i (upper half: the term summed first)
// and 2i + 1 (lower half; a zero past the last of an odd count).
template <bool Pairs, typename acc_t, typename scalar_t>
TORCH_CONVBP_INLINE acc_t term_value(const scalar_t* values, int64_t step, int64_t i,
                                     int64_t count) {
  if constexpr (Pairs) {
    static_assert(std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<acc_t, float>);
    const uint32_t first = values[2 * i * step].x;
    const uint32_t second = 2 * i + 1 < count ? values[(2 * i + 1) * step].x : 0;
    const uint32_t bits = first << 16 | second;
    acc_t pair;
    std::memcpy(&pair, &bits, sizeof(pair));
    return pair;
  } else {
    return static_cast<acc_t>(values[i * step]);
  }
}

// The terms of each group's input channels a lane holds (term_value): C/G, or pairs of them.
template <class Ops>
int64_t terms_of(int64_t group_in) {
  return kTermsInPairs<Ops> ? (group_in + 1) / 2 : group_in;
}

// The vectors [first_vector, first_vector + vectors) of `pixels` input pixels of x (NHWC, from its
// first pixel), spread: with P = lanes / (Cout/G) groups to a vector (Parts),
//   out[p * pixel_size + i * channel_step + (v - first_vector) * lanes + l]
//     = term i of x[p, (P * v + l / (Cout/G)) * C/G + ...] (term_value),
// 0 for a group past the last, in the sums' type.
template <class Ops, int Parts, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void spread_parts(const scalar_t* x, int64_t pixels, const ConvShape& s,
                                      int64_t first_vector, int64_t vectors, int64_t pixel_size,
                                      int64_t channel_step, acc_t* out) {
  using V = typename Vector<acc_t, Ops::kBytes>::type;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  // (locals, not members of `s`: read through `s`, they were loaded again after every store)
  const int64_t group_in = s.in_channels / s.groups, groups = s.groups;
  const int64_t in_channels = s.in_channels;
  for (int64_t p = 0; p < pixels; ++p, x += in_channels, out += pixel_size) {
    for (int64_t v = 0; v < vectors; ++v) {
      const int64_t first_group = Parts * (first_vector + v);
      const scalar_t* first = x + first_group * group_in;
      for (int64_t i = 0; i < terms_of<Ops>(group_in); ++i) {
        acc_t values[Parts];
        for (int q = 0; q < Parts; ++q) {
          values[q] = first_group + q < groups ? term_value<kTermsInPairs<Ops>, acc_t>(
                                                     first + q * group_in, 1, i, group_in)
                                               : acc_t(0);
        }
        const V parts = Ops::template splat_parts<V, Parts>(values);
        std::memcpy(out + i * channel_step + v * lanes, &parts, sizeof(V));
      }
    }
  }
}

// The same for any number of groups to a vector (summed_across_groups: a power of two up to the
// lanes).
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void spread_pixels(const scalar_t* x, int64_t pixels, const ConvShape& s,
                                       int64_t first_vector, int64_t vectors, int64_t pixel_size,
                                       int64_t channel_step, acc_t* out) {
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  // (calls written out: a lambda is compiled for the baseline, and would not inline the AVX
  // operations)
  const int64_t parts = lanes / (s.out_channels / s.groups);
  if (parts == 2) {
    spread_parts<Ops, 2>(x, pixels, s, first_vector, vectors, pixel_size, channel_step, out);
  } else if (parts == 4) {
    spread_parts<Ops, 4>(x, pixels, s, first_vector, vectors, pixel_size, channel_step, out);
  } else if constexpr (lanes >= 8) {
    if (parts == 8) {
      spread_parts<Ops, 8>(x, pixels, s, first_vector, vectors, pixel_size, channel_step, out);
    } else if constexpr (lanes >= 16) {
      spread_parts<Ops, 16>(x, pixels, s, first_vector, vectors, pixel_size, channel_step, out);
    }
  }
}

}  // namespace torch_convbp
