// The transposing copy of a batch of matrices, target[b, j, i] = source[b, i, j]: how an operand
// or a result changes between NCHW and channels_last (layout.h, to_memory_format). ATen's copy
// walks one of the two tensors with a long stride, and took 5-15x a copy's time on the video
// layers' activations (benchmarks/NOTES.md, section 30). Here the matrices are cut into tiles of
// 32 x 32 elements, which sit in L1 while a tile's target rows are written one after another.
// A copy moves bits: the kernel sees elements only by their size.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

#include "../checks.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

using at::Tensor;

constexpr int64_t kTile = 32;
constexpr int64_t kTilesPerTask = 16;  // 16K elements: enough for a thread

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
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles_per_matrix = row_tiles * col_tiles;
  at::parallel_for(0, batch * tiles_per_matrix, kTilesPerTask, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t b = t / tiles_per_matrix;
      const int64_t i0 = t % tiles_per_matrix / col_tiles * kTile, j0 = t % col_tiles * kTile;
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {  // a target row at a time: its writes are contiguous
        Bits* to = target.row(b, j);
        for (int64_t i = i0; i < i1; ++i) to[i] = source.row(b, i)[j];
      }
    }
  });
}

template <class Bits>
void transpose_as(const Tensor& source, const Tensor& target) {
  const Matrices<const Bits> from{static_cast<const Bits*>(source.const_data_ptr()),
                                  source.stride(0), source.stride(1)};
  const Matrices<Bits> to{static_cast<Bits*>(target.mutable_data_ptr()), target.stride(0),
                          target.stride(1)};
  transpose_tiles(from, to, source.size(0), source.size(1), source.size(2));
}

}  // namespace

void transpose_copy_cpu(const Tensor& source, const Tensor& target) {
  check_transpose_copy("torch_convbp.transpose_copy", source, target);
  switch (source.element_size()) {
    case 1: return transpose_as<uint8_t>(source, target);
    case 2: return transpose_as<uint16_t>(source, target);
    case 4: return transpose_as<uint32_t>(source, target);
    case 8: return transpose_as<uint64_t>(source, target);
    default: TORCH_CHECK(false, "unreachable: check_transpose_copy admits 1- to 8-byte elements");
  }
}

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) { m.impl("transpose_copy", &transpose_copy_cpu); }

}  // namespace torch_convbp
