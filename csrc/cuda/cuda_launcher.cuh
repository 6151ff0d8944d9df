// The Launcher of the CUDA kernels (launch.h): the two generic kernels every launch sequence
// runs, launched on the current stream of the operands' device, each launch checked.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>

#include "../summation.h"
#include "launch.h"

namespace torch_convbp {

// body(i) for every i < total, a grid-stride loop over a functor of *_thread.h.
template <typename index_t, typename Body>
__global__ void grid_kernel(Body body, index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, body);
}

// One block per item: thread t holds lane t of the item's sum in shared memory, then the fixed
// tree sums the lanes level by level (a barrier between levels) and thread 0 writes the total.
static_assert(kThreads == kSumLanes, "one thread per lane of a lane sum");
template <typename index_t, typename Lane, typename Write>
__global__ void lane_sums_kernel(Lane lane_of, Write write, index_t items) {
  using acc_t = decltype(lane_of(index_t(0), index_t(0)));
  __shared__ acc_t partial[kSumLanes];
  const int lane = threadIdx.x;
  for (index_t item = blockIdx.x; item < items; item += gridDim.x) {
    partial[lane] = lane_of(item, index_t(lane));
    __syncthreads();
    for (int half = kSumLanes / 2; half > 0; half /= 2) {
      tree_sum_step(partial, half, lane);
      __syncthreads();
    }
    if (lane == 0) write(item, partial[0]);
    __syncthreads();  // partial is reused by the next item
  }
}

class CudaLauncher {
 public:
  void use_device(const at::Device& device) {
    guard_.set_device(device);
    stream_ = c10::cuda::getCurrentCUDAStream(device.index());
  }

  template <typename F>
  void with_index(int64_t largest, F&& f) {
    with_index_type(largest, std::forward<F>(f));
  }

  template <typename index_t, typename Body>
  void grid(int64_t total, const Body& body) {
    grid_kernel<index_t, Body>
        <<<blocks_for(total), kThreads, 0, stream_>>>(body, static_cast<index_t>(total));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <typename index_t, typename Lane, typename Write>
  void lane_sums(int64_t items, const Lane& lane, const Write& write) {
    lane_sums_kernel<index_t, Lane, Write><<<blocks_per_item(items), kThreads, 0, stream_>>>(
        lane, write, static_cast<index_t>(items));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

 private:
  c10::cuda::OptionalCUDAGuard guard_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace torch_convbp
