// The CUDA kernels of the direct grouped convolution (narrow groups, NHWC activations), as
// grouped_thread.h writes their threads; the CPU harness checks them bitwise against the CPU
// kernels (cpu/grouped_nhwc_cpu.cpp, cpu/grouped_weight_grad_cpu.cpp).
// - The forward: one thread per output element, summing its taps in (ki, kj) order and the
//   group's input channels within each tap. Adjacent threads take adjacent output channels of one
//   pixel, so a warp reads the same input pixel (a broadcast) and writes adjacent memory.
// - The weight gradient: one thread per (image, entry) sums the image's share of the entry, then
//   one per entry adds the images' shares in order, pass by pass (a pass's shares fill a buffer
//   of at most kImagePartialElements); the last pass writes the weight gradient.
// Index arithmetic is 32-bit where every index fits, 64-bit otherwise.
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
                               const scalar_t* __restrict__ weight, scalar_t* __restrict__ output,
                               GroupedDims<index_t> s, index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x,
                            [&](index_t i) { output[i] = grouped_output(input, weight, s, i); });
}

template <typename scalar_t, typename index_t>
__global__ void weight_grad_partials_kernel(const scalar_t* __restrict__ input,
                                            const scalar_t* __restrict__ grad_output,
                                            at::opmath_type<scalar_t>* __restrict__ partials,
                                            GroupedDims<index_t> s, index_t first_image,
                                            index_t entries, index_t total) {
  grid_stride_loop<index_t>(total, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t t) {
    partials[t] = grouped_weight_grad_image(input, grad_output, s, first_image + t / entries,
                                            WeightEntry<index_t>(t % entries, s));
  });
}

// Adds a pass's partial sums to the totals; the last pass (grad_weight given) writes the weight
// gradient instead, rounded to scalar_t.
template <typename scalar_t, typename index_t>
__global__ void add_partials_kernel(at::opmath_type<scalar_t>* __restrict__ totals,
                                    const at::opmath_type<scalar_t>* __restrict__ partials,
                                    scalar_t* __restrict__ grad_weight, GroupedDims<index_t> s,
                                    index_t images, index_t entries) {
  grid_stride_loop<index_t>(entries, blockIdx.x, threadIdx.x, gridDim.x, [&](index_t e) {
    const auto total = add_image_partials(totals[e], partials, images, entries, e);
    if (grad_weight != nullptr) {
      grad_weight[WeightEntry<index_t>(e, s).in_weight(s)] = static_cast<scalar_t>(total);
    } else {
      totals[e] = total;
    }
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
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_conv2d", [&] {
        with_index_type(std::max({total, input.numel(), weight.numel()}), [&](auto tag) {
          using index_t = decltype(tag);
          grouped_kernel<scalar_t, index_t><<<blocks_for(total), kThreads, 0, stream>>>(
              input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
              output.mutable_data_ptr<scalar_t>(), GroupedDims<index_t>(s),
              static_cast<index_t>(total));
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

void grouped_weight_grad_cuda(const Tensor& input, const Tensor& grad_output, IntArrayRef stride,
                              IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                              const Tensor& grad_weight) {
  const ConvShape s = check_grouped("torch_convbp.grouped_weight_grad", input, grad_weight,
                                    grad_output, stride, padding, dilation, groups);
  const int64_t entries = grad_weight.numel();
  if (entries == 0) return;
  if (s.batch == 0) {
    grad_weight.zero_();
    return;
  }
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t pass = images_per_pass(entries, s.batch);
  const auto acc = input.options().dtype(at::toOpMathType(input.scalar_type()));
  const Tensor totals = at::zeros({entries}, acc);
  const Tensor partials = at::empty({pass * entries}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_weight_grad", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        with_index_type(
            std::max({partials.numel(), input.numel(), grad_output.numel()}), [&](auto tag) {
              using index_t = decltype(tag);
              const GroupedDims<index_t> dims(s);
              for (int64_t first = 0; first < s.batch; first += pass) {
                const int64_t images = std::min(pass, s.batch - first), work = images * entries;
                weight_grad_partials_kernel<scalar_t, index_t>
                    <<<blocks_for(work), kThreads, 0, stream>>>(
                        input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
                        partials.mutable_data_ptr<acc_t>(), dims, static_cast<index_t>(first),
                        static_cast<index_t>(entries), static_cast<index_t>(work));
                C10_CUDA_KERNEL_LAUNCH_CHECK();
                scalar_t* out =
                    first + images == s.batch ? grad_weight.mutable_data_ptr<scalar_t>() : nullptr;
                add_partials_kernel<scalar_t, index_t>
                    <<<blocks_for(entries), kThreads, 0, stream>>>(
                        totals.mutable_data_ptr<acc_t>(), partials.const_data_ptr<acc_t>(), out,
                        dims, static_cast<index_t>(images), static_cast<index_t>(entries));
                C10_CUDA_KERNEL_LAUNCH_CHECK();
              }
            });
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) {
  m.impl("grouped_conv2d", &grouped_conv2d_cuda);
  m.impl("grouped_weight_grad", &grouped_weight_grad_cuda);
}

}  // namespace torch_convbp
