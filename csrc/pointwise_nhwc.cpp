// Route pointwise_nhwc: the pointwise convolution of channels_last operands, as three GEMMs
// over the whole batch.
//
// A dense channels_last [N, C, H, W] tensor is, in memory, the row-major matrix [P, C] of its
// P = N*H*W pixels, and a 1x1 weight [Cout, C, 1, 1] is the matrix W [Cout, C]. So
//   forward       Y  [P, Cout] = X    [P, C]    @ W^T [C, Cout]
//   grad-input    dX [P, C]    = dY   [P, Cout] @ W   [Cout, C]
//   grad-weight   dW [Cout, C] = dY^T [Cout, P] @ X   [P, C]
// with every operand a view: no im2col, no staging, no layout copy, no workspace. Each GEMM is
// cut into blocks fixed by the sizes (gemm.h), so the bits do not depend on the thread count; the
// weight gradient's, whose result is small, along the pixels where that result is narrow. The
// forward's and the input gradient's float32 GEMMs run on the micro-kernel wherever the CPU runs
// AVX-512 kernels (gemm_choice.h, Float32Gemms); the weight gradient's follow the CPU's rule.
#include "pointwise_nhwc.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "gemm.h"

namespace torch_convbp {
namespace {

// A dense channels_last [N, C, H, W] tensor as its pixel matrix [1, N*H*W, C] (the leading 1 is
// the group dimension of gemm.h's [G, M, N] operands). A view: the permuted tensor is contiguous.
Tensor pixel_matrix(const Tensor& t) {
  return t.permute({0, 2, 3, 1}).view({1, t.size(0) * t.size(2) * t.size(3), t.size(1)});
}

// The weight [Cout, C, 1, 1] as the matrix [1, Cout, C] (a view in either memory format: a 1x1
// kernel's two formats have the same memory order).
Tensor weight_matrix(const Tensor& weight, const ConvShape& s) {
  return weight.contiguous().view({1, s.out_channels, s.in_channels});
}

int64_t gemm_blocks_for(const Tensor& result) {
  return gemm_blocks(/*units=*/1, result.sizes(), result.device());
}

}  // namespace

void pointwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s,
                            const Tensor& output) {
  const Tensor y = pixel_matrix(output);
  // [1, P, Cout] = [1, P, C] @ [1, C, Cout]
  gemm_out(y, pixel_matrix(input), weight_matrix(weight, s).transpose(1, 2), gemm_blocks_for(y),
           Float32Gemms::microkernel_on_avx512);
}

void pointwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                               const Tensor& grad_input) {
  const Tensor dx = pixel_matrix(grad_input);
  // [1, P, C] = [1, P, Cout] @ [1, Cout, C]
  gemm_out(dx, pixel_matrix(grad_output), weight_matrix(weight, s), gemm_blocks_for(dx),
           Float32Gemms::microkernel_on_avx512);
}

Tensor pointwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output,
                                  IntArrayRef weight_size, const ConvShape& s) {
  Tensor grad_weight = at::empty(weight_size, input.options());
  const Tensor dw = grad_weight.view({1, s.out_channels, s.in_channels});
  // [1, Cout, C] = [1, Cout, P] @ [1, P, C]. Taller than wide, this product took 1.1-2.0x MKL's
  // time on the micro-kernel on an AVX2 Zen 3, narrow as it is (benchmarks/NOTES.md, section 124).
  const Float32Gemms engine =
      s.out_channels > s.in_channels ? Float32Gemms::cpu_rule_not_by_width : Float32Gemms::cpu_rule;
  gemm_out_contracting(dw, pixel_matrix(grad_output).transpose(1, 2), pixel_matrix(input), engine);
  return grad_weight;
}

}  // namespace torch_convbp
