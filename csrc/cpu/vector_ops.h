// The vector arithmetic of the direct grouped kernels (grouped_forward_cpu.cpp, the forward;
// grouped_weight_grad_cpu.cpp, the weight gradient): a vector of the sums' type, and its
// operations (a value in every lane or in each part of the lanes, and a * b + c rounded once per
// lane), written once for any CPU (LaneOps, 32 bytes), once as AVX2 instructions (Avx2Ops, 32
// bytes) and once as AVX-512 instructions (Avx512Ops, 64 bytes). Each lane rounds alike in all
// three, so the kernels give the same bits whichever runs (benchmarks/NOTES.md, section 51).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <c10/util/Exception.h>

#include "../cpu_features.h"
#include "cpu_kernels.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TORCH_CONVBP_AVX2_BANDS 1
#include <immintrin.h>
// A build for a CPU without AVX-512 may leave the AVX-512 kernels out
// (TORCH_CONVBP_NO_AVX512_KERNELS, setup.py): the sanitizers' build does, as it checks the code
// the CPU it runs on can run. cpu_has_avx512() is then false there anyway.
#ifndef TORCH_CONVBP_NO_AVX512_KERNELS
#define TORCH_CONVBP_AVX512_BANDS 1
#endif
#endif

// The vectors below are returned by value from always-inlined helpers only; GCC's note that
// such a return changes the ABI where AVX is off does not apply to them.
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its flow analysis then calls
// maybe uninitialized once they are inlined here (GCC bug 105593): no value of ours is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace torch_convbp {

// `Bytes` bytes of acc_t (32: 8 float or 4 double; 64 for AVX-512), in GCC's vector extension:
// with it the block stays in registers, where a [PB][V] array of scalars did not, or only in some
// block shapes (benchmarks/NOTES.md, section 20).
template <typename acc_t, int Bytes>
struct Vector {
  typedef acc_t type __attribute__((vector_size(Bytes)));
  static constexpr int64_t lanes = Bytes / sizeof(acc_t);
};

// The vector operations of the sums, lane by lane, on any CPU: a value in every lane; `Parts`
// values, each in its part of the lanes (value q in lanes [q, q + 1) * lanes / Parts); and
// a * b + c with each lane rounded once (std::fma). (a * b + c on vectors is fused only where the
// compiler contracts it, so it would round differently in different builds.) Each set of
// operations names its vectors' size, kBytes.
struct LaneOps {
  static constexpr int kBytes = 32;
  template <typename V, typename acc_t>
  static TORCH_CONVBP_INLINE V splat(acc_t value) {
    V r;
    for (size_t l = 0; l < sizeof(V) / sizeof(acc_t); ++l) r[l] = value;
    return r;
  }
  template <typename V, int Parts, typename acc_t>
  static TORCH_CONVBP_INLINE V splat_parts(const acc_t (&values)[Parts]) {
    constexpr size_t lanes = sizeof(V) / sizeof(acc_t);
    V r;
    for (size_t l = 0; l < lanes; ++l) r[l] = values[l / (lanes / Parts)];
    return r;
  }
  template <typename V>
  static TORCH_CONVBP_INLINE V multiply_add(V a, V b, V c) {
    V r;
    for (size_t l = 0; l < sizeof(V) / sizeof(a[0]); ++l) r[l] = std::fma(a[l], b[l], c[l]);
    return r;
  }
};

// Whether Ops sums bfloat16 terms in pairs (Avx512PairOps below): its operands hold pairs' bits.
template <class Ops>
inline constexpr bool kTermsInPairs = false;

