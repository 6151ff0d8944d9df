// The launch sequences of the CUDA depthwise kernels, written once over a Launcher (launch.h):
// depthwise_cuda.cu runs them on the GPU, the CPU harness on the CPU. One input channel per
// group, channel multiplier m = Cout / C (depthwise_thread.h):
// forward:     one thread per output element, summing its taps in (ki, kj) order.
// input grad:  a gather, one thread per input element, summing in (o, ki, kj) order what the
//              forward took from it; no atomics.
//              Both with the kernel's size at compile time for 3x3, 5x5 and 7x7 (the *Unrolled
//              functors of depthwise_thread.h).
// weight grad: lane t of weight entry (o, ki, kj) sums the positions j with j % 256 == t, then
//              a fixed tree sums the lanes. No atomics. In NCHW a lane sum per entry (a block per
//              entry, a lane per thread); in NHWC a thread per (channel, tap, lane), adjacent
//              channels in adjacent threads (coalesced loads), into a scratch buffer slice by
//              slice of channels, then a lane sum per entry of the slice.
// So every result is bitwise the same on every run, and the same as the CPU's, in either layout.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <type_traits>

#include "../checks.h"
#include "../env_choice.h"
#include "depthwise_thread.h"
#include "launch.h"

namespace torch_convbp {

// run(size), size a std::integral_constant<int, K>: the kernel size the kernels are compiled for.
// K for K x K kernels with K = 3, 5 or 7, whose tap loops then unroll (the *Unrolled functors and
// the channel lanes of depthwise_thread.h); 0 for other kernels (the unrolled element functors
// with sizes at run time, the weight gradient a tap at a time). -1 under
// TORCH_CONVBP_CUDA_DEPTHWISE=elements: the plain element kernels (DepthwiseOutput,
// DepthwiseInputGrad) and the weight gradient a tap at a time, for side-by-side measurement. All
// give the same bits.
template <class Run>
void with_compiled_size(const ConvShape& s, Run&& run) {
  if (env_choice("TORCH_CONVBP_CUDA_DEPTHWISE", {"unrolled", "elements"}) == "elements") {
    return run(std::integral_constant<int, -1>{});
  }
  const bool square = s.kernel_h == s.kernel_w;
  if (square && s.kernel_h == 3) return run(std::integral_constant<int, 3>{});
  if (square && s.kernel_h == 5) return run(std::integral_constant<int, 5>{});
  if (square && s.kernel_h == 7) return run(std::integral_constant<int, 7>{});
  run(std::integral_constant<int, 0>{});
}

template <class Launcher>
void launch_depthwise_forward(Launcher& launcher, const char* op, const at::Tensor& input,
                              const at::Tensor& weight, IntArrayRef stride, IntArrayRef padding,
                              IntArrayRef dilation, const at::Tensor& output) {
  const DepthwiseCall call = check_depthwise(op, input, weight, output, stride, padding, dilation);
  const int64_t total = output.numel();
  if (total == 0) return;
  launcher.use_device(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
        launcher.with_index(std::max(total, input.numel()), [&](auto tag) {
          using index_t = decltype(tag);
          const DepthwiseElementDims<index_t> dims(call.shape, call.channels_last,
                                                   /*output_grid=*/true);
          with_compiled_size(call.shape, [&](auto size) {
            constexpr int K = decltype(size)::value;
            using Element = std::conditional_t<(K < 0), DepthwiseOutput,
                                               DepthwiseOutputUnrolled<std::max(K, 0)>>;
            using Thread = ElementThread<Element, scalar_t, DepthwiseElementDims<index_t>, index_t>;
            launcher.template grid<index_t>(
                total, Thread{input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                              output.mutable_data_ptr<scalar_t>(), dims});
          });
        });
      });
}

template <class Launcher>
void launch_depthwise_input_grad(Launcher& launcher, const char* op, const at::Tensor& grad_output,
                                 const at::Tensor& weight, IntArrayRef stride, IntArrayRef padding,
                                 IntArrayRef dilation, const at::Tensor& grad_input) {
  const DepthwiseCall call =
      check_depthwise(op, grad_input, weight, grad_output, stride, padding, dilation);
  const int64_t total = grad_input.numel();
  if (total == 0) return;
  launcher.use_device(grad_output.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
        launcher.with_index(std::max(total, grad_output.numel()), [&](auto tag) {
          using index_t = decltype(tag);
          const DepthwiseElementDims<index_t> dims(call.shape, call.channels_last,
                                                   /*output_grid=*/false);
          with_compiled_size(call.shape, [&](auto size) {
            constexpr int K = decltype(size)::value;
            using Element = std::conditional_t<(K < 0), DepthwiseInputGrad,
                                               DepthwiseInputGradUnrolled<std::max(K, 0)>>;
            using Thread = ElementThread<Element, scalar_t, DepthwiseElementDims<index_t>, index_t>;
            launcher.template grid<index_t>(
                total,
                Thread{grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                       grad_input.mutable_data_ptr<scalar_t>(), dims});
          });
        });
      });
}

