// The transposing copy of a batch of matrices, target[b, j, i] = source[b, i, j]: how an operand
// or a result changes between NCHW and channels_last (layout.h, to_memory_format), and how the
// GEMM driver lays out an operand it reads the other way (microkernel_gemm.cpp). ATen's copy
// walks one of the two tensors with a long stride, and took 5-15x a copy's time on the video
// layers' activations (benchmarks/NOTES.md, section 30). Here the matrices are cut into tiles of
// 64 source rows by 32 columns, which sit in L1 while they are transposed in squares of
// registers, and whose 64 rows make each target row's run 256 bytes of float32: from memory that
// took 0.8-0.9x the time of 32 x 32 tiles' runs of 128 bytes (section 85). The squares: 8 x 8
// 16-bit elements, 4 x 4 of 32 bits, 2 x 2 of 64 (SSE2's unpacks, which every x86-64 CPU has),
// the edges and 8-bit elements one at a time. Element by element, a 16-bit tile's strided reads
// took 10% of a bfloat16 weight gradient (section 60). A copy moves bits: the kernel sees
// elements only by their size.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "../checks.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// A matrix's tiles: kTileRows x kTileColumns (also each (g, a)'s [B, taps] of transpose_taps
// where B is the target's contiguous dimension); the taps' other copies take pieces of kTile.
constexpr int64_t kTileRows = 64, kTileColumns = 32;
constexpr int64_t kTile = 32;
constexpr int64_t kTileElementsPerTask = 16 * 1024;  // enough for a thread

// The side of the square of Bits that Square<Bits>::transpose moves through registers: none (0)
// without SSE2, or for bytes.
template <class Bits>
struct Square {
  static constexpr int64_t side = 0;
};

#if defined(__SSE2__)
inline __m128i load(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline void store(void* p, __m128i v) { _mm_storeu_si128(static_cast<__m128i*>(p), v); }

template <>
struct Square<uint16_t> {
  static constexpr int64_t side = 8;
  // Rows r0..r7 of 8 elements: pairs of rows interleaved by elements, the pairs by pairs, the
  // quads by quads; each step doubles the run of one column's elements.
  static void transpose(const uint16_t* from, int64_t from_stride, uint16_t* to,
                        int64_t to_stride) {
    __m128i r[8], a[8], b[8];
    for (int i = 0; i < 8; ++i) r[i] = load(from + i * from_stride);
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);      // columns 0-3 of rows 2i, 2i+1
      a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);  // columns 4-7
    }
    for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1)
      const __m128i* q = a + 4 * h;
      b[4 * h + 0] = _mm_unpacklo_epi32(q[0], q[2]);  // columns 0, 1 of the four rows
      b[4 * h + 1] = _mm_unpackhi_epi32(q[0], q[2]);  // columns 2, 3
      b[4 * h + 2] = _mm_unpacklo_epi32(q[1], q[3]);  // columns 4, 5
      b[4 * h + 3] = _mm_unpackhi_epi32(q[1], q[3]);  // columns 6, 7
    }
    for (int j = 0; j < 4; ++j) {  // column 2j, then 2j + 1, of all eight rows
      store(to + (2 * j) * to_stride, _mm_unpacklo_epi64(b[j], b[4 + j]));
      store(to + (2 * j + 1) * to_stride, _mm_unpackhi_epi64(b[j], b[4 + j]));
    }
  }
};

template <>
struct Square<uint32_t> {
  static constexpr int64_t side = 4;
  static void transpose(const uint32_t* from, int64_t from_stride, uint32_t* to,
                        int64_t to_stride) {
    const __m128i r0 = load(from), r1 = load(from + from_stride), r2 = load(from + 2 * from_stride),
                  r3 = load(from + 3 * from_stride);
    const __m128i a0 = _mm_unpacklo_epi32(r0, r1), a1 = _mm_unpackhi_epi32(r0, r1);
    const __m128i a2 = _mm_unpacklo_epi32(r2, r3), a3 = _mm_unpackhi_epi32(r2, r3);
    store(to, _mm_unpacklo_epi64(a0, a2));
    store(to + to_stride, _mm_unpackhi_epi64(a0, a2));
    store(to + 2 * to_stride, _mm_unpacklo_epi64(a1, a3));
    store(to + 3 * to_stride, _mm_unpackhi_epi64(a1, a3));
  }
};

template <>
struct Square<uint64_t> {
  static constexpr int64_t side = 2;
  static void transpose(const uint64_t* from, int64_t from_stride, uint64_t* to,
                        int64_t to_stride) {
    const __m128i r0 = load(from), r1 = load(from + from_stride);
    store(to, _mm_unpacklo_epi64(r0, r1));
    store(to + to_stride, _mm_unpackhi_epi64(r0, r1));
  }
};
#endif