#ifdef TORCH_CONVBP_AVX2_BANDS
// The same as one AVX2 instruction each (FMA3 also rounds once), for the bands compiled for AVX2.
// Written out, because GCC's vectorizer did not make them of the lane loops: std::fma per lane
// fused part of the lanes only, and the splat was built lane by lane (NOTES section 21). Not
// always_inline: GCC refuses that into the generic helpers before they are inlined into those
// bands, and inlines these there on its own. Parts other than halves are built lane by lane (they
// are the spread's, once per input value and output channel: group_spread.h).
struct Avx2Ops {
  static constexpr int kBytes = 32;
  using Floats = Vector<float, 32>::type;
  using Doubles = Vector<double, 32>::type;
  template <typename V>
  __attribute__((target("avx2,fma"))) static inline V splat(float value) {
    return _mm256_set1_ps(value);
  }
  template <typename V>
  __attribute__((target("avx2,fma"))) static inline V splat(double value) {
    return _mm256_set1_pd(value);
  }
  template <typename V, int Parts, typename acc_t>
  __attribute__((target("avx2,fma"))) static inline V splat_parts(const acc_t (&values)[Parts]) {
    if constexpr (Parts == 2 && std::is_same_v<acc_t, float>) {
      return _mm256_set_m128(_mm_set1_ps(values[1]), _mm_set1_ps(values[0]));
    } else if constexpr (Parts == 2 && std::is_same_v<acc_t, double>) {
      return _mm256_set_m128d(_mm_set1_pd(values[1]), _mm_set1_pd(values[0]));
    } else {
      return LaneOps::splat_parts<V>(values);
    }
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

// The same on 64-byte vectors, one AVX-512F instruction each (its multiply-add rounds once too),
// for the bands compiled for AVX-512: 16 floats or 8 doubles a vector, in 32 registers. The parts
// of the spread are one permutation of the values (2 or 4 of them), or built lane by lane.
#define TORCH_CONVBP_AVX512 __attribute__((target("avx512f,avx2,fma")))
struct Avx512Ops {
  static constexpr int kBytes = 64;
  using Floats = Vector<float, 64>::type;
  using Doubles = Vector<double, 64>::type;
  template <typename V>
  TORCH_CONVBP_AVX512 static inline V splat(float value) {
    return _mm512_set1_ps(value);
  }
  template <typename V>
  TORCH_CONVBP_AVX512 static inline V splat(double value) {
    return _mm512_set1_pd(value);
  }
  template <typename V, int Parts, typename acc_t>
  TORCH_CONVBP_AVX512 static inline V splat_parts(const acc_t (&values)[Parts]) {
    constexpr int lanes = 64 / sizeof(acc_t), per_part = lanes / Parts;
    if constexpr ((Parts == 2 || Parts == 4) && std::is_same_v<acc_t, float>) {
      const __m512i which = _mm512_set_epi32(
          15 / per_part, 14 / per_part, 13 / per_part, 12 / per_part, 11 / per_part, 10 / per_part,
          9 / per_part, 8 / per_part, 7 / per_part, 6 / per_part, 5 / per_part, 4 / per_part,
          3 / per_part, 2 / per_part, 1 / per_part, 0);
      float four[4] = {};
      for (int q = 0; q < Parts; ++q) four[q] = values[q];
      return _mm512_permutexvar_ps(which, _mm512_broadcast_f32x4(_mm_loadu_ps(four)));
    } else if constexpr ((Parts == 2 || Parts == 4) && std::is_same_v<acc_t, double>) {
      const __m512i which = _mm512_set_epi64(7 / per_part, 6 / per_part, 5 / per_part, 4 / per_part,
                                             3 / per_part, 2 / per_part, 1 / per_part, 0);
      double four[4] = {};
      for (int q = 0; q < Parts; ++q) four[q] = values[q];
      return _mm512_permutexvar_pd(which, _mm512_broadcast_f64x4(_mm256_loadu_pd(four)));
    } else {
      return LaneOps::splat_parts<V>(values);
    }
  }
  TORCH_CONVBP_AVX512 static inline Floats multiply_add(Floats a, Floats b, Floats c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  TORCH_CONVBP_AVX512 static inline Doubles multiply_add(Doubles a, Doubles b, Doubles c) {
    return _mm512_fmadd_pd(a, b, c);
  }
};

// bfloat16 operands as pairs, for the bands compiled for AVX-512 with AVX512_BF16: a 32-bit lane of
// an operand holds two bfloat16 values, the term that comes first in its upper half, and
// multiply_add is VDPBF16PS, which adds to c the product of the upper halves, then that of the
// lower ones, each a multiply-add rounded once (a product of two bfloat16 values is exact in
// float32): two terms in one instruction, in order, the same bits as two FMAs wherever no value is
// subnormal (the instruction reads subnormal values as zero and flushes subnormal results, a
// difference only below 1.2e-38). Checked against two FMAs on this hardware: benchmarks/NOTES.md,
// section 121. Only the spread's sums take them (grouped_forward_cpu.cpp).
#define TORCH_CONVBP_AVX512_BF16 __attribute__((target("avx512f,avx512bf16,avx2,fma")))
struct Avx512PairOps : Avx512Ops {
  TORCH_CONVBP_AVX512_BF16 static inline Floats multiply_add(Floats a, Floats b, Floats c) {
    return _mm512_dpbf16_ps(c, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
  }
};
template <>
inline constexpr bool kTermsInPairs<Avx512PairOps> = true;

// Whether to run the code compiled for AVX2 with FMA: where the CPU has them, unless
// TORCH_CONVBP_NO_AVX2 is set (read once), which lets the tests run the baseline code on an AVX2
// machine too (tests/test_route_grouped.py).
inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          std::getenv("TORCH_CONVBP_NO_AVX2") == nullptr;
  return has;
}

// Whether to run the code compiled for AVX-512: where the CPU has it and the AVX2 code would run
// (cpu_features.h: not where oneDNN is capped below AVX-512), unless TORCH_CONVBP_NO_AVX512 is set
// (read once; the tests compare the two).
inline bool cpu_has_avx512() {
  static const bool has = cpu_has_avx2_fma() && cpu_allows_avx512_kernels() &&
                          std::getenv("TORCH_CONVBP_NO_AVX512") == nullptr;
  return has;
}

// Whether bfloat16 terms run in pairs (Avx512PairOps): where the AVX-512 code runs and the CPU has
// AVX512_BF16, unless TORCH_CONVBP_NO_BFLOAT16_PAIRS is set (read once; the tests compare the two).
inline bool cpu_has_bfloat16_pairs() {
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16") &&
                          std::getenv("TORCH_CONVBP_NO_BFLOAT16_PAIRS") == nullptr;
  return has;
}

#endif

// One vector of acc_t from p, unaligned (converted where scalar_t is narrower).
template <typename acc_t, typename V, typename scalar_t>
TORCH_CONVBP_INLINE V load_vector(const scalar_t* p) {
  constexpr int64_t lanes = sizeof(V) / sizeof(acc_t);
  V v;
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    std::memcpy(&v, p, sizeof(V));
  } else {
    acc_t values[lanes];
    for (int64_t l = 0; l < lanes; ++l) values[l] = static_cast<acc_t>(p[l]);
    std::memcpy(&v, values, sizeof(V));
  }
  return v;
}

// Runs run(LaneOps{}), the loop nests for any x86-64 CPU, where the build has them: a build for
// a CPU with AVX2 and FMA may leave them out (TORCH_CONVBP_NO_LANE_KERNELS, setup.py: the
// sanitizers' build, which checks the code its CPU runs), and then refuses to run without those.
template <class Run>
void with_lane_ops(Run&& run) {
#ifdef TORCH_CONVBP_NO_LANE_KERNELS
  TORCH_CHECK(
      false,
      "torch_convbp: this build has no kernels for CPUs without AVX2 and FMA "
      "(TORCH_CONVBP_NO_LANE_KERNELS), and TORCH_CONVBP_NO_AVX2 is set or the CPU lacks them");
#else
  run(LaneOps{});
#endif
}

// Runs run(ops) with the widest vector operations this CPU runs: Avx512Ops, Avx2Ops or LaneOps.
template <class Run>
void with_vector_ops(Run&& run) {
#ifdef TORCH_CONVBP_AVX512_BANDS
  if (cpu_has_avx512()) return run(Avx512Ops{});
#endif
#ifdef TORCH_CONVBP_AVX2_BANDS
  if (cpu_has_avx2_fma()) return run(Avx2Ops{});
#endif
  with_lane_ops(run);
}

// Runs Body::template run<Ops>(args...) (an always-inlined loop nest) compiled for the target of
// Ops, so that Ops's operations are inlined into its loops: for any x86-64 CPU, and where GCC
// builds them, for AVX2 with FMA and for AVX-512.
template <class Body, typename... Args>
void run_compiled_for(LaneOps, Args&&... args) {
  Body::template run<LaneOps>(args...);
}
#ifdef TORCH_CONVBP_AVX2_BANDS
template <class Body, typename... Args>
__attribute__((target("avx2,fma"))) void run_compiled_for(Avx2Ops, Args&&... args) {
  Body::template run<Avx2Ops>(args...);
}
template <class Body, typename... Args>
TORCH_CONVBP_AVX512 void run_compiled_for(Avx512Ops, Args&&... args) {
  Body::template run<Avx512Ops>(args...);
}
template <class Body, typename... Args>
TORCH_CONVBP_AVX512_BF16 void run_compiled_for(Avx512PairOps, Args&&... args) {
  Body::template run<Avx512PairOps>(args...);
}
#endif

}  // namespace torch_convbp
