// How the GEMMs run: their dtype, and the GEMM that runs them (gemm_choice.cpp).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <cstdint>

namespace torch_convbp {

// What a GEMM's result is: rounded once, as it is written (an output, or a float32 sum of a
// weight gradient), or summed again before that (the columns col2im adds up).
enum class GemmResult { rounded_once, summed_again };

// The dtype the GEMMs' operands are in for operands of `dtype` on `device`: the operands' own,
// except for float16 and bfloat16 on the CPU: bfloat16 where the micro-kernel computes it
// natively (its products summed in float32, each result rounded once), else float32 (the column
// matrices and staging are then float32, and each result is rounded once). For a result summed
// again, the dtype of that result, the columns: float32 on the CPU, whatever the operands' dtype
// (the strided input gradient multiplies bfloat16 operands into float32 columns where the
// micro-kernel computes bfloat16: conv2d.cpp, input_grad_by_col2im).
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device,
                          GemmResult result = GemmResult::rounded_once);

// What runs the GEMMs (gemm.cpp): ATen's GEMM (MKL on the CPU, cuBLAS on CUDA), or our driver
// on oneDNN's micro-kernel (microkernel_gemm.h).
enum class GemmEngine { aten, microkernel };

// A call site's word on its float32 CPU GEMMs:
// - cpu_rule: the CPU's rule (gemm_engine below);
// - microkernel_on_avx512: the micro-kernel wherever the CPU runs AVX-512 kernels: the
//   channels_last 1x1 forward and input gradient, [pixels, C] @ [C, Cout], which ran faster on it
//   than on MKL on an AVX-512 Xeon too, where the rule says MKL (benchmarks/NOTES.md, section 73);
// - cpu_rule_not_by_width: the CPU's rule without its narrow results on the micro-kernel (AMD CPUs
//   without AVX-512): products that ran slower there however narrow, on an AVX2 Zen 3 (section
//   124): the NCHW 1x1 products of a plane's pixels, W [Cout, C] @ X [C, H*W] on 7x7 and 14x14
//   planes, 1.1-1.66x MKL's time, and the channels_last 1x1 weight gradient taller than wide,
//   dY^T [Cout, P] @ X [P, C], 1.1-2.0x.
enum class Float32Gemms { cpu_rule, microkernel_on_avx512, cpu_rule_not_by_width };

// The engine of GEMMs in dtype `gemm_dtype` (as gemm_dtype() gives it) on `device`.
GemmEngine gemm_engine(at::ScalarType gemm_dtype, const at::Device& device,
                       Float32Gemms float32 = Float32Gemms::cpu_rule);
// The engine of one such GEMM, whose result is rows x cols: as above, except that float32
// results under 16 on a side stay on ATen's GEMM, and that on a CPU that prefers the micro-kernel
// for narrow results only (cpu_features.h) float32 results of at most 256 columns run on it.
GemmEngine gemm_engine(at::ScalarType gemm_dtype, const at::Device& device, int64_t rows,
                       int64_t cols, Float32Gemms float32 = Float32Gemms::cpu_rule);
const char* gemm_engine_name(GemmEngine engine);

// TORCH_CONVBP_GEMM, for benchmarks and tests: "mkl" runs every GEMM on ATen's and takes no
// micro-kernel route, "microkernel" runs every float32 CPU GEMM on the micro-kernel (where this
// torch and CPU have it) and takes the implicit route wherever it can, "auto" (the default)
// decides by the rules of gemm_engine() and route.cpp.
enum class GemmSetting { automatic, microkernel, mkl };
GemmSetting gemm_setting();

}  // namespace torch_convbp
