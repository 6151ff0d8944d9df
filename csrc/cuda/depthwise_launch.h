// The launch sequences of the CUDA depthwise kernels, written once over a Launcher (launch.h):
// depthwise_cuda.cu runs them on the GPU, the CPU harness on the CPU. One input channel per
// group, channel multiplier m = Cout / C (depthwise_thread.h):
// forward:     each output element the sum of its taps in (ki, kj) order; a thread per strip of
//              rows of one column.
// input grad:  a gather, each input element the sum in (o, ki, kj) order of what the forward took
//              from it; a thread per strip of rows of one column; no atomics.
// weight grad: lane t of weight entry (o, ki, kj) sums the positions j with j % 256 == t, then
//              a fixed tree sums the lanes. No atomics. For 3x3, 5x5 and 7x7 kernels a thread per
//              (channel, kernel row, lane), for others in NHWC a thread per (channel, tap, lane),
//              into a scratch buffer slice by slice of channels, then a lane sum per entry of the
//              slice; for others in NCHW a lane sum per entry (a block per entry).
// So every result is bitwise the same on every run, and the same as the CPU's, in either layout.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../checks.h"
#include "depthwise_thread.h"
#include "launch.h"

namespace torch_convbp {

// run(size), size a std::integral_constant<int, K>: the kernel size the kernels are compiled for.
// K for K x K kernels with K = 3, 5 or 7, whose tap loops then unroll; 0 for other kernels (the
// strips with sizes at run time, the weight gradient a tap per thread). float64 (gradcheck's
// dtype) and 64-bit indices (tensors past 2^31 elements) take sizes at run time: each compiled
// size is 3 more kernels per dtype and index type, and nvcc's time on 2 cores is CI's.
template <typename scalar_t, typename index_t, class Run>
void with_compiled_size(const ConvShape& s, Run&& run) {
  if constexpr (std::is_same_v<index_t, int32_t> && !std::is_same_v<scalar_t, double>) {
    const bool square = s.kernel_h == s.kernel_w;
    if (square && s.kernel_h == 3) return run(std::integral_constant<int, 3>{});
    if (square && s.kernel_h == 5) return run(std::integral_constant<int, 5>{});
    if (square && s.kernel_h == 7) return run(std::integral_constant<int, 7>{});
  }
  run(std::integral_constant<int, 0>{});
}

// The forward's or input gradient's kernel (Strip: DepthwiseOutputStrip or
// DepthwiseInputGradStrip) over `total` results, of `height` rows each: a thread per strip.
template <template <int, typename, typename> class Strip, typename scalar_t, typename index_t,
          class Launcher>
void depthwise_strip_kernel(Launcher& launcher, const LayoutCall& call, const scalar_t* source,
                            const scalar_t* weight, scalar_t* result, bool output_grid,
                            int64_t total, int64_t height) {
  const DepthwiseStripDims<index_t> dims(call.shape, call.channels_last, output_grid);
  with_compiled_size<scalar_t, index_t>(call.shape, [&](auto size) {
    launcher.template grid<index_t>(
        total / height * strips_of(height, kStripRows),
        Strip<decltype(size)::value, scalar_t, index_t>{source, weight, result, dims});
  });
}

template <class Launcher>
void launch_depthwise_forward(Launcher& launcher, const char* op, const at::Tensor& input,
                              const at::Tensor& weight, IntArrayRef stride, IntArrayRef padding,
                              IntArrayRef dilation, const at::Tensor& output) {
  const LayoutCall call = check_depthwise(op, input, weight, output, stride, padding, dilation);
  const int64_t total = output.numel();
  if (total == 0) return;
  launcher.use_device(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
        launcher.with_index(std::max(total, input.numel()), [&](auto tag) {
          depthwise_strip_kernel<DepthwiseOutputStrip, scalar_t, decltype(tag)>(
              launcher, call, input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
              output.mutable_data_ptr<scalar_t>(), /*output_grid=*/true, total,
              call.shape.out_height);
        });
      });
}

template <class Launcher>
void launch_depthwise_input_grad(Launcher& launcher, const char* op, const at::Tensor& grad_output,
                                 const at::Tensor& weight, IntArrayRef stride, IntArrayRef padding,
                                 IntArrayRef dilation, const at::Tensor& grad_input) {
  const LayoutCall call =
      check_depthwise(op, grad_input, weight, grad_output, stride, padding, dilation);
  const int64_t total = grad_input.numel();
  if (total == 0) return;
  launcher.use_device(grad_output.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
        launcher.with_index(std::max(total, grad_output.numel()), [&](auto tag) {
          depthwise_strip_kernel<DepthwiseInputGradStrip, scalar_t, decltype(tag)>(
              launcher, call, grad_output.const_data_ptr<scalar_t>(),
              weight.const_data_ptr<scalar_t>(), grad_input.mutable_data_ptr<scalar_t>(),
              /*output_grid=*/false, total, call.shape.height);
        });
      });
}

// The weight gradient through a scratch buffer, slice by slice of output channels: `Thread`s
// (threads_per_channel of them per channel of the slice: SliceLaneThread, a thread per tap and
// lane, or SliceRowLanesThread, a thread per kernel row and lane) write the lanes into scratch
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
  if constexpr (K > 0) {  // a thread per (channel, kernel row, lane)
    depthwise_weight_grad_in_slices<SliceRowLanesThread<K, scalar_t, index_t>, scalar_t>(
        launcher, input, grad_output, dims, grad_weight, int64_t{K} * kSumLanes);
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
  const LayoutCall call =
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
          with_compiled_size<scalar_t, index_t>(call.shape, [&](auto size) {
            depthwise_weight_grad_kernels<decltype(size)::value, scalar_t>(
                launcher, input, grad_output, dims, grad_weight);
          });
        });
      });
}

}  // namespace torch_convbp
