// The GEMM driver on oneDNN's micro-kernel (microkernel_gemm.h).
//
// The micro-kernel computes row-major C [m, n] (+)= A [m, k] @ B [k, n]. The driver cuts a GEMM
// into tiles of K (at most kMaxTileK) and of N (at most kMaxTileN), so that a tile of B stays in
// a core's L2 while every row of A meets it, and calls the micro-kernel once per tile:
//
//   for each tile of K, in increasing k:        (the first one writes C, the others add to it)
//     for each tile of N:
//       C [M, n] (+)= A [M, k] @ B [k, n]       (one call; rows of A read in place)
//
// The orchestration hands it matrices in either orientation: in NHWC they are transposed views
// (matrices.h), and a weight gradient's columns arrive transposed. So the driver first picks the
// orientation that copies least: C = A @ B as it is, or C^T = B^T @ A^T, which swaps the operands
// and the orientation of each. In the orientation taken, C must be row-major (else the tiles go
// to a row-major copy of C, written back at the end); a column-major A is packed tile by tile,
// [kPackedRows, k] at a time, each element once; a column-major B likewise, [k, n] at a time.
// (Measured: benchmarks/NOTES.md, section 36.)
//
// The tiles depend on M, N and K alone, and the calls run on the calling thread: each element of
// C sums its products tile by tile in increasing k, the same way whichever thread runs the GEMM.
#include "../microkernel_gemm.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "../scratch.h"
#include "microkernel.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// A tile of B (kMaxTileK x kMaxTileN floats, 128 KiB) stays in a core's L2 (1 MiB on an EPYC)
// beside the rows of A and C that stream through; tiles of 64 rows of a packed A are 64 KiB.
// Tiles of 64 to 256 columns and 256 or 512 of K ran within a few percent of each other on the
// suite's layers (benchmarks/NOTES.md, section 36).
constexpr int64_t kMaxTileK = 256;
constexpr int64_t kMaxTileN = 128;
constexpr int64_t kPackedRows = 64;
constexpr int64_t kVector = 16;  // floats per AVX-512 register: tile widths are multiples of it

// A float32 matrix: element (i, j) at data[i * row_stride + j * col_stride].
struct Matrix {
  float* data;
  int64_t rows, cols, row_stride, col_stride;

  Matrix transposed() const { return {data, cols, rows, col_stride, row_stride}; }
  float* at(int64_t i, int64_t j) const { return data + i * row_stride + j * col_stride; }
  // Row-major as the micro-kernel reads it: elements of a row adjacent, rows at least a row apart.
  bool row_major() const {
    return (cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols);
  }
  // Its leading dimension, where row_major().
  int64_t ld() const { return rows == 1 ? cols : row_stride; }
  int64_t size() const { return rows * cols; }
};

Matrix matrix_of(const Tensor& batch, int64_t g) {
  return {batch.data_ptr<float>() + g * batch.stride(0), batch.size(1), batch.size(2),
          batch.stride(1), batch.stride(2)};
}

// A length cut into `count` tiles of `size` (a multiple of `multiple`, the last one shorter),
// as few as a tile of at most `max_size` allows: sizes alone decide.
struct Tiles {
  int64_t count, size;
  int64_t first(int64_t t) const { return t * size; }
  int64_t length(int64_t t, int64_t total) const { return std::min(size, total - t * size); }
};
Tiles tiles_of(int64_t total, int64_t max_size, int64_t multiple) {
  const int64_t count = (total + max_size - 1) / max_size;
  const int64_t even = (total + count - 1) / count;
  const int64_t size = std::min(max_size, (even + multiple - 1) / multiple * multiple);
  return {(total + size - 1) / size, size};
}

// The part of m of rows [r0, r0 + rows) and columns [c0, c0 + cols).
Matrix part(const Matrix& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  return {m.at(r0, c0), rows, cols, m.row_stride, m.col_stride};
}

// A dense row-major matrix of rows x cols in scratch memory (scratch.h), which `storage` holds.
Matrix dense(int64_t rows, int64_t cols, Tensor& storage) {
  storage = empty_scratch({rows * cols}, at::TensorOptions().dtype(at::kFloat));
  return {storage.data_ptr<float>(), rows, cols, cols, 1};
}

