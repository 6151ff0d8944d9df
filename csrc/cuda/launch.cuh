// Launch helpers shared by the CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace torch_convbp {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

inline int blocks_for(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// Whether every index below n fits a 32-bit kernel's arithmetic, with room for the last
// grid-stride step past n.
inline bool fits_int32(int64_t n) {
  return n < std::numeric_limits<int32_t>::max() - kMaxBlocks * kThreads;
}

}  // namespace torch_convbp
