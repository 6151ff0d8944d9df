// The vector arithmetic of the direct grouped kernels (grouped_forward_cpu.cpp, the forward;
// grouped_weight_grad_cpu.cpp, the weight gradient): a vector of 32 bytes of the sums' type, and
// its operations (a value in every lane or in each half, and a * b + c rounded once per lane),
// written once for any CPU (LaneOps) and once as AVX2 instructions (Avx2Ops) for the code
// compiled for AVX2.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "cpu_kernels.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TORCH_CONVBP_AVX2_BANDS 1
#include <immintrin.h>
#endif

// The vectors below are returned by value from always-inlined helpers only; GCC's note that
// such a return changes the ABI where AVX is off does not apply to them.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace torch_convbp {

// 32 bytes of acc_t (8 float or 4 double), in GCC's vector extension: with it the block stays in
// registers, where a [PB][V] array of scalars did not, or only in some block shapes
// (benchmarks/NOTES.md, section 20).
template <typename acc_t>
struct Vector {
  typedef acc_t type __attribute__((vector_size(32)));
  static constexpr int64_t lanes = 32 / sizeof(acc_t);
};

// The vector operations of the sums, lane by lane, on any CPU: a value in every lane, one value
// in each half's lanes, and a * b + c with each lane rounded once (std::fma). (a * b + c on
// vectors is fused only where the compiler contracts it, so it would round differently in
// different builds.)
struct LaneOps {
  template <typename V, typename acc_t>
  static TORCH_CONVBP_INLINE V splat(acc_t value) {
    V r;
    for (size_t l = 0; l < sizeof(V) / sizeof(acc_t); ++l) r[l] = value;
    return r;
  }
  template <typename V, typename acc_t>
  static TORCH_CONVBP_INLINE V splat_halves(acc_t low, acc_t high) {
    constexpr size_t lanes = sizeof(V) / sizeof(acc_t);
    V r;
    for (size_t l = 0; l < lanes; ++l) r[l] = l < lanes / 2 ? low : high;
    return r;
  }
  template <typename V>
  static TORCH_CONVBP_INLINE V multiply_add(V a, V b, V c) {
    V r;
    for (size_t l = 0; l < sizeof(V) / sizeof(a[0]); ++l) r[l] = std::fma(a[l], b[l], c[l]);
    return r;
  }
};

#ifdef TORCH_CONVBP_AVX2_BANDS
// The same as one AVX2 instruction each (FMA3 also rounds once), for the bands compiled for AVX2.
// Written out, because GCC's vectorizer did not make them of the lane loops: std::fma per lane
// fused part of the lanes only, and the splat was built lane by lane (NOTES section 21). Not
// always_inline: GCC refuses that into the generic helpers before they are inlined into those
// bands, and inlines these there on its own.
struct Avx2Ops {
  using Floats = Vector<float>::type;
  using Doubles = Vector<double>::type;
  template <typename V>
  __attribute__((target("avx2,fma"))) static inline V splat(float value) {
    return _mm256_set1_ps(value);
  }
  template <typename V>
  __attribute__((target("avx2,fma"))) static inline V splat(double value) {
    return _mm256_set1_pd(value);
  }
  template <typename V>
  __attribute__((target("avx2,fma"))) static inline V splat_halves(float low, float high) {
    return _mm256_set_m128(_mm_set1_ps(high), _mm_set1_ps(low));
  }
  template <typename V>
  __attribute__((target("avx2,fma"))) static inline V splat_halves(double low, double high) {
    return _mm256_set_m128d(_mm_set1_pd(high), _mm_set1_pd(low));
  }
  __attribute__((target("avx2,fma"))) static inline Floats multiply_add(Floats a, Floats b,
                                                                        Floats c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  __attribute__((target("avx2,fma"))) static inline Doubles multiply_add(Doubles a, Doubles b,
                                                                         Doubles c) {
    return _mm256_fmadd_pd(a, b, c);
  }
};
#endif

#ifdef TORCH_CONVBP_AVX2_BANDS
// Whether to run the code compiled for AVX2 with FMA: where the CPU has them, unless
// TORCH_CONVBP_NO_AVX2 is set (read once), which lets the tests run the baseline code on an AVX2
// machine too (tests/test_nhwc.py).
inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          std::getenv("TORCH_CONVBP_NO_AVX2") == nullptr;
  return has;
}
#endif

}  // namespace torch_convbp
