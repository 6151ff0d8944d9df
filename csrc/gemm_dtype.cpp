// The dtype the GEMMs run in (gemm_dtype.h).
#include "gemm_dtype.h"

#include <string_view>

#include "env_choice.h"

namespace torch_convbp {

// The operands' own dtype, except for float16 and bfloat16 on the CPU. There im2col builds the
// column matrices in float32 (converting as it copies), the GEMMs run in float32, and each result
// is rounded once, as it is written out: as accurate as a native GEMM that accumulates in float32.
// On a CPU without instructions for half precision, ATen emulates its GEMMs at a few percent of
// float32's speed (benchmarks/NOTES.md, section 6); on one with them (AVX512-BF16, AMX) ATen runs
// them through oneDNN's matmul, whose bits changed with the thread count, single-threaded blocks
// or not (section 27). TORCH_CONVBP_HALF_GEMM=native runs them in half precision anyway (faster
// there, the bits no longer promised the same on any thread count), =float32 everywhere (a GPU
// too); auto is this rule.
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device) {
  if (dtype != at::kHalf && dtype != at::kBFloat16) return dtype;
  const std::string_view choice =
      env_choice("TORCH_CONVBP_HALF_GEMM", {"auto", "native", "float32"});
  if (choice == "auto") {
    return device.is_cpu() ? at::kFloat : dtype;
  }
  return choice == "float32" ? at::kFloat : dtype;
}

}  // namespace torch_convbp