// One tile (at most kTileRows x kTileColumns, or kTile rows of a kernel's taps for
// transpose_taps_cpu): its whole squares through registers, the rest one by one.
template <class Bits>
void transpose_tile(const Bits* from, int64_t from_stride, Bits* to, int64_t to_stride,
                    int64_t rows, int64_t cols) {
  constexpr int64_t side = Square<Bits>::side;
  int64_t square_rows = 0, square_cols = 0;
  if constexpr (side > 0) {
    square_rows = rows / side * side;
    square_cols = cols / side * side;
    for (int64_t j = 0; j < square_cols; j += side) {  // down a column of squares: target rows
      for (int64_t i = 0; i < square_rows; i += side) {
        Square<Bits>::transpose(from + i * from_stride + j, from_stride, to + j * to_stride + i,
                                to_stride);
      }
    }
  }
  for (int64_t j = 0; j < cols; ++j) {  // a target row at a time: its writes are contiguous
    Bits* target = to + j * to_stride;
    for (int64_t i = j < square_cols ? square_rows : 0; i < rows; ++i) {
      target[i] = from[i * from_stride + j];
    }
  }
}

// A whole matrix, tile by tile on the calling thread.
template <class Bits>
void transpose_by_tiles(const Bits* from, int64_t from_stride, Bits* to, int64_t to_stride,
                        int64_t rows, int64_t cols) {
  for (int64_t i0 = 0; i0 < rows; i0 += kTileRows) {
    for (int64_t j0 = 0; j0 < cols; j0 += kTileColumns) {
      transpose_tile(from + i0 * from_stride + j0, from_stride, to + j0 * to_stride + i0, to_stride,
                     std::min(kTileRows, rows - i0), std::min(kTileColumns, cols - j0));
    }
  }
}

// to[t * to_stride] = from[t] for t < taps: a kernel's taps, reversed where to_stride is -1.
template <class Bits>
void copy_taps(const Bits* from, Bits* to, int64_t to_stride, int64_t taps) {
  if (to_stride == 1) {
    std::copy(from, from + taps, to);
  } else if (to_stride == -1) {
    std::reverse_copy(from, from + taps, to - (taps - 1));
  } else {
    for (int64_t t = 0; t < taps; ++t) to[t * to_stride] = from[t];
  }
}

// A [rows, cols] matrix of elements of type Bits, whose rows lie `stride` elements apart.
template <class Bits>
struct Matrices {
  Bits* data;
  int64_t batch_stride, row_stride;
  Bits* row(int64_t b, int64_t i) const { return data + b * batch_stride + i * row_stride; }
};

template <class Bits>
void transpose_tiles(Matrices<const Bits> source, Matrices<Bits> target, int64_t batch,
                     int64_t rows, int64_t cols) {
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (cols + kTileColumns - 1) / kTileColumns;
  const int64_t tiles_per_matrix = row_tiles * col_tiles;
  const int64_t tiles_per_task = kTileElementsPerTask / (kTileRows * kTileColumns);
  at::parallel_for(0, batch * tiles_per_matrix, tiles_per_task, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t b = t / tiles_per_matrix;
      const int64_t i0 = t % tiles_per_matrix / col_tiles * kTileRows;
      const int64_t j0 = t % col_tiles * kTileColumns;
      transpose_tile(source.row(b, i0) + j0, source.row_stride, target.row(b, j0) + i0,
                     target.row_stride, std::min(kTileRows, rows - i0),
                     std::min(kTileColumns, cols - j0));
    }
  });
}

// body(Bits{}) with Bits the unsigned integer of `element_size` bytes (1, 2, 4 or 8).
template <class Body>
void with_bits(int64_t element_size, const char* op, Body&& body) {
  switch (element_size) {
    case 1: return body(uint8_t{});
    case 2: return body(uint16_t{});
    case 4: return body(uint32_t{});
    case 8: return body(uint64_t{});
    default: TORCH_CHECK(false, op, ": elements of 1, 2, 4 or 8 bytes, not ", element_size);
  }
}

}  // namespace

void transpose_copy_cpu(const Tensor& source, const Tensor& target) {
  constexpr const char* op = "torch_convbp.transpose_copy";
  check_transpose_copy(op, source, target);
  with_bits(source.element_size(), op, [&](auto bits) {
    using Bits = decltype(bits);
    const Matrices<const Bits> from{static_cast<const Bits*>(source.const_data_ptr()),
                                    source.stride(0), source.stride(1)};
    const Matrices<Bits> to{static_cast<Bits*>(target.mutable_data_ptr()), target.stride(0),
                            target.stride(1)};
    transpose_tiles(from, to, source.size(0), source.size(1), source.size(2));
  });
}

