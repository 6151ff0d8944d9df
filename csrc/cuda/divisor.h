// Division of a kernel's indices by a divisor fixed at launch. A GPU has no integer divider: a
// 32-bit division by a value known only at run time is a sequence of about twenty instructions,
// and the depthwise kernels divide three or four times per element (benchmarks/NOTES.md,
// section 76). Divisor<int32_t> divides by one multiplication and a shift instead, with a
// multiplier found on the host (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994): for 0 <= n < 2^31 and 1 <= d < 2^31, with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1 (which is under 2^32),
//   n / d = (floor(n m / 2^32) + n) >> s.
// The harness checks it against the hardware's division (tests/test_cuda_threads.py). 64-bit
// kernels, for tensors past 2^31 elements, keep the hardware's division.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace torch_convbp {

template <typename index_t>
struct Divisor {
  index_t value;
  explicit Divisor(index_t d) : value(d) {}
  C10_HOST_DEVICE index_t quotient(index_t n) const { return n / value; }
};

template <>
struct Divisor<int32_t> {
  int32_t value;
  uint32_t multiplier, shift;
  explicit Divisor(int32_t d) : value(d), shift(0) {
    TORCH_CHECK(d >= 1, "torch_convbp: a divisor must be positive, got ", d);
    while ((int64_t{1} << shift) < d) ++shift;
    const uint64_t over = (uint64_t{1} << shift) - static_cast<uint64_t>(d);  // 0 <= over < d
    multiplier = static_cast<uint32_t>((over << 32) / static_cast<uint64_t>(d) + 1);
  }
  // n / d for 0 <= n < 2^31: high + n < 2^32, as high <= n.
  C10_HOST_DEVICE int32_t quotient(int32_t n) const {
    const auto u = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(u, multiplier);
#else
    const auto high = static_cast<uint32_t>((uint64_t{u} * multiplier) >> 32);
#endif
    return static_cast<int32_t>((high + u) >> shift);
  }
};

// A divisor given as a plain value: the hardware's division (element_at of LanePositions, which
// divides once per thread).
template <typename index_t>
C10_HOST_DEVICE inline index_t quotient(index_t n, index_t d) {
  return n / d;
}
template <typename index_t>
C10_HOST_DEVICE inline index_t quotient(index_t n, const Divisor<index_t>& d) {
  return d.quotient(n);
}
template <typename index_t>
C10_HOST_DEVICE inline index_t value_of(index_t d) {
  return d;
}
template <typename index_t>
C10_HOST_DEVICE inline index_t value_of(const Divisor<index_t>& d) {
  return d.value;
}

}  // namespace torch_convbp