// to = from (the same sizes): row by row where both are row-major, else in blocks of 16 x 16
// elements that stay in L1, each block read along from's columns (a transposing copy where from
// is column-major).
void copy_matrix(const Matrix& from, const Matrix& to) {
  if (from.row_major() && to.row_major()) {
    for (int64_t i = 0; i < from.rows; ++i) std::copy_n(from.at(i, 0), from.cols, to.at(i, 0));
    return;
  }
  constexpr int64_t kBlock = 16;
  for (int64_t ib = 0; ib < from.rows; ib += kBlock) {
    const int64_t i_end = std::min(from.rows, ib + kBlock);
    for (int64_t jb = 0; jb < from.cols; jb += kBlock) {
      const int64_t j_end = std::min(from.cols, jb + kBlock);
      for (int64_t j = jb; j < j_end; ++j) {
        for (int64_t i = ib; i < i_end; ++i) *to.at(i, j) = *from.at(i, j);
      }
    }
  }
}

// c (+)= a @ b, c row-major, at most one of a and b not row-major (packed tile by tile).
void gemm_tiles(const Matrix& c, const Matrix& a, const Matrix& b, bool accumulate) {
  const int64_t m = c.rows, n = c.cols, k = a.cols;
  const Tiles k_tiles = tiles_of(k, kMaxTileK, kVector), n_tiles = tiles_of(n, kMaxTileN, kVector);
  const bool pack_a = !a.row_major(), pack_b = !b.row_major();
  Tensor storage;
  float* const packed = pack_a   ? dense(kPackedRows, k_tiles.size, storage).data
                        : pack_b ? dense(k_tiles.size, n_tiles.size, storage).data
                                 : nullptr;
  for (int64_t kt = 0; kt < k_tiles.count; ++kt) {
    const int64_t k0 = k_tiles.first(kt), kk = k_tiles.length(kt, k);
    const bool add = accumulate || kt > 0;
    if (pack_a) {  // each [kPackedRows, kk] tile of a packed once, then met by every tile of b
      for (int64_t m0 = 0; m0 < m; m0 += kPackedRows) {
        const int64_t mm = std::min(kPackedRows, m - m0);
        copy_matrix(part(a, m0, mm, k0, kk), Matrix{packed, mm, kk, kk, 1});
        for (int64_t nt = 0; nt < n_tiles.count; ++nt) {
          const int64_t n0 = n_tiles.first(nt), nn = n_tiles.length(nt, n);
          // [mm, nn] (+)= [mm, kk] @ [kk, nn]
          micro_gemm(mm, nn, kk, packed, kk, b.at(k0, n0), b.ld(), c.at(m0, n0), c.ld(), add);
        }
      }
      continue;
    }
    for (int64_t nt = 0; nt < n_tiles.count; ++nt) {
      const int64_t n0 = n_tiles.first(nt), nn = n_tiles.length(nt, n);
      const float* b_tile = b.at(k0, n0);
      int64_t ldb = pack_b ? nn : b.ld();
      if (pack_b) {
        copy_matrix(part(b, k0, kk, n0, nn), Matrix{packed, kk, nn, nn, 1});
        b_tile = packed;
      }
      // [m, nn] (+)= [m, kk] @ [kk, nn]
      micro_gemm(m, nn, kk, a.at(0, k0), a.ld(), b_tile, ldb, c.at(0, n0), c.ld(), add);
    }
  }
}

// The elements copied to compute c (+)= a @ b in this orientation: all of c where it is not
// row-major (twice when accumulating: in and out), and each operand that is not row-major.
int64_t copies(const Matrix& c, const Matrix& a, const Matrix& b, bool accumulate) {
  int64_t count = c.row_major() ? 0 : c.size() * (accumulate ? 2 : 1);
  if (!a.row_major()) count += a.size();
  if (!b.row_major()) count += b.size();
  return count;
}