void transpose_matrix(const void* source, int64_t source_stride, void* target,
                      int64_t target_stride, int64_t rows, int64_t cols, int64_t element_size) {
  with_bits(element_size, "transpose_matrix", [&](auto bits) {
    using Bits = decltype(bits);
    transpose_by_tiles(static_cast<const Bits*>(source), source_stride, static_cast<Bits*>(target),
                       target_stride, rows, cols);
  });
}

// target[g, b, a, t] = source[g, a, b, t'] with t' = t, or taps-1-t: the source's tap t' is
// written to the target's tap t, whose stride is negated from the last tap for a reversal. One
// pass, where ATen's flip and its copy of the transposed view were two, each of a few GB/s: a
// fifth of the 512@7 layer's input gradient (benchmarks/NOTES.md, section 63). By the target's
// contiguous dimension:
// - B (the implicit route's input gradient, [taps, A, B]): each (g, a)'s contiguous [B, taps]
//   transposed;
// - A (a tap matrix [B, A] per tap, as the implicit route's forward reads it, or the NHWC
//   weight [B, taps, A]): for kTile rows a of the source, each b's [kTile, taps] transposed, so
//   that the rows are read along, B * taps apart;
// - otherwise (taps last: the NCHW weight [B, A, taps]): for kTile columns b, each a's kTile
//   runs of taps (one contiguous piece of the source) copied into the kTile target rows.
void transpose_taps_cpu(const Tensor& source, const Tensor& target, bool reverse_taps) {
  constexpr const char* op = "torch_convbp.transpose_taps";
  check_transpose_taps(op, source, target);
  const int64_t groups = source.size(0), a_size = source.size(1), b_size = source.size(2);
  const int64_t taps = source.size(3);
  if (target.numel() == 0) return;
  const int64_t sg = target.stride(0), sb = target.stride(1), sa = target.stride(2);
  const int64_t st = reverse_taps ? -target.stride(3) : target.stride(3);
  const int64_t first_tap = reverse_taps ? (taps - 1) * target.stride(3) : 0;
  const bool b_last = b_size > 1 && sb == 1, a_last = !b_last && a_size > 1 && sa == 1;
  // a piece: one (g, a) where B is last, else kTile rows a (A last) or columns b (taps last)
  const int64_t per_group = b_last ? a_size : ((a_last ? a_size : b_size) + kTile - 1) / kTile;
  const int64_t piece_size = b_last ? b_size * taps : kTile * (a_last ? b_size : a_size) * taps;
  const int64_t grain = std::max<int64_t>(1, kTileElementsPerTask / piece_size);
  with_bits(source.element_size(), op, [&](auto bits) {
    using Bits = decltype(bits);
    const Bits* from = static_cast<const Bits*>(source.const_data_ptr());
    Bits* to = static_cast<Bits*>(target.mutable_data_ptr()) + first_tap;
    const auto source_at = [&](int64_t g, int64_t a, int64_t b) {
      return from + ((g * a_size + a) * b_size + b) * taps;
    };
    at::parallel_for(0, groups * per_group, grain, [&](int64_t begin, int64_t end) {
      for (int64_t piece = begin; piece < end; ++piece) {
        const int64_t g = piece / per_group, first = piece % per_group;
        Bits* group = to + g * sg;
        if (b_last) {
          transpose_by_tiles(source_at(g, first, 0), taps, group + first * sa, st, b_size, taps);
        } else if (a_last) {
          const int64_t a0 = first * kTile, rows = std::min(kTile, a_size - a0);
          for (int64_t b = 0; b < b_size; ++b) {
            transpose_tile(source_at(g, a0, b), b_size * taps, group + b * sb + a0, st, rows, taps);
          }
        } else {
          const int64_t b0 = first * kTile, columns = std::min(kTile, b_size - b0);
          for (int64_t a = 0; a < a_size; ++a) {
            const Bits* runs = source_at(g, a, b0);
            for (int64_t b = 0; b < columns; ++b) {
              copy_taps(runs + b * taps, group + (b0 + b) * sb + a * sa, st, taps);
            }
          }
        }
      }
    });
  });
}

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("transpose_copy", &transpose_copy_cpu);
  m.impl("transpose_taps", &transpose_taps_cpu);
}

}  // namespace torch_convbp
