// A small float32 or float64 matrix product on torch's BLAS without the operator around it
// (cpu/blas_gemm_cpu.cpp): gemm.cpp's single-group GEMMs on the CPU, where the micro-kernel does
// not run them.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_convbp {

// out = a @ b, or out += a @ b where `accumulate`, for CPU tensors [1, M, K] @ [1, K, N] ->
// [1, M, N] of one dtype, float32 or float64, of at most 16^3 multiply-adds, each matrix with a
// unit stride in one of its dims: the BLAS call that at::addmm_ makes for the same matrices (the
// same bits), with the calling thread's BLAS threads. Returns false, computing nothing, for any
// other operands, which are at::addmm_'s to compute.
bool blas_gemm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

}  // namespace torch_convbp