// Whether C^T = B^T @ A^T copies less than C = A @ B.
bool transposing_copies_less(const Matrix& c, const Matrix& a, const Matrix& b, bool accumulate) {
  return copies(c.transposed(), b.transposed(), a.transposed(), accumulate) <
         copies(c, a, b, accumulate);
}

// The fewest elements copied for c (+)= a @ b, in either orientation.
int64_t fewest_copies(const Matrix& c, const Matrix& a, const Matrix& b, bool accumulate) {
  return std::min(copies(c, a, b, accumulate),
                  copies(c.transposed(), b.transposed(), a.transposed(), accumulate));
}

void gemm_matrices(Matrix c, Matrix a, Matrix b, bool accumulate) {
  if (c.size() == 0) return;
  if (a.cols == 0) {  // no products: a zero result
    if (!accumulate) {
      for (int64_t i = 0; i < c.rows; ++i) {
        for (int64_t j = 0; j < c.cols; ++j) *c.at(i, j) = 0.f;
      }
    }
    return;
  }
  if (transposing_copies_less(c, a, b, accumulate)) {  // C^T = B^T @ A^T
    std::swap(a, b);
    a = a.transposed();
    b = b.transposed();
    c = c.transposed();
  }
  Tensor a_copy, c_copy;
  if (!a.row_major() && !b.row_major()) {  // one of them copied whole
    const Matrix copy = dense(a.rows, a.cols, a_copy);
    copy_matrix(a, copy);
    a = copy;
  }
  if (c.row_major()) {
    gemm_tiles(c, a, b, accumulate);
    return;
  }
  const Matrix staged = dense(c.rows, c.cols, c_copy);  // the tiles' row-major result
  if (accumulate) copy_matrix(c, staged);
  gemm_tiles(staged, a, b, accumulate);
  copy_matrix(staged.transposed(), c.transposed());  // along c's columns, which are adjacent
}

}  // namespace

Tensor microkernel_shared_operand(const Tensor& out, const Tensor& a, const Tensor& b,
                                  bool shared_is_a, bool accumulate) {
  const Matrix c0 = matrix_of(out, 0), a0 = matrix_of(a, 0), b0 = matrix_of(b, 0);
  const bool transposed = transposing_copies_less(c0, a0, b0, accumulate);
  const Tensor& shared = shared_is_a ? a : b;
  // Its role there: read as it is (direct), or as its transpose (C^T = B^T @ A^T).
  const Matrix read = transposed ? (shared_is_a ? a0 : b0).transposed() : (shared_is_a ? a0 : b0);
  if (read.row_major() || shared.stride(0) == 0) return shared;  // read in place (or broadcast)
  // A copy once, in the order the driver reads in place: row-major as read.
  Tensor copy =
      transposed ? empty_scratch({shared.size(0), shared.size(2), shared.size(1)}, shared.options())
                       .transpose(1, 2)
                 : empty_scratch(shared.sizes(), shared.options());
  for (int64_t g = 0; g < shared.size(0); ++g)
    copy_matrix(matrix_of(shared, g), matrix_of(copy, g));
  return copy;
}

bool microkernel_prefers_transposed_result(const Tensor& a, const Tensor& b, int64_t gemms) {
  const Matrix a0 = matrix_of(a, 0), b0 = matrix_of(b, 0);
  const Matrix row_major{nullptr, a0.rows, b0.cols, b0.cols, 1};
  const Matrix column_major{nullptr, a0.rows, b0.cols, 1, a0.rows};
  // A transposed result is copied into the result's order once more, at the end.
  return gemms * fewest_copies(column_major, a0, b0, /*accumulate=*/true) + column_major.size() <
         gemms * fewest_copies(row_major, a0, b0, /*accumulate=*/true);
}

void microkernel_gemm(const Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  TORCH_INTERNAL_ASSERT(out.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat &&
                        b.scalar_type() == at::kFloat && out.device().is_cpu());
  for (int64_t g = 0; g < out.size(0); ++g) {
    gemm_matrices(matrix_of(out, g), matrix_of(a, g), matrix_of(b, g), accumulate);
  }
}

}  // namespace torch_convbp
