// The launch arithmetic of the CUDA kernels: block counts, the choice of 32- or 64-bit indices,
// and the grid-stride loop. Plain host-and-device code, so that the CPU harness
// (tests/cuda_harness/) runs it too, at the 2^31 boundary included.
//
// Each kernel's launch sequence (the checks, the thread counts, scratch buffers, passes and the
// kernels launched: columns_launch.h, depthwise_launch.h, grouped_launch.h) is written once, as a
// template over a Launcher, which provides
//   use_device(device)                 the device the kernels run on (a device guard on the GPU),
//   with_index(largest, f)             f(index_t{}) with the index type of a call whose largest
//                                      tensor has `largest` elements (with_index_type below),
//   grid<index_t>(total, body)         a grid-stride kernel of blocks_for(total) blocks of kThreads
//                                      threads that runs body(i) for every i < total,
//   lane_sums<index_t>(items, lane, write)  one block per item (blocks_per_item): thread t of the
//                                      block computes lane(item, t) for t < kSumLanes, the block
//                                      sums them by the fixed tree (summation.h) and calls
//                                      write(item, total).
// CudaLauncher (cuda_launcher.cuh) launches those kernels on the current stream; the harness's
// GridRunner runs every (block, thread) of them on the CPU, in the index type a test asks for. So
// the harness runs the host code that the GPU runs, not a copy of it.
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace torch_convbp {

constexpr int kThreads = 256;                     // threads per block, for every kernel
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

constexpr int blocks_for(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// For kernels with one block per item (a grid-stride loop over the items covers the rest).
constexpr int blocks_per_item(int64_t items) {
  return static_cast<int>(std::clamp<int64_t>(items, 1, kMaxBlocks));
}

// Whether a 32-bit kernel can index n elements: every index below n, and the last grid-stride
// step past the end (at most kMaxBlocks * kThreads), must fit in int32.
constexpr bool fits_int32(int64_t n) {
  return n < std::numeric_limits<int32_t>::max() - kMaxBlocks * kThreads;
}

// Runs launch(index_t{}) with index_t = int32_t when a 32-bit kernel can index `largest`
// elements (the largest tensor of the call), else with int64_t.
template <typename Launch>
void with_index_type(int64_t largest, Launch&& launch) {
  if (fits_int32(largest)) {
    launch(int32_t{0});
  } else {
    launch(int64_t{0});
  }
}

// The thread of an elementwise kernel: result[i] = Element{}(a, b, dims, i), for a function object
// Element of *_thread.h (a type, so that the device compiler inlines it).
template <typename Element, typename scalar_t, typename Dims, typename index_t>
struct ElementThread {
  const scalar_t* a;
  const scalar_t* b;
  scalar_t* result;
  Dims dims;
  C10_HOST_DEVICE void operator()(index_t i) const { result[i] = Element{}(a, b, dims, i); }
};

// Calls body(i) for each index i < total that thread `thread` of block `block` takes, in a grid
// of `blocks` blocks of kThreads threads: i = block * kThreads + thread, then steps of the whole
// grid. The kernels call it with blockIdx.x, threadIdx.x and gridDim.x; the harness with every
// (block, thread) of the grid.
template <typename index_t, typename Body>
C10_HOST_DEVICE inline void grid_stride_loop(index_t total, index_t block, index_t thread,
                                             index_t blocks, Body&& body) {
  const index_t step = blocks * kThreads;
  for (index_t i = block * kThreads + thread; i < total; i += step) body(i);
}

}  // namespace torch_convbp
