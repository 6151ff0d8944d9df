// Helpers shared by the CPU kernels.
#pragma once

#include <algorithm>
#include <cstdint>

// Compiles a function twice on x86-64, for AVX2+FMA and for the baseline, and picks one at load
// time by what the CPU has (GCC function multiversioning). For the arithmetic kernels, which the
// compiler vectorizes: the extension is built for the baseline x86-64 otherwise.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TORCH_CONVBP_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TORCH_CONVBP_VECTOR_CLONES
#endif

// Forces a helper of those kernels to be inlined into its caller, so that it is compiled into
// the caller's clone: GCC's own choice varied with the torch headers it was built against, and an
// out-of-line copy (compiled for the baseline) ran the 32-channel depthwise forward 18x slower
// (benchmarks/NOTES.md, section 19).
#if defined(__GNUC__)
#define TORCH_CONVBP_INLINE inline __attribute__((always_inline))
#else
#define TORCH_CONVBP_INLINE inline
#endif

namespace torch_convbp {

// The output columns [begin, end) whose input column ow*stride + offset lies in [0, width).
struct Span {
  int64_t begin, end;
};
inline Span valid_columns(int64_t offset, int64_t stride, int64_t width, int64_t out_width) {
  const int64_t begin = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = width - 1 - offset;  // the largest ow*stride allowed
  const int64_t end = last < 0 ? 0 : std::min(out_width, last / stride + 1);
  return {std::min(begin, end), end};
}

}  // namespace torch_convbp
