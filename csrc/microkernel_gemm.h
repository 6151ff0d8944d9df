// A GEMM driver of our own on oneDNN's micro-kernel, for float32 and bfloat16 on the CPU
// (cpu/microkernel_gemm.cpp). gemm.cpp runs each GEMM block through it where gemm_engine()
// (gemm_choice.h) says so; elsewhere ATen's GEMM (MKL) runs them.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_convbp {

// out = a @ b, or out += a @ b where `accumulate`, for CPU tensors [G, M, K] @ [G, K, N] -> [G, M,
// N] with any strides (a batch stride of 0 broadcasts a matrix), on the calling thread: float32, or
// bfloat16 operands into a float32 or bfloat16 result (products summed in float32).
// Each matrix is cut into tiles whose sizes depend on M, N and K alone, and each element of the
// result sums its K products tile by tile in increasing k: the same bits for the same sizes,
// whichever thread runs it.
void microkernel_gemm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                      bool accumulate);

// The operand of out (+)= a @ b that every block of a GEMM cut into blocks reads (a where the
// blocks cut b's columns, b where they cut a's rows), laid out so that no block packs it: itself,
// or a copy made once in the memory order in which the driver reads it in place. Else each block
// would pack all of it (measured: the one-chunk weight gradient of 512@7 in 16 blocks took 1.5x).
at::Tensor microkernel_shared_operand(const at::Tensor& out, const at::Tensor& a,
                                      const at::Tensor& b, bool shared_is_a, bool accumulate);

// Whether `gemms` GEMMs a @ b of these sizes accumulating into one result, and the copy of that
// result into row-major order at the end, cost less (mostly copies: microkernel_gemm.cpp) with a
// column-major result (a transposed view) than with a row-major one: where a's rows and b's columns
// run along K, as the weight gradient's dY @ columns^T in NCHW, the driver computes the transposed
// product, and a row-major result would cost a transposing copy per GEMM.
bool microkernel_prefers_transposed_result(const at::Tensor& a, const at::Tensor& b, int64_t gemms);

}  // namespace torch_convbp
