// Single-threaded GEMMs in blocks fixed by the sizes (see gemm.h).
#include "gemm.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <vector>

#include "blas_gemm.h"
#include "gemm_choice.h"
#include "microkernel_gemm.h"
#include "scratch.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

// MKL's per-thread thread count: the C function behind mkl_service.h's mkl_set_num_threads_local
// macro (the lower-case symbols are the Fortran interface, which takes a pointer). libtorch_cpu
// exports it on x86 builds. A weak reference: where
// torch has no MKL the symbol is null and the GEMMs keep the BLAS's own threading, which inside
// a lane is one thread already (a nested parallel region), but not with one lane.
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

namespace torch_convbp {
namespace {

// Up to 16 blocks, so that a call with a single unit (a deep layer at batch 1) has work for up
// to 16 threads; at least kMinBlockLength rows or columns each, so that small GEMMs stay whole.
constexpr int64_t kMaxGemmBlocks = 16;
constexpr int64_t kMinBlockLength = 64;
// Every block of rows reads all of b, every block of columns all of a: more than
// kBlocksOverSharedOperand blocks only where that shared operand fits a core's L2 (1 MiB), since
// re-reading it from memory cost more than the threads gained (benchmarks/NOTES.md, section 35).
constexpr int64_t kBlocksOverSharedOperand = 4;
constexpr int64_t kSharedOperandInCacheBytes = int64_t{1} << 20;
constexpr int64_t kMinShareLength = 1024;      // of K, per share of gemm_out_contracting
constexpr int64_t kMaxContractionShares = 16;  // each share is a copy of the result, added after
// The shares' copies of the result take at most this much memory in all.
constexpr int64_t kMaxContractionSharesBytes = int64_t{4} << 20;
// K at least this many times the result's longer side: blocks of the result would each re-read
// an operand this long (the channels_last 1x1 weight gradient, which contracts the batch's
// pixels), where shares of K read each operand once (benchmarks/NOTES.md, section 42).
constexpr int64_t kLongContraction = 8;

// Makes the GEMMs of this thread single-threaded while it lives: MKL's (float32, float64), and
// oneDNN's, which ATen runs for bfloat16 and float16 on a CPU with instructions for them, and
// which takes as many OpenMP threads as the calling thread may start (measured on an AMX CPU:
// bfloat16 bits that changed with the thread count; benchmarks/NOTES.md, section 24).
class SingleThreadedBlas {
 public:
  explicit SingleThreadedBlas(bool cpu) : cpu_(cpu) {
    if (!cpu_) return;
    if (MKL_Set_Num_Threads_Local != nullptr) previous_mkl_ = MKL_Set_Num_Threads_Local(1);
#if defined(_OPENMP)
    previous_omp_ = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
  }
  ~SingleThreadedBlas() {
    if (!cpu_) return;
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous_mkl_);
#if defined(_OPENMP)
    omp_set_num_threads(previous_omp_);
#endif
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  bool cpu_;
  int previous_mkl_ = 0;  // 0: back to the global setting
  int previous_omp_ = 1;
};

// The only matrix of a [1, M, N] batch, as one view op (select is two: benchmarks/NOTES.md,
// section 32).
Tensor only_matrix(const Tensor& batch) {
  return batch.as_strided({batch.size(1), batch.size(2)}, {batch.stride(1), batch.stride(2)});
}

// Whether the micro-kernel driver runs a [G, M, N] result `out_dtype` (+)= a @ b: gemm_engine
// says so for a's dtype and the result's sides, and out is in a's dtype or is its float32
// accumulator.
bool on_microkernel(int64_t m, int64_t n, at::ScalarType out_dtype, const Tensor& a,
                    Float32Gemms float32 = Float32Gemms::cpu_rule) {
  return (out_dtype == a.scalar_type() || out_dtype == at::kFloat) &&
         gemm_engine(a.scalar_type(), a.device(), m, n, float32) == GemmEngine::microkernel;
}
bool on_microkernel(const Tensor& out, const Tensor& a,
                    Float32Gemms float32 = Float32Gemms::cpu_rule) {
  return on_microkernel(out.size(1), out.size(2), out.scalar_type(), a, float32);
}

// out = a @ b (beta 0) or out += a @ b, for [G, M, K] @ [G, K, N]: on the micro-kernel where
// the whole GEMM's engine is it (on_microkernel of the result that this block is part of, so
// that every block of a GEMM runs on one engine), else ATen's GEMM: for one group on the CPU,
// its BLAS call without the operator (blas_gemm.h), else a plain mm for one group.
void gemm_one_block(const Tensor& out, const Tensor& a, const Tensor& b, bool accumulate,
                    bool microkernel) {
  if (microkernel) {
    // Named in the profiler as ATen's GEMMs are (aten::addmm_), since it is no ATen operation.
    RECORD_FUNCTION("torch_convbp::microkernel_gemm", std::vector<c10::IValue>());
    microkernel_gemm(out, a, b, accumulate);
  } else if (out.scalar_type() !=
             a.scalar_type()) {  // a float32 accumulator of half-precision GEMMs
    const Tensor product = at::bmm(a, b);
    accumulate ? out.add_(product) : out.copy_(product);
  } else if (blas_gemm(out, a, b, accumulate)) {
    return;
  } else if (a.size(0) == 1) {
    Tensor out_matrix = only_matrix(out);
    out_matrix.addmm_(only_matrix(a), only_matrix(b), accumulate ? 1 : 0);
  } else {
    Tensor out_batch = out;
    out_batch.baddbmm_(a, b, accumulate ? 1 : 0);
  }
}

// Which dimension of the result [G, M, N] the blocks cut: the groups where there are several
// (each group's GEMM then runs whole, as it would uncut), else the longer of M (a slice of a's
// rows per block) and N (a slice of b's columns), so that each block stays a wide GEMM.
int64_t block_dimension(IntArrayRef result) {
  if (result[0] > 1) return 0;
  return result[1] > result[2] ? 1 : 2;
}

// Runs body(index) for index in [0, count) in parallel, each call's BLAS single-threaded, with the
// caller's thread-local state (grad mode, dispatch keys) in every thread.
template <class Body>
void on_single_threaded_blas(int64_t count, bool cpu, Body&& body) {
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(caller_state);
    SingleThreadedBlas single(cpu);
    for (int64_t index = begin; index < end; ++index) body(index);
  });
}

