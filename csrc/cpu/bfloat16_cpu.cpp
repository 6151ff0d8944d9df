// bfloat16 results written from float32 sums (bfloat16_cpu.h).
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

}  // namespace

void round_to_bfloat16(const float* from, int64_t n, c10::BFloat16* to) {
  static_assert(sizeof(c10::BFloat16) == sizeof(uint16_t));
  round_bits(from, n, reinterpret_cast<uint16_t*>(to));
}

}  // namespace torch_convbp
