// How the GEMMs run (gemm_choice.h).
#include "gemm_choice.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "cpu_features.h"
#include "env_choice.h"

namespace torch_convbp {

namespace {

// Whether the CPU's bfloat16 GEMMs run in bfloat16 on the micro-kernel: where it computes them
// natively, unless TORCH_CONVBP_HALF_GEMM or TORCH_CONVBP_GEMM=mkl say otherwise.
bool bfloat16_on_microkernel() {
  return env_choice("TORCH_CONVBP_HALF_GEMM", {"auto", "native", "float32"}) == "auto" &&
         gemm_setting() != GemmSetting::mkl && cpu_has_bfloat16_microkernel();
}

// Float32 results thinner than this on a side (ResNeXt's 4 output channels per group fed NCHW)
// ran slower on the micro-kernel than on MKL (benchmarks/NOTES.md, section 39).
constexpr int64_t kMinMicrokernelSide = 16;

// Float32 results at most this many columns wide run on the micro-kernel where the CPU prefers it
// for narrow GEMMs only (cpu_prefers_narrow_gemms_on_microkernel): on an AVX2 Zen 1 it ran
// 1568 x 256 x 256 at 1.25x MKL's rate and 1568 x 1024 x 256 at 0.59x (benchmarks/NOTES.md,
// sections 115 and 117).
constexpr int64_t kMaxNarrowResultColumns = 256;

}  // namespace

// The operands' own dtype, except for float16 and bfloat16 on the CPU. Where the micro-kernel
// computes bfloat16 natively (AVX512_BF16, AMX), bfloat16 GEMMs run on it: their products are
// exact in float32 and summed in float32, in tiles fixed by the sizes, so each result is rounded
// once, as with float32 GEMMs, at twice their rate (benchmarks/NOTES.md, section 38). Columns that
// col2im sums again stay float32, so that a gradient is rounded once. Elsewhere im2col builds the
// column matrices in float32 (converting as it copies), the GEMMs run in float32, and each result
// is rounded once, as it is written out. On a CPU without instructions for half precision, ATen
// emulates its GEMMs at a few percent of float32's speed (section 6); on one with them ATen runs
// them through oneDNN's matmul, whose bits changed with the thread count (section 27).
// TORCH_CONVBP_HALF_GEMM=native runs them in half precision on ATen's GEMMs anyway (faster there
// than float32, the bits no longer promised the same on any thread count), =float32 everywhere (a
// GPU too); auto is this rule.
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device, GemmResult result) {
  if (dtype != at::kHalf && dtype != at::kBFloat16) return dtype;
  const std::string_view choice =
      env_choice("TORCH_CONVBP_HALF_GEMM", {"auto", "native", "float32"});
  if (choice == "auto") {
    if (!device.is_cpu()) return dtype;
    const bool native =
        dtype == at::kBFloat16 && result == GemmResult::rounded_once && bfloat16_on_microkernel();
    return native ? at::kBFloat16 : at::kFloat;
  }
  return choice == "float32" ? at::kFloat : dtype;
}

GemmSetting gemm_setting() {
  const std::string_view choice = env_choice("TORCH_CONVBP_GEMM", {"auto", "microkernel", "mkl"});
  return choice == "microkernel" ? GemmSetting::microkernel
         : choice == "mkl"       ? GemmSetting::mkl
                                 : GemmSetting::automatic;
}

// Float32 GEMMs on the CPU run on the micro-kernel where it measured faster than MKL as we call
// it (single-threaded blocks): on CPUs with AVX-512 (as oneDNN sees them: DNNL_MAX_CPU_ISA caps
// it) from AMD, where MKL's kernels are slower (benchmarks/NOTES.md, section 36). Elsewhere MKL:
// on an AVX-512 Xeon MKL ran at the core's peak already (section 26), and on AVX2 the two were
// even. A call site that asks for Float32Gemms::microkernel_on_avx512 (tall, thin GEMMs that MKL
// ran slower, section 73) gets the micro-kernel on any CPU that runs AVX-512 kernels.
GemmEngine gemm_engine(at::ScalarType gemm_dtype, const at::Device& device, Float32Gemms float32) {
  if (device.is_cpu() && gemm_dtype == at::kBFloat16) {  // bfloat16 GEMMs on the CPU: gemm_dtype
    return bfloat16_on_microkernel() ? GemmEngine::microkernel : GemmEngine::aten;
  }
  if (!device.is_cpu() || gemm_dtype != at::kFloat || !cpu_has_gemm_microkernel()) {
    return GemmEngine::aten;
  }
  switch (gemm_setting()) {
    case GemmSetting::microkernel: return GemmEngine::microkernel;
    case GemmSetting::mkl: return GemmEngine::aten;
    case GemmSetting::automatic: break;
  }
  const bool by_call =
      float32 == Float32Gemms::microkernel_on_avx512 && cpu_allows_avx512_kernels();
  return cpu_prefers_gemm_microkernel() || by_call ? GemmEngine::microkernel : GemmEngine::aten;
}

// In bfloat16 ATen's alternative is oneDNN's matmul, whose bits follow the thread count: however
// thin, those stay ours. Where the CPU prefers the micro-kernel for narrow results only, a float32
// result at most kMaxNarrowResultColumns wide runs on it (the route stays the one for MKL), unless
// its call site asks for Float32Gemms::cpu_rule_not_by_width.
GemmEngine gemm_engine(at::ScalarType gemm_dtype, const at::Device& device, int64_t rows,
                       int64_t cols, Float32Gemms float32) {
  if (gemm_dtype == at::kFloat && std::min(rows, cols) < kMinMicrokernelSide) {
    return GemmEngine::aten;
  }
  const GemmEngine engine = gemm_engine(gemm_dtype, device, float32);
  const bool narrow_on_microkernel =
      engine == GemmEngine::aten && device.is_cpu() && gemm_dtype == at::kFloat &&
      float32 != Float32Gemms::cpu_rule_not_by_width && gemm_setting() == GemmSetting::automatic &&
      cols <= kMaxNarrowResultColumns && cpu_prefers_narrow_gemms_on_microkernel();
  return narrow_on_microkernel ? GemmEngine::microkernel : engine;
}

const char* gemm_engine_name(GemmEngine engine) {
  return engine == GemmEngine::microkernel ? "microkernel" : "aten";
}

}  // namespace torch_convbp