// Runs the GEMM as `blocks` blocks, each single-threaded: in parallel where the caller is not in
// a parallel region already (at::parallel_for runs inline in one).
void gemm_by_blocks(const Tensor& out, const Tensor& a, const Tensor& b, int64_t blocks,
                    bool accumulate, Float32Gemms float32 = Float32Gemms::cpu_rule) {
  const bool cpu = out.device().is_cpu();
  const bool microkernel = on_microkernel(out, a, float32);
  if (blocks <= 1) {
    SingleThreadedBlas single(cpu);
    gemm_one_block(out, a, b, accumulate, microkernel);
    return;
  }
  const int64_t dim = block_dimension(out.sizes());
  Tensor shared_a = a, shared_b = b;
  if (dim != 0) {  // rows or columns: each block reads all of the other operand
    Tensor& shared = dim == 1 ? shared_b : shared_a;
    if (shared.numel() * shared.element_size() > kSharedOperandInCacheBytes) {
      blocks = std::min(blocks, kBlocksOverSharedOperand);
    }
    if (microkernel) {
      shared = microkernel_shared_operand(out, a, b, /*shared_is_a=*/dim == 2, accumulate);
    }
  }
  const int64_t length = out.size(dim);
  const int64_t width = (length + blocks - 1) / blocks;
  on_single_threaded_blas(blocks, cpu, [&](int64_t block) {
    const int64_t first = block * width, count = std::min(width, length - first);
    if (count <= 0) return;
    const auto part = [&](const Tensor& t) { return t.narrow(dim, first, count); };
    // [G', M', N'] (+)= [G', M', K] @ [G', K, N']: a's rows follow M, b's columns follow N.
    gemm_one_block(part(out), dim == 2 ? shared_a : part(a), dim == 1 ? shared_b : part(b),
                   accumulate, microkernel);
  });
}

// Scratch matrices like out [G, M, N], in `dtype`: row-major, or transposed where out is
// (empty_gemm_result).
Tensor empty_scratch_like(const Tensor& out, at::ScalarType dtype) {
  const auto options = out.options().dtype(dtype);
  const bool transposed = !out.is_contiguous() && out.transpose(1, 2).is_contiguous();
  if (!transposed) return empty_scratch(out.sizes(), options);
  return empty_scratch({out.size(0), out.size(2), out.size(1)}, options).transpose(1, 2);
}

// How many shares of K gemm_out_contracting cuts a GEMM into: sizes only, as gemm_blocks. Where
// the result can be cut into blocks, only for one group's GEMM with a K long beside the result's
// sides: blocks of whole groups read only their own operands, so no block re-reads a long one.
int64_t contraction_shares(const Tensor& out, int64_t k) {
  if (!out.device().is_cpu()) return 1;
  const bool long_contraction =
      out.size(0) == 1 && k >= kLongContraction * std::max(out.size(1), out.size(2));
  if (!long_contraction && gemm_blocks(/*units=*/1, out.sizes(), out.device()) > 1) return 1;
  const int64_t result_bytes = out.numel() * static_cast<int64_t>(sizeof(float));
  for (int64_t shares = kMaxContractionShares; shares > 1; shares /= 2) {
    if (k / shares >= kMinShareLength &&
        (shares - 1) * result_bytes <= kMaxContractionSharesBytes) {
      return shares;
    }
  }
  return 1;
}

