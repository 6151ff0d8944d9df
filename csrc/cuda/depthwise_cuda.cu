// The CUDA kernels of the depthwise special case: one input channel per group, with channel
// multiplier m = Cout / C, so output channel o reads input channel o / m.
//
// forward:     one thread per output element, summing its taps in (ki, kj) order.
// input grad:  a gather, one thread per input element, summing in (o, ki, kj) order what the
//              forward took from it; no atomics.
// weight grad: one block per weight entry (o, ki, kj); each thread sums a fixed stride of the
//              (image, oh, ow) positions, then a fixed tree sums the threads. No atomics.
// So every result is bitwise the same on every run. Sums are taken in opmath (float for half
// types). Index arithmetic is 32-bit where every index fits, 64-bit otherwise.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "../conv2d.h"
#include "launch.cuh"

namespace torch_convbp {
namespace {

// ConvShape in the kernel's index type.
template <typename index_t>
struct Shape {
  index_t batch, channels, height, width, out_channels, multiplier, kernel_h, kernel_w, stride_h,
      stride_w, pad_h, pad_w, dilation_h, dilation_w, out_height, out_width;
  explicit Shape(const ConvShape& s)
      : batch(s.batch), channels(s.in_channels), height(s.height), width(s.width),
        out_channels(s.out_channels), multiplier(s.out_channels / s.in_channels),
        kernel_h(s.kernel_h), kernel_w(s.kernel_w), stride_h(s.stride_h), stride_w(s.stride_w),
        pad_h(s.pad_h), pad_w(s.pad_w), dilation_h(s.dilation_h), dilation_w(s.dilation_w),
        out_height(s.out_height), out_width(s.out_width) {}
};

template <typename scalar_t, typename index_t>
__global__ void forward_kernel(const scalar_t* __restrict__ input,
                               const scalar_t* __restrict__ weight,
                               scalar_t* __restrict__ output, Shape<index_t> s, index_t total) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t step = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    // i = ((n * out_channels + o) * out_height + oh) * out_width + ow
    const index_t ow = i % s.out_width;
    const index_t oh = i / s.out_width % s.out_height;
    const index_t plane = i / (s.out_width * s.out_height);
    const index_t o = plane % s.out_channels, n = plane / s.out_channels;
    const scalar_t* x = input + (n * s.channels + o / s.multiplier) * s.height * s.width;
    const scalar_t* w = weight + o * s.kernel_h * s.kernel_w;
    acc_t sum = 0;
    for (index_t ki = 0; ki < s.kernel_h; ++ki) {
      const index_t ih = oh * s.stride_h - s.pad_h + ki * s.dilation_h;
      if (ih < 0 || ih >= s.height) continue;
      for (index_t kj = 0; kj < s.kernel_w; ++kj) {
        const index_t iw = ow * s.stride_w - s.pad_w + kj * s.dilation_w;
        if (iw < 0 || iw >= s.width) continue;
        sum += static_cast<acc_t>(w[ki * s.kernel_w + kj]) *
               static_cast<acc_t>(x[ih * s.width + iw]);
      }
    }
    output[i] = static_cast<scalar_t>(sum);
  }
}

template <typename scalar_t, typename index_t>
__global__ void input_grad_kernel(const scalar_t* __restrict__ grad_output,
                                  const scalar_t* __restrict__ weight,
                                  scalar_t* __restrict__ grad_input, Shape<index_t> s,
                                  index_t total) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t step = static_cast<index_t>(gridDim.x) * blockDim.x;
  const index_t out_plane = s.out_height * s.out_width;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    // i = ((n * channels + c) * height + ih) * width + iw
    const index_t iw = i % s.width;
    const index_t ih = i / s.width % s.height;
    const index_t plane = i / (s.width * s.height);
    const index_t c = plane % s.channels, n = plane / s.channels;
    acc_t sum = 0;
    for (index_t o = c * s.multiplier; o < (c + 1) * s.multiplier; ++o) {
      const scalar_t* dy = grad_output + (n * s.out_channels + o) * out_plane;
      const scalar_t* w = weight + o * s.kernel_h * s.kernel_w;
      for (index_t ki = 0; ki < s.kernel_h; ++ki) {
        const index_t oh_scaled = ih + s.pad_h - ki * s.dilation_h;  // = oh * stride_h
        if (oh_scaled < 0 || oh_scaled % s.stride_h != 0) continue;
        const index_t oh = oh_scaled / s.stride_h;
        if (oh >= s.out_height) continue;
        for (index_t kj = 0; kj < s.kernel_w; ++kj) {
          const index_t ow_scaled = iw + s.pad_w - kj * s.dilation_w;
          if (ow_scaled < 0 || ow_scaled % s.stride_w != 0) continue;
          const index_t ow = ow_scaled / s.stride_w;
          if (ow >= s.out_width) continue;
          sum += static_cast<acc_t>(w[ki * s.kernel_w + kj]) *
                 static_cast<acc_t>(dy[oh * s.out_width + ow]);
        }
      }
    }
    grad_input[i] = static_cast<scalar_t>(sum);
  }
}

