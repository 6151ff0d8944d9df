// The arithmetic that the CPU and CUDA kernels share, so that both give the same bits.
//
// Compilers fuse a * b + c into one fused multiply-add where they may (nvcc by default, GCC where
// the CPU has FMA), and a fused and an unfused product round differently. So every product that
// is summed is written as an explicit multiply_add: one rounding, on every device and in every
// build of the CPU code (the AVX2 clones, the baseline, and the CPU harness of the CUDA kernels).
//
// The depthwise weight gradient sums many products per weight entry, in one of two orders:
// - lanes, the CUDA kernels' order: kSumLanes partial sums, position j going to lane
//   j % kSumLanes in increasing order of j, then a fixed binary tree over the lanes
//   (tree_sum_step with half = kSumLanes/2, ..., 1). On CUDA a lane is a thread of the block; on
//   the CPU an entry of an array.
// - rows, the CPU's default: each output row's products summed along the row, the rows' sums
//   added in order within fixed groups of rows, the groups' sums added in order
//   (cpu/depthwise_rows_cpu.cpp). Twice as fast on the CPU, where the lanes lived in the L2 cache
//   (benchmarks/NOTES.md, section 74), but not the CUDA kernels' bits.
// TORCH_CONVBP_CPU_DEPTHWISE_ORDER=lanes gives the CPU the CUDA kernels' order, and so their bits.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

#include "env_choice.h"

namespace torch_convbp {

enum class DepthwiseOrder { rows, lanes };
// The CPU's order (TORCH_CONVBP_CPU_DEPTHWISE_ORDER=rows|lanes, read on every call; rows unset).
inline DepthwiseOrder cpu_depthwise_order() {
  return env_choice("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", {"rows", "lanes"}) == "lanes"
             ? DepthwiseOrder::lanes
             : DepthwiseOrder::rows;
}

// On the CPU, depthwise output planes smaller than this compute with the NHWC kernels whatever
// the operands' layout: rows of 7 or 14 pixels leave the NCHW kernels' vector loops nothing to
// do, and the NHWC kernels sum in the same orders, so the bits do not change (NOTES section 18).
// NCHW operands go to them a block of channels at a time, transposed in cache (section 93;
// cpu/depthwise_cpu.cpp takes float32 ones of larger planes there too); the weight gradient in
// the order of lanes, through layout copies (route.cpp).
constexpr int64_t kMinNchwDepthwisePlane = 256;

// a * b + c, rounded once.
template <typename T>
C10_HOST_DEVICE inline T multiply_add(T a, T b, T c) {
#if defined(__CUDA_ARCH__)
  return fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

constexpr int kSumLanes = 256;

// One level of the tree: lane `lane` (< half) adds in lane `lane + half`. Within a level no lane
// reads what another writes, so the lanes of a level may run in any order, or at once.
template <typename acc_t>
C10_HOST_DEVICE inline void tree_sum_step(acc_t* partial, int half, int lane) {
  if (lane < half) partial[lane] += partial[lane + half];
}

}  // namespace torch_convbp
