// bfloat16 converted to and from float32, in vector instructions.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <type_traits>

namespace torch_convbp {

// to[i] = from[i] rounded to bfloat16, i < n: the bits of c10::BFloat16(from[i]) (to nearest
// even; a NaN becomes 0x7FC0), computed on 16 or 8 floats at a time. c10's conversion is
// scalar, and in a loop of it GCC vectorized only by SSE lanes: rounding the output took more
// time than the GEMM (benchmarks/NOTES.md, section 53).
void round_to_bfloat16(const float* from, int64_t n, c10::BFloat16* to);

// to[i] = from[i] as float (exact: the bits as the float's upper half), i < n, 16 or 8 at a
// time: a loop of c10's conversion stayed scalar (benchmarks/NOTES.md, section 97).
void widen_bfloat16(const c10::BFloat16* from, int64_t n, float* to);

// to[i] = from[i] in the sums' type acc_t (exact), and back, rounded as c10 rounds: bfloat16 by
// the two above, float16 (and a type to itself) by c10's conversions.
template <typename scalar_t, typename acc_t>
void widen(const scalar_t* from, int64_t n, acc_t* to) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    widen_bfloat16(from, n, to);
  } else {
    for (int64_t i = 0; i < n; ++i) to[i] = static_cast<acc_t>(from[i]);
  }
}
template <typename scalar_t, typename acc_t>
void narrow(const acc_t* from, int64_t n, scalar_t* to) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    round_to_bfloat16(from, n, to);
  } else {
    for (int64_t i = 0; i < n; ++i) to[i] = static_cast<scalar_t>(from[i]);
  }
}

}  // namespace torch_convbp
