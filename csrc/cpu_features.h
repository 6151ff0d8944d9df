// What this CPU (and this torch) can do for the GEMMs: cpu/cpu_features.cpp reads it once.
#pragma once

namespace torch_convbp {

// Whether oneDNN's float32 GEMM micro-kernel (at::native::cpublas::brgemm) runs here: this torch
// exports it, oneDNN is enabled (torch.backends.mkldnn), and the CPU has AVX2 and FMA. Elsewhere
// the call falls back to a plain GEMM, far too slow for the calls of the implicit route.
bool cpu_has_gemm_microkernel();

}  // namespace torch_convbp
