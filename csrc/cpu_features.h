// What this CPU (and this torch) can do for the GEMMs: cpu/cpu_features.cpp reads it once.
#pragma once

namespace torch_convbp {

// Whether oneDNN's float32 GEMM micro-kernel (at::native::cpublas::brgemm) runs here: this torch
// exports it, oneDNN is enabled (torch.backends.mkldnn), and the CPU has AVX2 and FMA. Elsewhere
// the call falls back to a plain GEMM, far too slow for the calls of the implicit route.
bool cpu_has_gemm_microkernel();

// Whether the micro-kernel measured faster than MKL on CPUs like this one, for the GEMMs of the
// column routes: an AMD CPU with AVX-512 (F, DQ, BW, VL, with the OS saving its registers), which
// oneDNN may use (DNNL_MAX_CPU_ISA or ONEDNN_MAX_CPU_ISA do not cap it below AVX-512).
bool cpu_prefers_gemm_microkernel();

// Whether the micro-kernel measured faster than MKL here for GEMMs whose result is narrow (at
// most 256 columns), and slower for wider ones: an AMD CPU without the AVX-512 rule above, whose
// oneDNN may use AVX2 (an AVX2 Zen 1 EPYC, benchmarks/NOTES.md, sections 115 and 117).
bool cpu_prefers_narrow_gemms_on_microkernel();

// Whether our own AVX-512 kernels (the direct grouped kernels' widest version, cpu/vector_ops.h)
// may run: the CPU has AVX-512 as above, and oneDNN is not capped below it, so that a machine made
// to behave like an AVX2 one (DNNL_MAX_CPU_ISA=AVX2) runs our AVX2 code too.
bool cpu_allows_avx512_kernels();

// Whether the micro-kernel computes bfloat16 products natively here: the CPU has AVX512_BF16 or
// AMX-BF16 (and oneDNN may use them), where they run at twice float32's rate.
bool cpu_has_bfloat16_microkernel();

// Whether it computes them on AMX's tiles (AMX-BF16, which oneDNN may use), where a call's tiles
// are loaded and stored around its products and longer calls pay (cpu/implicit_nhwc_cpu.cpp).
bool cpu_has_amx_bfloat16_microkernel();

}  // namespace torch_convbp
