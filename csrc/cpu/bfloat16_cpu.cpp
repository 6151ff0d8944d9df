// bfloat16 converted to and from float32 (bfloat16_cpu.h).
#include "bfloat16_cpu.h"

#include <cstring>

#include "cpu_kernels.h"

namespace torch_convbp {
namespace {

// c10's round_to_nearest_even on 16-bit integers, which GCC vectorizes: add 0x7FFF plus the
// lowest bit kept, then drop the low half; NaN (the only value unequal to itself) as 0x7FC0.
TORCH_CONVBP_WIDE_VECTOR_CLONES void round_bits(const float* from, int64_t n, uint16_t* to) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, from + i, sizeof bits);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    to[i] = from[i] != from[i] ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
  }
}

// The bits as the upper half of a float's, on integers, which GCC vectorizes.
TORCH_CONVBP_WIDE_VECTOR_CLONES void widen_bits(const uint16_t* from, int64_t n, float* to) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = uint32_t{from[i]} << 16;
    std::memcpy(to + i, &bits, sizeof bits);
  }
}

}  // namespace

void round_to_bfloat16(const float* from, int64_t n, c10::BFloat16* to) {
  static_assert(sizeof(c10::BFloat16) == sizeof(uint16_t));
  round_bits(from, n, reinterpret_cast<uint16_t*>(to));
}

void widen_bfloat16(const c10::BFloat16* from, int64_t n, float* to) {
  widen_bits(reinterpret_cast<const uint16_t*>(from), n, to);
}

}  // namespace torch_convbp