template <typename scalar_t, typename index_t>
__global__ void weight_grad_kernel(const scalar_t* __restrict__ input,
                                   const scalar_t* __restrict__ grad_output,
                                   scalar_t* __restrict__ grad_weight, Shape<index_t> s) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t partial[kThreads];
  const index_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const index_t positions = s.batch * out_plane;
  for (index_t entry = blockIdx.x; entry < s.out_channels * taps; entry += gridDim.x) {
    const index_t o = entry / taps, ki = entry % taps / s.kernel_w, kj = entry % s.kernel_w;
    const index_t c = o / s.multiplier;
    acc_t sum = 0;
    for (index_t j = threadIdx.x; j < positions; j += blockDim.x) {
      // j = (n * out_height + oh) * out_width + ow
      const index_t ow = j % s.out_width, oh = j / s.out_width % s.out_height;
      const index_t n = j / out_plane;
      const index_t ih = oh * s.stride_h - s.pad_h + ki * s.dilation_h;
      const index_t iw = ow * s.stride_w - s.pad_w + kj * s.dilation_w;
      if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) continue;
      sum += static_cast<acc_t>(grad_output[(n * s.out_channels + o) * out_plane + oh * s.out_width + ow]) *
             static_cast<acc_t>(input[((n * s.channels + c) * s.height + ih) * s.width + iw]);
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {  // a fixed tree: deterministic
      if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) grad_weight[entry] = static_cast<scalar_t>(partial[0]);
    __syncthreads();  // partial is reused by the next entry
  }
}

// Runs launch(index_t tag) with 32-bit indices when every index of the call fits, else 64-bit.
template <typename Launch>
void with_index_type(int64_t largest, Launch&& launch) {
  if (fits_int32(largest)) {
    launch(int32_t{0});
  } else {
    launch(int64_t{0});
  }
}

void depthwise_conv2d_cuda(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                           IntArrayRef padding, IntArrayRef dilation, const Tensor& output) {
  const ConvShape s = check_depthwise("torch_convbp.depthwise_conv2d", input, weight, output,
                                      stride, padding, dilation);
  const int64_t total = output.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
    with_index_type(std::max(total, input.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      forward_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
          output.mutable_data_ptr<scalar_t>(), Shape<index_t>(s), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void depthwise_input_grad_cuda(const Tensor& grad_output, const Tensor& weight,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               const Tensor& grad_input) {
  const ConvShape s = check_depthwise("torch_convbp.depthwise_input_grad", grad_input, weight,
                                      grad_output, stride, padding, dilation);
  const int64_t total = grad_input.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
    with_index_type(std::max(total, grad_output.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      input_grad_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
          grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
          grad_input.mutable_data_ptr<scalar_t>(), Shape<index_t>(s), static_cast<index_t>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void depthwise_weight_grad_cuda(const Tensor& input, const Tensor& grad_output,
                                IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                const Tensor& grad_weight) {
  const ConvShape s = check_depthwise("torch_convbp.depthwise_weight_grad", input, grad_weight,
                                      grad_output, stride, padding, dilation);
  if (grad_weight.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int blocks = static_cast<int>(std::min<int64_t>(grad_weight.numel(), kMaxBlocks));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_weight_grad", [&] {
    with_index_type(std::max(input.numel(), grad_output.numel()), [&](auto tag) {
      using index_t = decltype(tag);
      weight_grad_kernel<scalar_t, index_t><<<blocks, kThreads, 0, stream>>>(
          input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
          grad_weight.mutable_data_ptr<scalar_t>(), Shape<index_t>(s));
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
