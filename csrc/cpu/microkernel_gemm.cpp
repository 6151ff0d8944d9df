// The GEMM driver on oneDNN's micro-kernel (microkernel_gemm.h).
//
// The micro-kernel computes row-major C [m, n] (+)= A [m, k] @ B [k, n]. The driver cuts a GEMM
// into tiles of K (at most kMaxTileK) and of N (at most kTileBValues values of B a tile), so that a
// tile of B stays in a core's L2 while every row of A meets it, and calls the micro-kernel once per
// tile:
//
//   for each tile of K, in increasing k:        (the first one writes C, the others add to it)
//     for each tile of N:
//       C [M, n] (+)= A [M, k] @ B [k, n]       (one call; rows of A read in place)
//
// The orchestration hands it matrices in either orientation: in NHWC they are transposed views
// (matrices.h), and a weight gradient's columns arrive transposed. So the driver first picks the
// orientation that costs least (the elements it copies, and a partial vector at the end of C's
// rows, which the micro-kernel computes slowly): C = A @ B as it is, or C^T = B^T @ A^T, which
// swaps the operands and the orientation of each. In the orientation taken, C must be row-major
// (else the tiles go to a row-major copy of C, written back at the end); a column-major A is packed
// tile by tile, [kPackedRows, k] at a time, each element once; a column-major B likewise, [k, n] at
// a time. (Measured: benchmarks/NOTES.md, section 36.)
//
// In bfloat16 (where the CPU has bfloat16 arithmetic) the micro-kernel reads B in its VNNI layout,
// pairs of rows of K interleaved, so every tile of B is packed so; the products are summed in a
// float32 C, and a bfloat16 result is rounded once, after the last tile (section 38).
//
// The tiles depend on M, N and K alone, and the calls run on the calling thread: each element of
// C sums its products tile by tile in increasing k, the same way whichever thread runs the GEMM.
#include "../microkernel_gemm.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "../scratch.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "microkernel.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// A tile of B (at most kTileBValues floats, 128 KiB; half that in bfloat16) stays in a core's L2
// (1 MiB on an EPYC) beside the rows of A and C that stream through; tiles of 64 rows of a packed A
// are 64 KiB. Tiles of 64 to 256 columns and 256 or 512 of K ran within a few percent of each other
// on the suite's layers (benchmarks/NOTES.md, section 36), so tiles of K take kMaxTileK and tiles
// of N what the budget leaves: 128 columns beside 256 of K; where K is shorter (a 1x1 layer of 64
// channels) wider tiles, up to kMaxTileN, so that A is read once per tile of K where it was read
// per 128 columns: the steps of 1x1 64>256@56 and 256>64@56 took 0.96-0.97x the time (section 121).
constexpr int64_t kMaxTileK = 256;
constexpr int64_t kTileBValues = kMaxTileK * 128;
constexpr int64_t kMaxTileN = 512;
constexpr int64_t kPackedRows = 64;
constexpr int64_t kVector = 16;  // floats per AVX-512 register: tile widths are multiples of it

// A matrix of T: element (i, j) at data[i * row_stride + j * col_stride].
template <class T>
struct Matrix {
  T* data;
  int64_t rows, cols, row_stride, col_stride;

  Matrix transposed() const { return {data, cols, rows, col_stride, row_stride}; }
  T* at(int64_t i, int64_t j) const { return data + i * row_stride + j * col_stride; }
  // Row-major as the micro-kernel reads it: elements of a row adjacent, rows at least a row apart.
  bool row_major() const {
    return (cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols);
  }
  // Its leading dimension, where row_major().
  int64_t ld() const { return rows == 1 ? cols : row_stride; }
  int64_t size() const { return rows * cols; }
};
using Floats = Matrix<float>;
using Halves = Matrix<at::BFloat16>;