// Whether the shares of a contraction compute out^T = b^T @ a^T, [1, N, M], instead of out [1, M,
// N]: on MKL, in float32, for the channels_last weight gradient's form dY^T [M, P] @ X [P, N]
// (a read along K, b row-major) where the result is taller than wide. MKL's single-threaded
// kernels ran that form at 0.76-0.86x the rate of the same product with the sides swapped
// (256 x 64 over 1568 pixels: 76 against 100 GFLOP/s; 512 x 128 62 against 72), and the copy of
// the small transposed result costs little beside it (benchmarks/NOTES.md, section 103).
// `microkernel`: whether the GEMM runs on the micro-kernel (on_microkernel).
bool shares_compute_transposed(const Tensor& out, const Tensor& a, const Tensor& b,
                               bool microkernel) {
  return !microkernel && out.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat &&
         out.size(1) > out.size(2) && a.stride(1) == 1 && b.stride(2) == 1;
}

}  // namespace

int64_t gemm_blocks(int64_t units, IntArrayRef result, const at::Device& device) {
  if (!device.is_cpu() || units > 1) return 1;
  // 16, 8, 4 or 2 blocks (equal shares for 2, 4, 8 or 16 threads): of whole groups, or of at
  // least kMinBlockLength rows or columns (gemm_by_blocks keeps at most 4 of those where the
  // operand they share is larger than a core's L2).
  const int64_t dim = block_dimension(result);
  const int64_t min_length = dim == 0 ? 1 : kMinBlockLength;
  for (int64_t blocks = kMaxGemmBlocks; blocks > 1; blocks /= 2) {
    if (result[dim] / blocks >= min_length) return blocks;
  }
  return 1;
}

Tensor empty_gemm_result(const Tensor& a, const Tensor& b, at::ScalarType dtype, int64_t gemms,
                         Memory memory, Float32Gemms float32) {
  const auto options = a.options().dtype(dtype);
  const int64_t groups = a.size(0), m = a.size(1), n = b.size(2);
  const bool transposed = m > 0 && n > 0 && a.size(2) > 0 &&
                          on_microkernel(m, n, dtype, a, float32) &&
                          microkernel_prefers_transposed_result(a, b, gemms);
  const auto empty = [&](at::IntArrayRef size) {
    return memory == Memory::scratch ? empty_scratch(size, options) : at::empty(size, options);
  };
  return transposed ? empty({groups, n, m}).transpose(1, 2) : empty({groups, m, n});
}

void gemm_out(const Tensor& out, const Tensor& a, const Tensor& b, int64_t blocks,
              Float32Gemms float32) {
  gemm_by_blocks(out, a, b, blocks, /*accumulate=*/false, float32);
}

void gemm_out_contracting(const Tensor& out, const Tensor& a, const Tensor& b,
                          Float32Gemms float32) {
  const int64_t k = a.size(2), shares = contraction_shares(out, k);
  if (shares == 1) {
    gemm_out(out, a, b, gemm_blocks(/*units=*/1, out.sizes(), out.device()), float32);
    return;
  }
  // products[i] [1, M, N] = a[:, :, share i] [1, M, K/shares] @ b[:, share i, :] [1, K/shares, N],
  // the first written into out, the others then added to it in order; in float32 where out is
  // in half precision and its GEMMs on the micro-kernel, rounded once at the end. Or each the
  // transposed product [1, N, M] = b^T @ a^T, summed in scratch and copied into out at the end.
  const int64_t width = (k + shares - 1) / shares;
  const bool microkernel = on_microkernel(out, a, float32);
  const bool transposed = shares_compute_transposed(out, a, b, microkernel);
  const bool rounded_at_end = out.scalar_type() != at::kFloat && microkernel;
  const bool in_scratch = transposed || rounded_at_end;
  const Tensor result = transposed ? out.transpose(1, 2) : out;
  const Tensor left = transposed ? b.transpose(1, 2) : a,
               right = transposed ? a.transpose(1, 2) : b;
  const auto scratch = [&] {  // a share's product, in scratch
    return transposed ? empty_scratch(result.sizes(), result.options())
                      : empty_scratch_like(out, rounded_at_end ? at::kFloat : out.scalar_type());
  };
  std::vector<Tensor> products(shares);
  products[0] = in_scratch ? scratch() : out;
  for (int64_t share = 1; share < shares; ++share) products[share] = scratch();
  on_single_threaded_blas(shares, /*cpu=*/true, [&](int64_t share) {
    const int64_t first = share * width, count = std::min(width, k - first);
    gemm_one_block(products[share], left.narrow(2, first, count), right.narrow(1, first, count),
                   /*accumulate=*/false, microkernel);
  });
  for (int64_t share = 1; share < shares; ++share) products[0].add_(products[share]);
  if (in_scratch) result.copy_(products[0]);
}

void gemm_accumulate(const Tensor& acc, const Tensor& a, const Tensor& b, int64_t blocks,
                     Float32Gemms float32) {
  gemm_by_blocks(acc, a, b, blocks, /*accumulate=*/true, float32);
}

}  // namespace torch_convbp
