// The CUDA kernel of the direct grouped convolution (narrow groups, NHWC activations): one thread
// per output element, summing its taps in (ki, kj) order and the group's input channels within
// each tap, as grouped_thread.h writes it; the CPU harness checks it bitwise against the CPU
// kernel (cpu/grouped_nhwc_cpu.cpp). Adjacent threads take adjacent output channels of one pixel,
// so a warp reads the same input pixel (a broadcast) and writes adjacent memory. Index arithmetic
// is 32-bit where every index fits, 64-bit otherwise.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../conv2d.h"
#include "grouped_thread.h"
#include "launch.h"

namespace torch_convbp {
namespace {

template <typename scalar_t, typename index_t>
__global__ void grouped_kernel(const scalar_t* __restrict__ input,
                               const scalar_t* __restrict__ weight,
                               scalar_t* __restrict__ output, GroupedDims<index_t> s,
                               index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t i) {
    output[i] = grouped_output(input, weight, s, i);
  });
}

void grouped_conv2d_cuda(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                         IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                         const Tensor& output) {
  const ConvShape s = check_grouped("torch_convbp.grouped_conv2d", input, weight, output, stride,
                                    padding, dilation, groups);
  const int64_t total = output.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_conv2d", [&] {
    with_index_type(std::max({total, input.numel(), weight.numel()}), [&](auto tag) {
      using index_t = decltype(tag);
      grouped_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
          output.mutable_data_ptr<scalar_t>(), GroupedDims<index_t>(s), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) { m.impl("grouped_conv2d", &grouped_conv2d_cuda); }

}  // namespace torch_convbp
