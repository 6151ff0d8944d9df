// A prototype, built only with TORCH_CONVBP_CUTLASS=1 (setup.py): one implicit-GEMM convolution
// of CUTLASS (https://github.com/NVIDIA/cutlass, the headers of the nvidia-cutlass wheel), the
// forward of a bfloat16 channels_last convolution on tensor cores, to measure on a GPU against
// our column route and cuDNN before an implicit-GEMM route is adopted or refused
// (benchmarks/NOTES.md, section 33). Not in the route table: only its own operator calls it.
//
// The implicit GEMM is the column route's GEMM, Y [N*OH*OW, Cout] = col [N*OH*OW, kh*kw*Cin] @
// W^T [kh*kw*Cin, Cout] in NHWC, with the column matrix never written: each threadblock loads
// its tiles of col straight from the input (im2col fused into the GEMM's operand loads).
// Float32 accumulation, no split-K: each output is one threadblock's sum, in a fixed order.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <utility>

#include "../../checks.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

namespace torch_convbp {
namespace {

using Element = cutlass::bfloat16_t;
using Nhwc = cutlass::layout::TensorNHWC;
// 128-bit loads: 8 bfloat16 channels at a time, so Cin and Cout must be multiples of 8.
constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;
// y = 1 * (x conv w) + 0 * y, computed in float32, stored in bfloat16.
using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kAlignment, float, float>;
// Tiles of 128 output pixels x 128 channels x 32 of K per threadblock, 4 warps of 64 x 64,
// mma.sync 16x8x16 (sm_80's instruction, which sm_90 runs too), a 3-stage pipeline, and the
// "optimized" iterators (precomputed offsets; any stride).
using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
    Element, Nhwc, Element, Nhwc, Element, Nhwc, float, cutlass::arch::OpClassTensorOp,
    cutlass::arch::Sm80, cutlass::gemm::GemmShape<128, 128, 32>,
    cutlass::gemm::GemmShape<64, 64, 32>, cutlass::gemm::GemmShape<16, 8, 16>, Epilogue,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, 3, cutlass::arch::OpMultiplyAdd,
    cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided>::Kernel;
using ImplicitGemmFprop = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

constexpr const char* kOp = "torch_convbp.cutlass_fprop_bf16";

int as_int(int64_t value, const char* what) {
  TORCH_CHECK(value <= std::numeric_limits<int>::max(), kOp, ": ", what, " (", value,
              ") is over CUTLASS's 32-bit sizes");
  return static_cast<int>(value);
}

Element* elements(const at::Tensor& t) { return reinterpret_cast<Element*>(t.data_ptr()); }

at::Tensor cutlass_fprop_bf16(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                              IntArrayRef padding, IntArrayRef dilation) {
  check_operands(kOp, {{"input", &input}, {"weight", &weight}});
  const ConvShape s = check_conv2d(kOp, input.sizes(), weight.sizes(), stride, padding, dilation,
                                   /*groups=*/1);
  TORCH_CHECK(input.scalar_type() == at::kBFloat16, kOp, ": computes in bfloat16, got ",
              input.scalar_type());
  for (const auto& [name, t] : {std::pair{"input", &input}, std::pair{"weight", &weight}}) {
    TORCH_CHECK(t->is_contiguous(at::MemoryFormat::ChannelsLast), kOp, ": ", name,
                " must be dense channels_last (NHWC in memory)");
  }
  TORCH_CHECK(s.in_channels % kAlignment == 0 && s.out_channels % kAlignment == 0, kOp,
              ": input and output channels must be multiples of ", kAlignment,
              " (128-bit loads), got ", s.in_channels, " and ", s.out_channels);
  // CUTLASS's names: input [n, h, w, c], weight [k, kh, kw, c], output [n, oh, ow, k]
  const int n = as_int(s.batch, "batch"), h = as_int(s.height, "height"),
            w = as_int(s.width, "width"), c = as_int(s.in_channels, "channels"),
            k = as_int(s.out_channels, "output channels"), kh = as_int(s.kernel_h, "kernel"),
            kw = as_int(s.kernel_w, "kernel"), oh = as_int(s.out_height, "output height"),
            ow = as_int(s.out_width, "output width");
  as_int(input.numel(), "the input's elements");
  as_int(s.batch * s.out_channels * s.out_height * s.out_width, "the output's elements");

  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor output = at::empty({s.batch, s.out_channels, s.out_height, s.out_width},
                                input.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (output.numel() == 0) return output;
  const cutlass::conv::Conv2dProblemSize problem(
      {n, h, w, c}, {k, kh, kw, c},
      {as_int(s.pad_h, "padding"), as_int(s.pad_h, "padding"), as_int(s.pad_w, "padding"),
       as_int(s.pad_w, "padding")},
      {as_int(s.stride_h, "stride"), as_int(s.stride_w, "stride")},
      {as_int(s.dilation_h, "dilation"), as_int(s.dilation_w, "dilation")}, {n, oh, ow, k},
      cutlass::conv::Mode::kCrossCorrelation, /*split_k_slices=*/1);
  const typename ImplicitGemmFprop::Arguments arguments(
      problem, {elements(input), Nhwc::packed({n, h, w, c})},
      {elements(weight), Nhwc::packed({k, kh, kw, c})},
      {elements(output), Nhwc::packed({n, oh, ow, k})},
      {elements(output), Nhwc::packed({n, oh, ow, k})}, {1.0f, 0.0f});
  ImplicitGemmFprop fprop;
  TORCH_CHECK(fprop.can_implement(arguments) == cutlass::Status::kSuccess, kOp,
              ": CUTLASS cannot compute this convolution");
  TORCH_CHECK(ImplicitGemmFprop::get_workspace_size(arguments) == 0, kOp,
              ": unexpected workspace (this configuration has no split-K)");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(fprop.initialize(arguments, nullptr, stream) == cutlass::Status::kSuccess, kOp,
              ": CUTLASS could not set up the kernel");
  TORCH_CHECK(fprop(stream) == cutlass::Status::kSuccess, kOp, ": the CUTLASS kernel failed");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return output;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torch_convbp, m) {
  m.def(
      "cutlass_fprop_bf16(Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation) -> Tensor");
}

TORCH_LIBRARY_IMPL(torch_convbp, CUDA, m) { m.impl("cutlass_fprop_bf16", &cutlass_fprop_bf16); }

}  // namespace torch_convbp