template <class T>
Matrix<T> matrix_of(const Tensor& batch, int64_t g) {
  return {batch.data_ptr<T>() + g * batch.stride(0), batch.size(1), batch.size(2), batch.stride(1),
          batch.stride(2)};
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

// The tiles of N beside tiles of K of k_tile values (kTileBValues).
Tiles n_tiles_beside(int64_t n, int64_t k_tile) {
  return tiles_of(n, std::min(kMaxTileN, kTileBValues / k_tile / kVector * kVector), kVector);
}

// The part of m of rows [r0, r0 + rows) and columns [c0, c0 + cols).
template <class T>
Matrix<T> part(const Matrix<T>& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  return {m.at(r0, c0), rows, cols, m.row_stride, m.col_stride};
}

// A dense row-major matrix of rows x cols in scratch memory (scratch.h), which `storage` holds.
template <class T>
Matrix<T> dense(int64_t rows, int64_t cols, Tensor& storage) {
  storage =
      empty_scratch({rows * cols}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
  return {storage.data_ptr<T>(), rows, cols, cols, 1};
}

// to = from (the same sizes), converting the elements (float32 to bfloat16 rounds to nearest
// even): row by row where both are row-major; by the transposing copy (transpose_copy_cpu.h)
// where one is row-major and the other column-major, of one type; else in blocks of 16 x 16
// elements that stay in L1, each block read along from's columns.
template <class From, class To>
void copy_matrix(const Matrix<From>& from, const Matrix<To>& to) {
  if (from.row_major() && to.row_major()) {
    for (int64_t i = 0; i < from.rows; ++i) {
      if constexpr (std::is_same_v<From, float> && std::is_same_v<To, at::BFloat16>) {
        round_to_bfloat16(from.at(i, 0), from.cols, to.at(i, 0));
        continue;
      }
      const From* row = from.at(i, 0);
      To* target = to.at(i, 0);
      for (int64_t j = 0; j < from.cols; ++j) target[j] = static_cast<To>(row[j]);
    }
    return;
  }
  if constexpr (std::is_same_v<From, To>) {
    if (from.row_major() && to.transposed().row_major()) {
      return transpose_matrix(from.data, from.ld(), to.data, to.transposed().ld(), from.rows,
                              from.cols, sizeof(From));
    }
    if (from.transposed().row_major() && to.row_major()) {
      return transpose_matrix(from.data, from.transposed().ld(), to.data, to.ld(), from.cols,
                              from.rows, sizeof(From));
    }
  }
  constexpr int64_t kBlock = 16;
  for (int64_t ib = 0; ib < from.rows; ib += kBlock) {
    const int64_t i_end = std::min(from.rows, ib + kBlock);
    for (int64_t jb = 0; jb < from.cols; jb += kBlock) {
      const int64_t j_end = std::min(from.cols, jb + kBlock);
      for (int64_t j = jb; j < j_end; ++j) {
        for (int64_t i = ib; i < i_end; ++i) *to.at(i, j) = static_cast<To>(*from.at(i, j));
      }
    }
  }
}

// c (+)= a @ b, c row-major, at most one of a and b not row-major (packed tile by tile).
void gemm_tiles(const Floats& c, const Floats& a, const Floats& b, bool accumulate) {
  const int64_t m = c.rows, n = c.cols, k = a.cols;
  const Tiles k_tiles = tiles_of(k, kMaxTileK, kVector), n_tiles = n_tiles_beside(n, k_tiles.size);
  const bool pack_a = !a.row_major(), pack_b = !b.row_major();
  Tensor storage;
  float* const packed = pack_a   ? dense<float>(kPackedRows, k_tiles.size, storage).data
                        : pack_b ? dense<float>(k_tiles.size, n_tiles.size, storage).data
                                 : nullptr;
  for (int64_t kt = 0; kt < k_tiles.count; ++kt) {
    const int64_t k0 = k_tiles.first(kt), kk = k_tiles.length(kt, k);
    const bool add = accumulate || kt > 0;
    if (pack_a) {  // each [kPackedRows, kk] tile of a packed once, then met by every tile of b
      for (int64_t m0 = 0; m0 < m; m0 += kPackedRows) {
        const int64_t mm = std::min(kPackedRows, m - m0);
        copy_matrix(part(a, m0, mm, k0, kk), Floats{packed, mm, kk, kk, 1});
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
        copy_matrix(part(b, k0, kk, n0, nn), Floats{packed, kk, nn, nn, 1});
        b_tile = packed;
      }
      // [m, nn] (+)= [m, kk] @ [kk, nn]
      micro_gemm(m, nn, kk, a.at(0, k0), a.ld(), b_tile, ldb, c.at(0, n0), c.ld(), add);
    }
  }
}

// The micro-kernel's rate falls where the rows of C end in a part of a vector: at M = 64,
// K = 256 on a Zen 4 EPYC, N = 147 ran at 0.83x the rate of N = 144 and 51 at 0.72x that of 48,
// where 48, 64, 96 and 128 ran alike (benchmarks/NOTES.md, section 114). In a product whose K is
// its longest side (a weight gradient's, over the pixels), that part costs about what
// kPartialVectorColumns whole columns do, and an element copied about what kMultiplyAddsPerCopy
// multiply-adds do (the stem's weight gradient: section 114). Where M is the pixels (a forward, an
// input gradient) the copies of the other orientation cost more than the part saves (a 1x1
// 96>24 forward took 1.12x the time transposed), and only the copies count.
constexpr int64_t kPartialVectorColumns = 24;
constexpr int64_t kMultiplyAddsPerCopy = 15;

// The cost of c (+)= a @ b in this orientation, in elements copied: all of c where it is not
// row-major (twice when accumulating: in and out), each operand that is not row-major, and, with
// K the longest side, the partial vector at the end of C's rows as copies.
template <class C, class T>
int64_t cost(const Matrix<C>& c, const Matrix<T>& a, const Matrix<T>& b, bool accumulate) {
  int64_t count = c.row_major() ? 0 : c.size() * (accumulate ? 2 : 1);
  if (!a.row_major()) count += a.size();
  if (!b.row_major()) count += b.size();
  const int64_t k = a.cols;
  if (c.cols % kVector != 0 && k >= c.rows && k >= c.cols) {
    count += c.rows * k * kPartialVectorColumns / kMultiplyAddsPerCopy;
  }
  return count;
}

// Whether C^T = B^T @ A^T costs less than C = A @ B.
template <class C, class T>
bool transposing_costs_less(const Matrix<C>& c, const Matrix<T>& a, const Matrix<T>& b,
                            bool accumulate) {
  return cost(c.transposed(), b.transposed(), a.transposed(), accumulate) <
         cost(c, a, b, accumulate);
}

// The least cost of c (+)= a @ b, in either orientation.
template <class C, class T>
int64_t least_cost(const Matrix<C>& c, const Matrix<T>& a, const Matrix<T>& b, bool accumulate) {
  return std::min(cost(c, a, b, accumulate),
                  cost(c.transposed(), b.transposed(), a.transposed(), accumulate));
}

// Rows `first` and `second` (n elements each; second null past an odd tile's end: zeros) as one
// pair of rows of the VNNI layout: pair[2j] = first[j], pair[2j + 1] = second[j]. Bits only:
// bfloat16 as 16-bit integers, which the compiler interleaves with vector instructions.
TORCH_CONVBP_VECTOR_CLONES void interleave_rows(const uint16_t* first, const uint16_t* second,
                                                int64_t n, uint16_t* pair) {
  if (second == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      pair[2 * j] = first[j];
      pair[2 * j + 1] = 0;
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    pair[2 * j] = first[j];
    pair[2 * j + 1] = second[j];
  }
}

// A tile of b [kk, nn] in the VNNI layout [ceil(kk/2)][nn][2], an odd kk's last pair completed
// with zeros: row by row where b is row-major, else element by element.
void pack_pairs(const Halves& tile, at::BFloat16* packed) {
  const int64_t kk = tile.rows, nn = tile.cols;
  if (tile.row_major()) {
    for (int64_t r = 0; r < kk; r += 2) {
      const auto row = [&](int64_t i) { return reinterpret_cast<const uint16_t*>(tile.at(i, 0)); };
      interleave_rows(row(r), r + 1 < kk ? row(r + 1) : nullptr, nn,
                      reinterpret_cast<uint16_t*>(packed + r * nn));
    }
    return;
  }
  for (int64_t r = 0; r < (kk + 1) / 2 * 2; ++r) {  // row r into slot r % 2 of pair r / 2
    at::BFloat16* pair = packed + (r / 2) * nn * 2 + r % 2;
    for (int64_t j = 0; j < nn; ++j) pair[2 * j] = r < kk ? *tile.at(r, j) : at::BFloat16(0.f);
  }
}

// A bfloat16 product's float32 sums are kept in blocks of at most kMaxBlockRows rows of c by
// panels of whole tiles of N, at most kMaxStagedSums floats (512 KiB): in L2 while every tile of
// K adds to them, a tile of a met by every tile of b in the panel; then rounded into c at once.
// Staged whole, the rounding went out to memory and back and took longer than the products; with
// a whole column of tiles of K per block, each tile of a left L2 before the next column met it
// (benchmarks/NOTES.md, section 53). Blocks of rows are multiples of 16: AMX's tiles are 16 rows.
constexpr int64_t kMaxBlockRows = 512;
constexpr int64_t kMaxStagedSums = 128 * 1024;

// The bfloat16 products on the micro-kernel: c (+)= a @ b, a row-major, the products summed in
// float32. The micro-kernel reads B in its VNNI layout, pairs of rows of K interleaved: tile
// [kk, nn] as [kk/2][nn][2], an odd kk padded with a row of zeros. So every tile of b is packed
// once: as it is met where c is one block of rows, else a panel's tiles before its blocks. Where
// K is odd the last tile of a is copied with a column of zeros, once. A float32 row-major c (a
// weight gradient's sums) takes the sums in place, as one block; any other c gets them block by
// block (kMaxStagedSums above):
//
//   for each panel of tiles of N, for each block of rows:
//     for each tile of K, in increasing k:   (the first one writes the sums, unless accumulating)
//       for each tile of N in the panel:  sums [mm, nn] (+)= A [mm, kk] @ B [kk, nn]
//     c's block (+)= its sums, rounded once
template <class C>
void gemm_tiles(const Matrix<C>& c, const Halves& a, const Halves& b, bool accumulate) {
  const int64_t m = c.rows, n = c.cols, k = a.cols;
  const Tiles k_tiles = tiles_of(k, kMaxTileK, kVector), n_tiles = n_tiles_beside(n, k_tiles.size);
  const int64_t even_tile = (k_tiles.size + 1) / 2 * 2;
  bool in_place = false;
  if constexpr (std::is_same_v<C, float>) in_place = c.row_major();
  // (fewer rows where a tile of N is wider than kMaxStagedSums / kMaxBlockRows: a short K's)
  const Tiles blocks =
      in_place ? Tiles{1, m}
               : tiles_of(m, std::min(kMaxBlockRows, kMaxStagedSums / n_tiles.size), kVector);
  const int64_t panel_tiles =
      in_place ? n_tiles.count
               : std::max<int64_t>(1, kMaxStagedSums / (blocks.size * n_tiles.size));
  Tensor a_storage, b_storage, sums_storage;
  const int64_t last = k_tiles.count - 1, last_k = k_tiles.length(last, k);
  Halves last_a = part(a, 0, m, k_tiles.first(last), last_k);
  if (last_k % 2 != 0) {  // an odd K: a zero column beside the last tile
    const Halves padded = dense<at::BFloat16>(m, last_k + 1, a_storage);
    copy_matrix(last_a, part(padded, 0, m, 0, last_k));
    for (int64_t i = 0; i < m; ++i) *padded.at(i, last_k) = at::BFloat16(0.f);
    last_a = padded;
  }
  // tile (kt, nt) of a panel at packed + (kt * panel_tiles + nt - p0) * tile_size, where packed
  // before the blocks; else every tile at packed, packed as it is met
  const bool pack_panels = blocks.count > 1;
  const int64_t tile_size = even_tile * n_tiles.size;
  at::BFloat16* const packed =
      dense<at::BFloat16>(pack_panels ? k_tiles.count * panel_tiles : 1, tile_size, b_storage).data;
  const auto pack = [&](int64_t kt, int64_t nt, at::BFloat16* tile) {
    pack_pairs(
        part(b, k_tiles.first(kt), k_tiles.length(kt, k), n_tiles.first(nt), n_tiles.length(nt, n)),
        tile);
    return tile;
  };
  float* const staged =
      in_place ? nullptr : dense<float>(blocks.size, panel_tiles * n_tiles.size, sums_storage).data;
  for (int64_t p0 = 0; p0 < n_tiles.count; p0 += panel_tiles) {
    const int64_t p_end = std::min(n_tiles.count, p0 + panel_tiles);
    const int64_t col0 = n_tiles.first(p0), cols = std::min(n, n_tiles.first(p_end)) - col0;
    const auto panel_tile = [&](int64_t kt, int64_t nt) {
      return packed + (kt * panel_tiles + nt - p0) * tile_size;
    };
    for (int64_t kt = 0; pack_panels && kt < k_tiles.count; ++kt) {
      for (int64_t nt = p0; nt < p_end; ++nt) pack(kt, nt, panel_tile(kt, nt));
    }
    for (int64_t mb = 0; mb < blocks.count; ++mb) {
      const int64_t m0 = blocks.first(mb), mm = blocks.length(mb, m);
      const Matrix<C> c_panel = part(c, m0, mm, col0, cols);
      Floats sums{staged, mm, cols, cols, 1};
      if constexpr (std::is_same_v<C, float>) {
        if (in_place) sums = c_panel;
      }
      if (!in_place && accumulate) copy_matrix(c_panel, sums);
      for (int64_t kt = 0; kt < k_tiles.count; ++kt) {
        const Halves a_tile = kt == last ? part(last_a, m0, mm, 0, last_a.cols)
                                         : part(a, m0, mm, k_tiles.first(kt), k_tiles.size);
        for (int64_t nt = p0; nt < p_end; ++nt) {
          const at::BFloat16* tile = pack_panels ? panel_tile(kt, nt) : pack(kt, nt, packed);
          const int64_t n0 = n_tiles.first(nt), nn = n_tiles.length(nt, n);
          const Floats target = part(sums, 0, mm, n0 - col0, nn);
          // [mm, nn] (+)= [mm, even] @ [even, nn]
          micro_gemm(mm, nn, a_tile.cols, a_tile.data, a_tile.ld(), tile, nn, target.data,
                     target.ld(), accumulate || kt > 0);
        }
      }
      if (!in_place) copy_matrix(sums, c_panel);
    }
  }
  release_microkernel(/*vnni=*/true);
}

// c (+)= a @ b for matrices of any orientation: in the orientation that costs least, and a
// row-major where the tiles would pack b (else a copied whole, once). Float32 products go into c
// where it is row-major, else into a row-major copy of c, written back at the end; bfloat16 ones
// stage their sums block by block (gemm_tiles above), which rounds a bfloat16 c once.
template <class C, class T>
void gemm_matrices(Matrix<C> c, Matrix<T> a, Matrix<T> b, bool accumulate) {
  if (c.size() == 0) return;
  if (a.cols == 0) {  // no products: a zero result
    if (!accumulate) {
      for (int64_t i = 0; i < c.rows; ++i) {
        for (int64_t j = 0; j < c.cols; ++j) *c.at(i, j) = C(0.f);
      }
    }
    return;
  }
  if (transposing_costs_less(c, a, b, accumulate)) {  // C^T = B^T @ A^T
    std::swap(a, b);
    a = a.transposed();
    b = b.transposed();
    c = c.transposed();
  }
  constexpr bool kHalves = std::is_same_v<T, at::BFloat16>;  // whose tiles pack b always
  Tensor a_copy, c_copy;
  if (!a.row_major() && (kHalves || !b.row_major())) {  // copied whole
    const Matrix<T> copy = dense<T>(a.rows, a.cols, a_copy);
    copy_matrix(a, copy);
    a = copy;
  }
  if constexpr (kHalves) {
    gemm_tiles(c, a, b, accumulate);  // which stages its own blocks of c
    return;
  } else if (c.row_major()) {
    gemm_tiles(c, a, b, accumulate);
    return;
  }
  const Floats staged = dense<float>(c.rows, c.cols, c_copy);  // the tiles' row-major result
  if (accumulate) copy_matrix(c, staged);
  gemm_tiles(staged, a, b, accumulate);
  if (c.row_major()) {
    copy_matrix(staged, c);
  } else {
    copy_matrix(staged.transposed(), c.transposed());  // along c's columns, which are adjacent
  }
}

// Runs body with the matrices of the tensors' element types: float32 operands (a float32 result),
// or bfloat16 ones (a float32 or bfloat16 result).
template <class Body>
void with_element_types(const Tensor& out, const Tensor& a, Body&& body) {
  if (a.scalar_type() == at::kFloat) {
    body(float{}, float{});
  } else if (out.scalar_type() == at::kFloat) {
    body(float{}, at::BFloat16{});
  } else {
    body(at::BFloat16{}, at::BFloat16{});
  }
}

}  // namespace

Tensor microkernel_shared_operand(const Tensor& out, const Tensor& a, const Tensor& b,
                                  bool shared_is_a, bool accumulate) {
  const Tensor& shared = shared_is_a ? a : b;
  Tensor result = shared;
  with_element_types(out, a, [&](auto c_type, auto ab_type) {
    using C = decltype(c_type);
    using T = decltype(ab_type);
    const Matrix<T> a0 = matrix_of<T>(a, 0), b0 = matrix_of<T>(b, 0);
    const bool transposed = transposing_costs_less(matrix_of<C>(out, 0), a0, b0, accumulate);
    // Its role there: read as it is (direct), or as its transpose (C^T = B^T @ A^T).
    const Matrix<T> read =
        transposed ? (shared_is_a ? a0 : b0).transposed() : (shared_is_a ? a0 : b0);
    if (read.row_major() || shared.stride(0) == 0) return;  // read in place (or broadcast)
    // A copy once, in the order the driver reads in place: row-major as read.
    result = transposed
                 ? empty_scratch({shared.size(0), shared.size(2), shared.size(1)}, shared.options())
                       .transpose(1, 2)
                 : empty_scratch(shared.sizes(), shared.options());
    for (int64_t g = 0; g < shared.size(0); ++g) {
      copy_matrix(matrix_of<T>(shared, g), matrix_of<T>(result, g));
    }
  });
  return result;
}

bool microkernel_prefers_transposed_result(const Tensor& a, const Tensor& b, int64_t gemms) {
  bool transposed = false;
  with_element_types(a, a, [&](auto, auto ab_type) {  // the result's type does not matter here
    using T = decltype(ab_type);
    const Matrix<T> a0 = matrix_of<T>(a, 0), b0 = matrix_of<T>(b, 0);
    const Floats row_major{nullptr, a0.rows, b0.cols, b0.cols, 1};
    const Floats column_major{nullptr, a0.rows, b0.cols, 1, a0.rows};
    // A transposed result is copied into the result's order once more, at the end.
    transposed =
        gemms * least_cost(column_major, a0, b0, /*accumulate=*/true) + column_major.size() <
        gemms * least_cost(row_major, a0, b0, /*accumulate=*/true);
  });
  return transposed;
}

void microkernel_gemm(const Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  TORCH_INTERNAL_ASSERT(out.device().is_cpu() && a.scalar_type() == b.scalar_type() &&
                        (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16) &&
                        (out.scalar_type() == at::kFloat || out.scalar_type() == a.scalar_type()));
  with_element_types(out, a, [&](auto c_type, auto ab_type) {
    using C = decltype(c_type);
    using T = decltype(ab_type);
    for (int64_t g = 0; g < out.size(0); ++g) {
      gemm_matrices(matrix_of<C>(out, g), matrix_of<T>(a, g), matrix_of<T>(b, g), accumulate);
    }
  });
}

void interleave_pair_of_rows(const uint16_t* first, const uint16_t* second, int64_t n,
                             uint16_t* pair) {
  interleave_rows(first, second, n, pair);
}

}  // namespace torch_convbp
