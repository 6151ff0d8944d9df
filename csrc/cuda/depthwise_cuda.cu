// The CUDA kernels of the depthwise special case: one input channel per group, with channel
// multiplier m = Cout / C, so output channel o reads input channel o / m.
//
// Each kernel is a loop over one thread's work, written once in depthwise_thread.h as
// host-and-device functions, which the CPU harness (tests/cuda_harness/) checks bitwise against
// the CPU kernels:
// forward:     one thread per output element, summing its taps in (ki, kj) order.
// input grad:  a gather, one thread per input element, summing in (o, ki, kj) order what the
//              forward took from it; no atomics.
// weight grad: lane t of weight entry (o, ki, kj) sums the positions j with j % 256 == t, then
//              a fixed tree sums the lanes. No atomics. In NCHW one block per entry, a lane per
//              thread; in NHWC a thread per (channel, tap, lane), adjacent channels in adjacent
//              threads (coalesced), and a second kernel sums each entry's lanes.
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
                               const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
                               DepthwiseDims<index_t> s, index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x,
                            [&](index_t i) { output[i] = depthwise_output(input, weight, s, i); });
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

// Sums a block's kSumLanes partial sums (thread `lane` holds partial[lane]) by the fixed tree and
// has lane 0 write the total to *result; partial may be reused after it returns.
template <typename scalar_t, typename acc_t>
__device__ void sum_lanes(acc_t* partial, int lane, scalar_t* result) {
  __syncthreads();
  for (int half = kSumLanes / 2; half > 0; half /= 2) {
    tree_sum_step(partial, half, lane);
    __syncthreads();
  }
  if (lane == 0) *result = static_cast<scalar_t>(partial[0]);
  __syncthreads();
}

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
    sum_lanes(partial, lane, grad_weight + entry);
  }
}

// NHWC, first kernel: every lane of a slice of output channels, one thread each (slice_lane).
template <typename scalar_t, typename index_t>
__global__ void weight_grad_lanes_kernel(const scalar_t* __restrict__ input,
                                         const scalar_t* __restrict__ grad_output,
                                         at::opmath_type<scalar_t>* __restrict__ scratch,
                                         DepthwiseDims<index_t> s, index_t first_channel,
                                         index_t channels) {
  const index_t taps = s.kernel_h * s.kernel_w;
  grid_stride_loop<index_t>(
      channels * taps * kSumLanes, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t t) {
        const auto l = slice_lane(t, first_channel, channels, taps);
        scratch[l.scratch] = depthwise_weight_grad_lane(input, grad_output, s, l.entry, l.lane);
      });
}

// NHWC, second kernel: one block per entry of the slice sums its lanes.
template <typename scalar_t>
__global__ void sum_lanes_kernel(const at::opmath_type<scalar_t>* __restrict__ scratch,
                                 scalar_t* __restrict__ grad_weight, int64_t entries) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t partial[kSumLanes];
  const int lane = threadIdx.x;
  for (int64_t entry = blockIdx.x; entry < entries; entry += gridDim.x) {
    partial[lane] = scratch[entry * kSumLanes + lane];
    sum_lanes(partial, lane, grad_weight + entry);
  }
}

void depthwise_conv2d_cuda(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                           IntArrayRef padding, IntArrayRef dilation, const Tensor& output) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_conv2d", input, weight, output,
                                             stride, padding, dilation);
  const ConvShape& s = call.shape;
  const int64_t total = output.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
        with_index_type(std::max(total, input.numel()), [&](auto tag) {
          using index_t = decltype(tag);
          forward_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
              input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
              output.mutable_data_ptr<scalar_t>(), DepthwiseDims<index_t>(s, call.channels_last),
              static_cast<index_t>(total));
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

void depthwise_input_grad_cuda(const Tensor& grad_output, const Tensor& weight, IntArrayRef stride,
                               IntArrayRef padding, IntArrayRef dilation,
                               const Tensor& grad_input) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_input_grad", grad_input,
                                             weight, grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  const int64_t total = grad_input.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
        with_index_type(std::max(total, grad_output.numel()), [&](auto tag) {
          using index_t = decltype(tag);
          input_grad_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
              grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
              grad_input.mutable_data_ptr<scalar_t>(),
              DepthwiseDims<index_t>(s, call.channels_last), static_cast<index_t>(total));
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

// The NHWC weight gradient, slice by slice of output channels: the lanes into scratch
// [channels * taps, kSumLanes] (opmath), then each entry's tree sum into grad_weight.
template <typename scalar_t>
void weight_grad_nhwc(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                      const Tensor& grad_weight, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = s.kernel_h * s.kernel_w;
  const int64_t slice = std::min(lane_slice_channels(taps), s.out_channels);
  const Tensor scratch = at::empty({slice * taps * kSumLanes},
                                   input.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  for (int64_t first = 0; first < s.out_channels; first += slice) {
    const int64_t channels = std::min(slice, s.out_channels - first);
    const int64_t threads = channels * taps * kSumLanes;
    with_index_type(std::max({input.numel(), grad_output.numel(), threads}), [&](auto tag) {
      using index_t = decltype(tag);
      weight_grad_lanes_kernel<scalar_t, index_t><<<blocks_for(threads), kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
          scratch.mutable_data_ptr<acc_t>(), DepthwiseDims<index_t>(s, /*channels_last=*/true),
          static_cast<index_t>(first), static_cast<index_t>(channels));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    sum_lanes_kernel<scalar_t><<<blocks_per_item(channels * taps), kThreads, 0, stream>>>(
        scratch.const_data_ptr<acc_t>(), grad_weight.mutable_data_ptr<scalar_t>() + first * taps,
        channels * taps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

void depthwise_weight_grad_cuda(const Tensor& input, const Tensor& grad_output, IntArrayRef stride,
                                IntArrayRef padding, IntArrayRef dilation,
                                const Tensor& grad_weight) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_weight_grad", input,
                                             grad_weight, grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  if (grad_weight.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_weight_grad", [&] {
        if (call.channels_last) {
          weight_grad_nhwc<scalar_t>(input, grad_output, s, grad_weight, stream);
          return;
        }
        with_index_type(std::max(input.numel(), grad_output.numel()), [&](auto tag) {
          using index_t = decltype(tag);
          weight_grad_kernel<scalar_t, index_t>
              <<<blocks_per_item(grad_weight.numel()), kThreads, 0, stream>>>(
                  input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
                  grad_weight.mutable_data_ptr<scalar_t>(),
                  DepthwiseDims<index_t>(s, /*channels_last=*/false));
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