// The weight gradient through a scratch buffer, slice by slice of output channels: `Thread`s
// (threads_per_channel of them per channel of the slice: SliceLaneThread, a thread per tap and
// lane, or SliceChannelLanesThread, a thread per lane) write the lanes into scratch
// [channels * taps, kSumLanes] (opmath), then each entry's tree sum goes into grad_weight.
template <typename Thread, typename scalar_t, typename index_t, class Launcher>
void depthwise_weight_grad_in_slices(Launcher& launcher, const at::Tensor& input,
                                     const at::Tensor& grad_output,
                                     const DepthwiseDims<index_t>& dims,
                                     const at::Tensor& grad_weight, int64_t threads_per_channel) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t out_channels = dims.out_channels, taps = dims.kernel_h * dims.kernel_w;
  const int64_t slice = std::min(lane_slice_channels(taps), out_channels);
  const at::Tensor scratch = at::empty(
      {slice * taps * kSumLanes}, input.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  for (int64_t first = 0; first < out_channels; first += slice) {
    const int64_t channels = std::min(slice, out_channels - first);
    launcher.template grid<index_t>(
        channels * threads_per_channel,
        Thread{input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
               scratch.mutable_data_ptr<acc_t>(), dims, static_cast<index_t>(first),
               static_cast<index_t>(channels)});
    launcher.template lane_sums<index_t>(
        channels * taps, ScratchLane<acc_t, index_t>{scratch.const_data_ptr<acc_t>()},
        WriteRounded<scalar_t, index_t>{grad_weight.mutable_data_ptr<scalar_t>() + first * taps});
  }
}

// The weight gradient's kernels for kernels compiled for size K (with_compiled_size).
template <int K, typename scalar_t, typename index_t, class Launcher>
void depthwise_weight_grad_kernels(Launcher& launcher, const at::Tensor& input,
                                   const at::Tensor& grad_output,
                                   const DepthwiseDims<index_t>& dims,
                                   const at::Tensor& grad_weight) {
  if constexpr (K > 0) {  // all of a channel's taps in one thread per lane
    depthwise_weight_grad_in_slices<SliceChannelLanesThread<K, scalar_t, index_t>, scalar_t>(
        launcher, input, grad_output, dims, grad_weight, kSumLanes);
  } else if (dims.channels_last) {  // a thread per (channel, tap, lane)
    depthwise_weight_grad_in_slices<SliceLaneThread<scalar_t, index_t>, scalar_t>(
        launcher, input, grad_output, dims, grad_weight,
        int64_t{dims.kernel_h} * dims.kernel_w * kSumLanes);
  } else {  // a lane sum per entry
    launcher.template lane_sums<index_t>(
        grad_weight.numel(),
        DepthwiseWeightGradLane<scalar_t, index_t>{input.const_data_ptr<scalar_t>(),
                                                   grad_output.const_data_ptr<scalar_t>(), dims},
        WriteRounded<scalar_t, index_t>{grad_weight.mutable_data_ptr<scalar_t>()});
  }
}

template <class Launcher>
void launch_depthwise_weight_grad(Launcher& launcher, const char* op, const at::Tensor& input,
                                  const at::Tensor& grad_output, IntArrayRef stride,
                                  IntArrayRef padding, IntArrayRef dilation,
                                  const at::Tensor& grad_weight) {
  const DepthwiseCall call =
      check_depthwise(op, input, grad_weight, grad_output, stride, padding, dilation);
  if (grad_weight.numel() == 0) return;
  launcher.use_device(input.device());
  const int64_t taps = call.shape.kernel_h * call.shape.kernel_w;
  const int64_t lanes = lane_slice_channels(taps) * taps * kSumLanes;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_weight_grad", [&] {
        launcher.with_index(std::max({input.numel(), grad_output.numel(), lanes}), [&](auto tag) {
          using index_t = decltype(tag);
          const DepthwiseDims<index_t> dims(call.shape, call.channels_last);
          with_compiled_size(call.shape, [&](auto size) {
            depthwise_weight_grad_kernels<decltype(size)::value, scalar_t>(
                launcher, input, grad_output, dims, grad_weight);
          });
        });
      });
}

}  // namespace torch_convbp
