// The implicit route's tap matrices (implicit_nhwc.h): the weight transposed into the
// micro-kernel's B matrices, tap by tap, in one pass.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstring>

#include "implicit_nhwc.h"
#include "microkernel.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// The B matrices [G, taps, K, N] of a channels_last weight, whose memory is [Cout][taps][C/G]: a
// tap's [Cout/G, C/G] matrix of each group has its rows taps * C/G apart. The forward's B_tap is
// that matrix transposed (the transposing copy, the taps of a group as its batch); the input
// gradient's, for tap taps-1-t, is that matrix itself (a copy of its rows). Read in place, where a
// contiguous copy of the weight first was one more pass over it on every call (benchmarks/NOTES.md,
// section 109).
void channels_last_tap_rows(const Tensor& weight, const ConvShape& s, bool input_grad,
                            const Tensor& rows) {
  const int64_t groups = s.groups, taps = s.taps();
  const int64_t a_size = s.out_channels / groups, b_size = s.in_channels / groups;
  // the weight's memory, [Cout, (kd,) kh, kw, C/G], as [G, A, taps, B]
  const Tensor memory = weight.movedim(1, -1).view({groups, a_size, taps, b_size});
  if (!input_grad) {  // rows[g] [taps, B, A] = the [taps, A, B] view of W_g, each tap transposed
    for (int64_t g = 0; g < groups; ++g) transpose_copy_cpu(memory[g].transpose(0, 1), rows[g]);
    return;
  }
  // rows[g, tap, a] [B] = W[g*A + a, :, taps-1-tap]: rows copied, the taps reversed
  const int64_t row_bytes = b_size * weight.element_size();
  const auto* from = static_cast<const char*>(memory.const_data_ptr());
  auto* to = static_cast<char*>(rows.mutable_data_ptr());
  at::parallel_for(0, groups * taps * a_size, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t a = i % a_size, tap = i / a_size % taps, g = i / (a_size * taps);
      std::memcpy(to + i * row_bytes, from + ((g * a_size + a) * taps + taps - 1 - tap) * row_bytes,
                  row_bytes);
    }
  });
}

}  // namespace

template <class T>
TapMatrices<T> tap_matrices(const Tensor& weight, const ConvShape& s, bool input_grad) {
  const int64_t groups = s.groups, taps = s.taps();
  const int64_t group_in = s.in_channels / groups, group_out = s.out_channels / groups;
  const int64_t k = input_grad ? group_out : group_in, n = input_grad ? group_in : group_out;
  const Tensor rows = at::empty({groups, taps, k, n}, weight.options());
  if (weight.is_contiguous()) {
    // [G, A, B, taps] = [G, Cout/G, C/G, taps] into [G, B, A, taps] views of rows: A and N the
    // same dimension in the forward, B and N in the input gradient
    const Tensor target = input_grad ? rows.permute({0, 3, 2, 1}) : rows.permute({0, 2, 3, 1});
    transpose_taps_cpu(weight.view({groups, group_out, group_in, taps}), target,
                       /*reverse_taps=*/input_grad);
  } else {
    channels_last_tap_rows(weight, s, input_grad, rows);
  }
  if constexpr (std::is_same_v<T, float>) {
    return {rows, taps * k * n, k * n, n};
  } else {
    const Tensor pairs = at::empty({groups, taps, k / 2, n * 2}, weight.options());
    const auto* from = reinterpret_cast<const uint16_t*>(rows.const_data_ptr<T>());
    auto* to = reinterpret_cast<uint16_t*>(pairs.mutable_data_ptr<T>());
    at::parallel_for(0, groups * taps * (k / 2), 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {  // pair i of rows 2i and 2i + 1 of [G * taps * K, N]
        interleave_pair_of_rows(from + 2 * i * n, from + (2 * i + 1) * n, n, to + i * n * 2);
      }
    });
    return {pairs, taps * k * n, k * n, n};
  }
}

template TapMatrices<float> tap_matrices<float>(const Tensor&, const ConvShape&, bool);
template TapMatrices<at::BFloat16> tap_matrices<at::BFloat16>(const Tensor&, const ConvShape&,
                                                              bool);

}  // namespace torch_convbp
