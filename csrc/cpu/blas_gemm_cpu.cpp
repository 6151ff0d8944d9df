// A small float32 or float64 matrix product on the BLAS that torch links (MKL's sgemm_ and
// dgemm_ in torch's x86-64 builds), called with the matrices' pointers rather than through the
// operator at::addmm_: for a small layer, the operator's dispatch and checks and the three matrix
// views around it cost more host time than the product (benchmarks/NOTES.md, section 90).
//
// The call is the one at::addmm_ makes on the CPU for the same matrices (through
// at::native::cpublas::gemm, which extensions cannot call), so the bits are the same: the same
// transpose flags and leading dimensions, and only where at::addmm_ calls BLAS itself. It does
// for products of at most 16^3 multiply-adds; larger float32 ones it may give to oneDNN in
// bfloat16 (torch.set_float32_matmul_precision), and on AArch64 to ACL.
#include <ATen/record_function.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <vector>

#include "../blas_gemm.h"

// The Fortran BLAS interface (LP64: 32-bit integers), as libtorch_cpu exports it where torch has
// MKL. Weak references: null where torch has no such BLAS, and the product is then at::addmm_'s.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc) __attribute__((weak));
}

namespace torch_convbp {
namespace {

// The products that at::addmm_ always computes with BLAS's own gemm (oneDNN's bfloat16 GEMM
// takes only larger ones), and whose host time matters beside their arithmetic.
constexpr int64_t kSmallProduct = 16 * 16 * 16;

// A matrix as BLAS reads it: column-major [rows, cols] in memory ('n'), or the column-major
// [cols, rows] of its transpose ('t'), with the leading dimension of either, chosen as at::addmm_
// chooses; none where neither stride is 1 with room for the other side (at::addmm_ copies such a
// matrix first), or where the leading dimension is past BLAS's 32-bit integers (at::addmm_ then
// computes without BLAS).
struct BlasMatrix {
  char transpose;
  int leading;
};

std::optional<BlasMatrix> as_blas(int64_t rows, int64_t cols, int64_t row_stride,
                                  int64_t col_stride) {
  const auto blas_matrix = [](char transpose, int64_t leading) -> std::optional<BlasMatrix> {
    if (leading > INT_MAX) return std::nullopt;
    return BlasMatrix{transpose, static_cast<int>(leading)};
  };
  if (row_stride == 1 && col_stride >= std::max<int64_t>(1, rows))
    return blas_matrix('n', col_stride);
  if (col_stride == 1 && row_stride >= std::max<int64_t>(1, cols))
    return blas_matrix('t', row_stride);
  return std::nullopt;
}

// Whether the BLAS is there for this dtype, and at::addmm_ calls it for small products.
bool blas_computes(at::ScalarType dtype) {
#if defined(__x86_64__) || defined(_M_X64)
  return dtype == at::kFloat ? sgemm_ != nullptr : dtype == at::kDouble && dgemm_ != nullptr;
#else
  return false;  // elsewhere at::addmm_ may give even a small product to another library
#endif
}

// C [m, n] = alpha A @ B + beta C in column-major terms, as BLAS's xgemm_ takes it.
template <class Scalar, class Gemm>
void call_blas(Gemm gemm, const BlasMatrix& a, const BlasMatrix& b, int m, int n, int k,
               const Scalar* a_data, const Scalar* b_data, Scalar beta, Scalar* c_data, int ldc) {
  const Scalar alpha = 1;
  // A leading dimension that no element is read through still has to be valid (BLAS checks
  // it): where a side is 1, the one that ATen's BLAS call passes (cpublas' normalize_last_dims).
  int lda = a.leading, ldb = b.leading;
  if (n == 1) ldc = m;
  if (a.transpose == 't' ? m == 1 : k == 1) lda = a.transpose == 't' ? k : m;
  if (b.transpose == 't' ? k == 1 : n == 1) ldb = b.transpose == 't' ? n : k;
  gemm(&a.transpose, &b.transpose, &m, &n, &k, &alpha, a_data, &lda, b_data, &ldb, &beta, c_data,
       &ldc);
}

}  // namespace

bool blas_gemm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  const auto dtype = out.scalar_type();
  if (!out.is_cpu() || out.size(0) != 1 || a.scalar_type() != dtype || b.scalar_type() != dtype ||
      !blas_computes(dtype)) {
    return false;
  }
  // The matrices are dims 1 and 2 (dim 0 is the batch of one).
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  if (m == 0 || n == 0 || k == 0 || m * n * k > kSmallProduct) return false;
  // BLAS computes a column-major C = A @ B. A column-major out is that C; a row-major one is the
  // column-major out^T = b^T @ a^T: its operands swap, and each is read along its other dims.
  const bool column_major =
      out.stride(1) == 1 && (n == 1 || out.stride(2) >= std::max<int64_t>(1, m));
  const bool row_major = out.stride(2) == 1 && (m == 1 || out.stride(1) >= std::max<int64_t>(1, n));
  if (!column_major && !row_major) return false;
  const at::Tensor& first = column_major ? a : b;   // A of C = A @ B
  const at::Tensor& second = column_major ? b : a;  // B
  const int64_t c_rows = column_major ? m : n, c_cols = column_major ? n : m;
  const int64_t row = column_major ? 1 : 2, col = 3 - row;  // C's dims in out
  // A [c_rows, k] and B [k, c_cols] in the column-major frame
  const auto a_blas = as_blas(c_rows, k, first.stride(row), first.stride(col));
  const auto b_blas = as_blas(k, c_cols, second.stride(row), second.stride(col));
  const int64_t ldc = out.stride(col);
  if (!a_blas || !b_blas || ldc > INT_MAX) return false;
  // Named in the profiler as ATen's GEMMs are (aten::addmm_), since it is no ATen operation.
  RECORD_FUNCTION("torch_convbp::blas_gemm", std::vector<c10::IValue>());
  const int rows = static_cast<int>(c_rows), cols = static_cast<int>(c_cols);
  if (dtype == at::kFloat) {
    call_blas<float>(sgemm_, *a_blas, *b_blas, rows, cols, static_cast<int>(k),
                     first.const_data_ptr<float>(), second.const_data_ptr<float>(),
                     accumulate ? 1.0f : 0.0f, out.mutable_data_ptr<float>(),
                     static_cast<int>(ldc));
  } else {
    call_blas<double>(dgemm_, *a_blas, *b_blas, rows, cols, static_cast<int>(k),
                      first.const_data_ptr<double>(), second.const_data_ptr<double>(),
                      accumulate ? 1.0 : 0.0, out.mutable_data_ptr<double>(),
                      static_cast<int>(ldc));
  }
  return true;
}

}  // namespace torch_convbp
