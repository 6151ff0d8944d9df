// The CUDA kernels of the depthwise special case: one input channel per group, with channel
// multiplier m = Cout / C, so output channel o reads input channel o / m.
//
// Each kernel is a loop over one thread's work, written once in depthwise_thread.h as
// host-and-device functions, which the CPU harness (tests/cuda_harness/) checks bitwise against
// the CPU kernels:
// forward:     one thread per output element, summing its taps in (ki, kj) order.
// input grad:  a gather, one thread per input element, summing in (o, ki, kj) order what the
//              forward took from it; no atomics.
// weight grad: one block per weight entry (o, ki, kj); thread t sums the positions j with
//              j % 256 == t, then a fixed tree sums the threads. No atomics.
// So every result is bitwise the same on every run, and the same as the CPU's, in either layout
// of the activations (NCHW, or NHWC for channels_last; depthwise_thread.h). Index arithmetic
// is 32-bit where every index fits, 64-bit otherwise.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../conv2d.h"
#include "depthwise_thread.h"
#include "launch.h"

namespace torch_convbp {
namespace {

template <typename scalar_t, typename index_t>
__global__ void forward_kernel(const scalar_t* __restrict__ input,
                               const scalar_t* __restrict__ weight,
                               scalar_t* __restrict__ output, DepthwiseDims<index_t> s,
                               index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t i) {
    output[i] = depthwise_output(input, weight, s, i);
  });
}

template <typename scalar_t, typename index_t>
__global__ void input_grad_kernel(const scalar_t* __restrict__ grad_output,
                                  const scalar_t* __restrict__ weight,
                                  scalar_t* __restrict__ grad_input, DepthwiseDims<index_t> s,
                                  index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t i) {
    grad_input[i] = depthwise_input_grad_element(grad_output, weight, s, i);
  });
}

// One block per weight entry (o, ki, kj); thread t is lane t of the entry's sum (summation.h).
static_assert(kThreads == kSumLanes, "one thread per lane of the weight-gradient sum");

template <typename scalar_t, typename index_t>
__global__ void weight_grad_kernel(const scalar_t* __restrict__ input,
                                   const scalar_t* __restrict__ grad_output,
                                   scalar_t* __restrict__ grad_weight, DepthwiseDims<index_t> s) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t partial[kSumLanes];
  const index_t entries = s.out_channels * s.kernel_h * s.kernel_w;
  const int lane = threadIdx.x;
  for (index_t entry = blockIdx.x; entry < entries; entry += gridDim.x) {
    partial[lane] = depthwise_weight_grad_lane(input, grad_output, s, entry, index_t(lane));
    __syncthreads();
    for (int half = kSumLanes / 2; half > 0; half /= 2) {
      tree_sum_step(partial, half, lane);
      __syncthreads();
    }
    if (lane == 0) grad_weight[entry] = static_cast<scalar_t>(partial[0]);
    __syncthreads();  // partial is reused by the next entry
  }
}

void depthwise_conv2d_cuda(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                           IntArrayRef padding, IntArrayRef dilation, const Tensor& output) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_conv2d", input, weight,
                                              output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  const int64_t total = output.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
    with_index_type(std::max(total, input.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      forward_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
          output.mutable_data_ptr<scalar_t>(), DepthwiseDims<index_t>(s, call.channels_last), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void depthwise_input_grad_cuda(const Tensor& grad_output, const Tensor& weight,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               const Tensor& grad_input) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_input_grad", grad_input, weight,
                                              grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  const int64_t total = grad_input.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
    with_index_type(std::max(total, grad_output.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      input_grad_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
          grad_input.mutable_data_ptr<scalar_t>(), DepthwiseDims<index_t>(s, call.channels_last), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void depthwise_weight_grad_cuda(const Tensor& input, const Tensor& grad_output,
                                IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                const Tensor& grad_weight) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_weight_grad", input, grad_weight,
                                              grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  if (grad_weight.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int blocks = blocks_per_item(grad_weight.numel());  // one per weight entry
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_weight_grad", [&] {
    with_index_type(std::max(input.numel(), grad_output.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      weight_grad_kernel<scalar_t, index_t><<<blocks, kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
          grad_weight.mutable_data_ptr<scalar_t>(), DepthwiseDims<index_t>(s, call.channels_last));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("depthwise_conv2d", &depthwise_conv2d_cuda);
  m.impl("depthwise_input_grad", &depthwise_input_grad_cuda);
  m.impl("depthwise_weight_grad", &depthwise_weight_grad_cuda);
}

}  // namespace torch_convbp
