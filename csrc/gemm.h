// The GEMMs of the orchestration (gemm.cpp), through ATen (MKL on the CPU, cuBLAS on CUDA).
//
// On the CPU every GEMM is cut into blocks fixed by the sizes (of its groups, or of its result's
// rows or columns), and each block runs on one
// thread: a multithreaded BLAS may split a GEMM differently for another thread count, and so give
// other bits (measured, benchmarks/NOTES.md section 10). The blocks of one GEMM run in parallel
// when the caller is not already in a parallel region (one lane), one after another in a lane.
#pragma once

#include <ATen/core/Tensor.h>

#include "gemm_choice.h"
#include "scratch.h"

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

// How many blocks a GEMM with a [G, M, N] result is cut into, when the call has `units`
// independent pieces of work to run in parallel: 1 where there are several (the lanes keep the
// threads busy; each block costs some of a GEMM's speed, more for narrow ones: benchmarks/
// NOTES.md, sections 10 and 11), else 16, 8, 4 or 2 blocks: of whole groups where G > 1, else of
// at least 64 rows or columns, along the longer side (at most 4 of those where the operand all
// of them read is over 1 MiB: gemm.cpp). Sizes only, never the thread count. 1 off the CPU.
int64_t gemm_blocks(int64_t units, IntArrayRef result, const at::Device& device);

// An empty [G, M, N] result, in `dtype`, for `gemms` GEMMs like a @ b ([G, M, K] @ [G, K, N]) to
// write and accumulate into: row-major, or the transposed view of a row-major [G, N, M] where the
// GEMM engine writes that with fewer copies, its final copy into row-major order included (the
// micro-kernel driver, for the NCHW weight gradient's dY @ columns^T: microkernel_gemm.h), the
// engine being the one `float32` asks for, as in gemm_out.
Tensor empty_gemm_result(const Tensor& a, const Tensor& b, at::ScalarType dtype, int64_t gemms,
                         Memory memory, Float32Gemms float32 = Float32Gemms::cpu_rule);

// out = a @ b for [G, M, K] @ [G, K, N], in `blocks` blocks; float32 CPU GEMMs on the engine
// that `float32` asks for (gemm_choice.h).
void gemm_out(const Tensor& out, const Tensor& a, const Tensor& b, int64_t blocks,
              Float32Gemms float32 = Float32Gemms::cpu_rule);

// acc += a @ b, with acc in the accumulation dtype (float32 for float16 and bfloat16), in
// `blocks` blocks, on the engine `float32` asks for, as in gemm_out.
void gemm_accumulate(const Tensor& acc, const Tensor& a, const Tensor& b, int64_t blocks,
                     Float32Gemms float32 = Float32Gemms::cpu_rule);

// out = a @ b for [G, M, K] @ [G, K, N] with a long K (a weight gradient that contracts every
// pixel of a chunk or of the batch): where the result is too narrow to cut into blocks
// (gemm_blocks gives 1: one group, M and N under 128, as mobilenet's 1x1 layers of 16 to 96
// channels), or one group's K is at least 8 times the result's longer side, K is cut instead, into
// up to 16 shares (of 1024 or more, their copies of the result 4 MiB at most) fixed by the sizes,
// whose products run on one thread each and are then added in order; on MKL in float32, where
// a runs along K, b is row-major and the result is taller than wide (the channels_last 1x1 weight
// gradient of more output than input channels), each share computes the transposed product, the
// form MKL runs faster, copied into out at the end. Off the CPU, a plain GEMM. The engine: as in
// gemm_out.
void gemm_out_contracting(const Tensor& out, const Tensor& a, const Tensor& b,
                          Float32Gemms float32 = Float32Gemms::cpu_rule);

}  // namespace torch_convbp
