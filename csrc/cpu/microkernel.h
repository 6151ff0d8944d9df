// oneDNN's GEMM micro-kernel, as ATen exports it (at::native::cpublas::brgemm): one call computes
// a row-major C [m, n] (+)= A [m, k] @ B [k, n] on the calling thread, with a kernel generated
// once per shape and leading dimensions (and cached per thread by ATen). The GEMM driver
// (microkernel_gemm.cpp) and the implicit route (implicit_nhwc_cpu.cpp) call it.
#pragma once

#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace torch_convbp {

// c [m, n] = a [m, k] @ b [k, n], or c += where `add`; rows lda, ldb, ldc elements apart (each at
// least its matrix's width).
inline void micro_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float* c, int64_t ldc, bool add) {
#if defined(CPUBLAS_BRGEMM_F32F32F32)
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, add, a, b, c, /*is_vnni=*/false);
#else
  TORCH_CHECK(false, "torch_convbp: this torch has no GEMM micro-kernel (cpublas::brgemm)");
#endif
}

// c [m, n] (float32) (+)= a [m, k] @ b [k, n] in bfloat16, b in the VNNI layout: pairs of rows
// interleaved, [k/2][n][2] (k even), its pairs ldb * 2 elements apart.
inline void micro_gemm(int64_t m, int64_t n, int64_t k, const at::BFloat16* a, int64_t lda,
                       const at::BFloat16* b, int64_t ldb, float* c, int64_t ldc, bool add) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, add, a, b, c, /*is_vnni=*/true);
#else
  TORCH_CHECK(false, "torch_convbp: this torch has no bfloat16 GEMM micro-kernel");
#endif
}

// Rows `first` and `second` (n elements each; second null past an odd tile's end: zeros) as one
// pair of rows of the VNNI layout that the bfloat16 micro-kernel reads B in: pair[2j] = first[j],
// pair[2j + 1] = second[j]. Bits only: bfloat16 as 16-bit integers (microkernel_gemm.cpp).
void interleave_pair_of_rows(const uint16_t* first, const uint16_t* second, int64_t n,
                             uint16_t* pair);

// Releases the state a micro-kernel call may leave configured (AMX's tiles, for bfloat16).
inline void release_microkernel(bool vnni) {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  at::native::cpublas::brgemm_release(vnni);
#endif
}

}  // namespace torch_convbp
