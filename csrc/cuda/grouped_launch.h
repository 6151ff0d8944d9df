// The launch sequences of the CUDA kernels of narrow groups (NHWC activations), written once over
// a Launcher (launch.h): grouped_cuda.cu runs them on the GPU, the CPU harness on the CPU.
// - The forward: one thread per output element, summing its taps in (ki, kj) order and the
//   group's input channels within each tap. Adjacent threads take adjacent output channels of one
//   pixel, so a warp reads the same input pixel (a broadcast) and writes adjacent memory.
// - The weight gradient: one thread per (image, entry) sums the image's share of the entry, then
//   one per entry adds the images' shares in order, pass by pass (a pass's shares fill a buffer
//   of at most kImagePartialElements); the last pass writes the weight gradient.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

#include "../checks.h"
#include "grouped_thread.h"
#include "launch.h"

namespace torch_convbp {

template <class Launcher>
void launch_grouped_forward(Launcher& launcher, const char* op, const at::Tensor& input,
                            const at::Tensor& weight, IntArrayRef stride, IntArrayRef padding,
                            IntArrayRef dilation, int64_t groups, const at::Tensor& output) {
  const ConvShape s = check_grouped(op, input, weight, output, stride, padding, dilation, groups);
  const int64_t total = output.numel();
  if (total == 0) return;
  launcher.use_device(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_conv2d", [&] {
        launcher.with_index(std::max({total, input.numel(), weight.numel()}), [&](auto tag) {
          using index_t = decltype(tag);
          launcher.template grid<index_t>(
              total, ElementThread<GroupedOutput, scalar_t, GroupedDims<index_t>, index_t>{
                         input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                         output.mutable_data_ptr<scalar_t>(), GroupedDims<index_t>(s)});
        });
      });
}

template <class Launcher>
void launch_grouped_weight_grad(Launcher& launcher, const char* op, const at::Tensor& input,
                                const at::Tensor& grad_output, IntArrayRef stride,
                                IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                                const at::Tensor& grad_weight) {
  const ConvShape s =
      check_grouped(op, input, grad_weight, grad_output, stride, padding, dilation, groups);
  const int64_t entries = grad_weight.numel();
  if (entries == 0) return;
  if (s.batch == 0) {
    grad_weight.zero_();
    return;
  }
  launcher.use_device(input.device());
  const int64_t pass = images_per_pass(entries, s.batch);
  const auto acc = input.options().dtype(at::toOpMathType(input.scalar_type()));
  const at::Tensor totals = at::zeros({entries}, acc);
  const at::Tensor partials = at::empty({pass * entries}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_weight_grad", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launcher.with_index(
            std::max({partials.numel(), input.numel(), grad_output.numel()}), [&](auto tag) {
              using index_t = decltype(tag);
              const GroupedDims<index_t> dims(s);
              for (int64_t first = 0; first < s.batch; first += pass) {
                const int64_t images = std::min(pass, s.batch - first);
                launcher.template grid<index_t>(
                    images * entries,
                    ImagePartialThread<scalar_t, index_t>{
                        input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
                        partials.mutable_data_ptr<acc_t>(), dims, static_cast<index_t>(first),
                        static_cast<index_t>(entries)});
                scalar_t* out =
                    first + images == s.batch ? grad_weight.mutable_data_ptr<scalar_t>() : nullptr;
                launcher.template grid<index_t>(
                    entries,
                    AddPartialsThread<scalar_t, index_t>{
                        totals.mutable_data_ptr<acc_t>(), partials.const_data_ptr<acc_t>(), out,
                        dims, static_cast<index_t>(images), static_cast<index_t>(entries)});
              }
            });
      });
}

}  // namespace torch_convbp
