// The CUDA depthwise forward and input gradient on tiles in shared memory (one input channel
// per output channel): a block computes a tile of results, a block of channels x rows x columns
// of one image, from a window of its source (the input for the forward, the output gradient for
// the input gradient) that the block first copies into shared memory. Each source element is
// then read once from global memory per tile instead of once per tap of every result that uses
// it, and a thread's index arithmetic is done once for its whole column of results
// (benchmarks/NOTES.md, section 72).
//
// Every result is the sum of the element kernels (depthwise_thread.h), in the same order, with
// the same taps skipped: the forward sums its taps in (ki, kj) order, the input gradient gathers
// in (ki, kj) order what the forward took from its element. So both kernels give the same bits,
// and the same as the CPU's.
//
// The tile's functors run under a Launcher's tiles() (launch.h): origin(tile) once per tile,
// load(origin, e, shared) for every element e of the window, a barrier, compute(origin, thread,
// shared) for every thread of the block, a barrier.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstddef>
#include <optional>

#include "../summation.h"
#include "../taps.h"
#include "depthwise_thread.h"
#include "launch.h"

namespace torch_convbp {

// The shared memory a block may take without asking the driver for more.
constexpr int64_t kTileSharedBytes = 48 * 1024;
// Rows of results per thread at most: a thread sums them together, its rows' sums independent
// chains of multiply-adds in flight at once, each tap's weight and column read once for them all.
constexpr int kTileRowsPerThread = 8;

// The first result (n, channel, row, column) of a tile, and the first row and column of the
// window of the source that it reads.
template <typename index_t>
struct TileOrigin {
  index_t n, channel, row, column, window_row, window_column;
};

// Where a thread of the block works: a (channel, column) of the tile, and its phase, the first
// of the rows phase, phase + phases, ... that it computes.
template <typename index_t>
struct TileSlot {
  index_t channel, column, phase;
};

// A call's tiles, the same for every tile: sizes fixed by the call's shape, never by the GPU.
template <typename index_t>
struct TileGeometry {
  index_t channels, rows, columns;  // a tile's results
  index_t phases;                   // kThreads / (channels * columns)
  index_t window_rows, window_columns;
  index_t channel_tiles, row_tiles, column_tiles;
  bool channels_last;  // the window in shared memory as [rows][columns][channels], else
                       // [channels][rows][columns]: adjacent threads read adjacent elements

  C10_HOST_DEVICE index_t count(index_t batch) const {
    return batch * channel_tiles * row_tiles * column_tiles;
  }
  C10_HOST_DEVICE index_t shared_elements() const {
    return channels * window_rows * window_columns;
  }
  C10_HOST_DEVICE index_t shared_at(index_t k, index_t r, index_t col) const {
    return channels_last ? (r * window_columns + col) * channels + k
                         : (k * window_rows + r) * window_columns + col;
  }
  // Element e of the window in shared memory, as (channel k, row r, column col) of the window.
  C10_HOST_DEVICE void window_position(index_t e, index_t& k, index_t& r, index_t& col) const {
    if (channels_last) {
      k = e % channels;
      const index_t pixel = e / channels;
      r = pixel / window_columns;
      col = pixel - r * window_columns;
    } else {
      col = e % window_columns;
      const index_t rest = e / window_columns;
      r = rest % window_rows;
      k = rest / window_rows;
    }
  }
  // Tile `tile`'s first result (columns fastest, then rows, channels, images); the window's
  // corner is the functor's to fill in.
  C10_HOST_DEVICE TileOrigin<index_t> first(index_t tile) const {
    const index_t column_tile = tile % column_tiles;
    tile /= column_tiles;
    const index_t row_tile = tile % row_tiles;
    tile /= row_tiles;
    const index_t channel_tile = tile % channel_tiles;
    return {tile / channel_tiles,
            channel_tile * channels,
            row_tile * rows,
            column_tile * columns,
            0,
            0};
  }
  // Thread `thread`'s slot: NHWC adjacent threads take adjacent channels, NCHW adjacent columns.
  C10_HOST_DEVICE TileSlot<index_t> slot(index_t thread) const {
    const index_t slots = channels * columns, s = thread % slots;
    if (channels_last) return {s % channels, s / channels, thread / slots};
    return {s / columns, s % columns, thread / slots};
  }
};

// floor(a / b) for b > 0 and a of either sign.
template <typename index_t>
C10_HOST_DEVICE inline index_t floor_div(index_t a, index_t b) {
  const index_t q = a / b;
  return q * b > a ? q - 1 : q;
}

// How many of a thread's rows j (tile row phase + j * phases) lie inside the tile and inside the
// `left` result rows from the tile's first on: at most kTileRowsPerThread (the tiles' rows are
// at most phases * kTileRowsPerThread).
template <typename index_t>
C10_HOST_DEVICE inline index_t tile_rows_of(const TileGeometry<index_t>& g, index_t phase,
                                            index_t left) {
  const index_t last = g.rows < left ? g.rows : left;  // rows [0, last) of the tile
  return last > phase ? (last - phase + g.phases - 1) / g.phases : 0;
}

// The source element (n, c, h, w), or zero outside the source's plane (never summed: the
// results skip those taps, as the element kernels do).
template <typename scalar_t, typename index_t>
C10_HOST_DEVICE inline scalar_t source_or_zero(const scalar_t* source, bool channels_last,
                                               index_t n, index_t c, index_t channels, index_t h,
                                               index_t w, index_t height, index_t width) {
  if (c >= channels || h < 0 || h >= height || w < 0 || w >= width) return scalar_t(0);
  return source[plane_of(channels_last, n, c, channels, height, width).at(h, w)];
}

// The forward: result (n, c, oh, ow) = sum over (ki, kj) of weight (c, ki, kj) * input (n, c,
// oh * stride - pad + k * dilation, ...), as DepthwiseOutput. Its window: the input rows from
// row * stride_h - pad_h on, (rows - 1) * stride_h + (kh - 1) * dilation_h + 1 of them.
template <typename scalar_t, typename index_t>
struct DepthwiseForwardTile {
  using shared_t = scalar_t;
  const scalar_t* input;
  const scalar_t* weight;
  scalar_t* output;
  DepthwiseDims<index_t> s;
  TileGeometry<index_t> g;

  C10_HOST_DEVICE TileOrigin<index_t> origin(index_t tile) const {
    TileOrigin<index_t> o = g.first(tile);
    o.window_row = o.row * s.stride_h - s.pad_h;
    o.window_column = o.column * s.stride_w - s.pad_w;
    return o;
  }
  C10_HOST_DEVICE void load(const TileOrigin<index_t>& o, index_t e, scalar_t* shared) const {
    index_t k, r, col;
    g.window_position(e, k, r, col);
    shared[e] = source_or_zero(input, s.channels_last, o.n, o.channel + k, s.channels,
                               o.window_row + r, o.window_column + col, s.height, s.width);
  }
  C10_HOST_DEVICE void compute(const TileOrigin<index_t>& o, index_t thread,
                               const scalar_t* shared) const {
    using acc_t = at::opmath_type<scalar_t>;
    const TileSlot<index_t> t = g.slot(thread);
    const index_t c = o.channel + t.channel, ow = o.column + t.column;
    if (c >= s.out_channels || ow >= s.out_width) return;
    const scalar_t* w = weight + c * s.kernel_h * s.kernel_w;
    // The thread's rows j: tile row t.phase + j * phases, where it is inside the tile and output.
    const index_t rows = tile_rows_of(g, t.phase, s.out_height - o.row);
    acc_t sum[kTileRowsPerThread] = {};
    for (index_t ki = 0; ki < s.kernel_h; ++ki) {
      for (index_t kj = 0; kj < s.kernel_w; ++kj) {
        const index_t iw = input_index(ow, s.stride_w, s.pad_w, kj, s.dilation_w);
        if (iw < 0 || iw >= s.width) continue;
        const acc_t weight_value = static_cast<acc_t>(w[ki * s.kernel_w + kj]);
#pragma unroll
        for (int j = 0; j < kTileRowsPerThread; ++j) {
          const index_t oh = o.row + t.phase + j * g.phases;
          const index_t ih = input_index(oh, s.stride_h, s.pad_h, ki, s.dilation_h);
          if (j >= rows || ih < 0 || ih >= s.height) continue;
          const scalar_t x =
              shared[g.shared_at(t.channel, ih - o.window_row, iw - o.window_column)];
          sum[j] = multiply_add(weight_value, static_cast<acc_t>(x), sum[j]);
        }
      }
    }
    const auto y = plane_of(s.channels_last, o.n, c, s.out_channels, s.out_height, s.out_width);
#pragma unroll
    for (int j = 0; j < kTileRowsPerThread; ++j) {
      if (j < rows)
        output[y.at(o.row + t.phase + j * g.phases, ow)] = static_cast<scalar_t>(sum[j]);
    }
  }
};

// The input gradient: result (n, c, ih, iw) = the sum over (ki, kj), in that order, of weight
// (c, ki, kj) * grad_output (n, c, oh, ow) where the forward read (ih, iw) at that tap, as
// DepthwiseInputGrad with one output channel per input channel. Its window: the output-gradient
// rows from ceil((row + pad_h - (kh - 1) * dilation_h) / stride_h) on, at most
// floor((rows - 1 + (kh - 1) * dilation_h) / stride_h) + 1 of them.
template <typename scalar_t, typename index_t>
struct DepthwiseInputGradTile {
  using shared_t = scalar_t;
  const scalar_t* grad_output;
  const scalar_t* weight;
  scalar_t* grad_input;
  DepthwiseDims<index_t> s;
  TileGeometry<index_t> g;

  C10_HOST_DEVICE TileOrigin<index_t> origin(index_t tile) const {
    TileOrigin<index_t> o = g.first(tile);
    o.window_row =
        -floor_div<index_t>((s.kernel_h - 1) * s.dilation_h - o.row - s.pad_h, s.stride_h);
    o.window_column =
        -floor_div<index_t>((s.kernel_w - 1) * s.dilation_w - o.column - s.pad_w, s.stride_w);
    return o;
  }
  C10_HOST_DEVICE void load(const TileOrigin<index_t>& o, index_t e, scalar_t* shared) const {
    index_t k, r, col;
    g.window_position(e, k, r, col);
    shared[e] = source_or_zero(grad_output, s.channels_last, o.n, o.channel + k, s.out_channels,
                               o.window_row + r, o.window_column + col, s.out_height, s.out_width);
  }
  C10_HOST_DEVICE void compute(const TileOrigin<index_t>& o, index_t thread,
                               const scalar_t* shared) const {
    using acc_t = at::opmath_type<scalar_t>;
    const TileSlot<index_t> t = g.slot(thread);
    const index_t c = o.channel + t.channel, iw = o.column + t.column;
    if (c >= s.channels || iw >= s.width) return;
    const scalar_t* w = weight + c * s.kernel_h * s.kernel_w;
    const index_t rows = tile_rows_of(g, t.phase, s.height - o.row);
    // Each row's output rows, stepped tap by tap, and the column's, found once.
    OutputIndexByTap<index_t> height[kTileRowsPerThread];
#pragma unroll
    for (int j = 0; j < kTileRowsPerThread; ++j) {
      height[j] = OutputIndexByTap<index_t>(o.row + t.phase + j * g.phases, s.pad_h, s.dilation_h,
                                            s.stride_h);
    }
    const OutputIndexByTap<index_t> first_column(iw, s.pad_w, s.dilation_w, s.stride_w);
    acc_t sum[kTileRowsPerThread] = {};
    for (index_t ki = 0; ki < s.kernel_h; ++ki) {
      OutputIndexByTap<index_t> width = first_column;
      for (index_t kj = 0; kj < s.kernel_w; ++kj, width.next()) {
        const index_t ow = width.at(s.out_width);
        if (ow < 0) continue;
        const acc_t weight_value = static_cast<acc_t>(w[ki * s.kernel_w + kj]);
#pragma unroll
        for (int j = 0; j < kTileRowsPerThread; ++j) {
          const index_t oh = height[j].at(s.out_height);
          if (j >= rows || oh < 0) continue;
          const scalar_t dy =
              shared[g.shared_at(t.channel, oh - o.window_row, ow - o.window_column)];
          sum[j] = multiply_add(weight_value, static_cast<acc_t>(dy), sum[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kTileRowsPerThread; ++j) height[j].next();
    }
    const auto x = plane_of(s.channels_last, o.n, c, s.channels, s.height, s.width);
#pragma unroll
    for (int j = 0; j < kTileRowsPerThread; ++j) {
      if (j < rows)
        grad_input[x.at(o.row + t.phase + j * g.phases, iw)] = static_cast<scalar_t>(sum[j]);
    }
  }
};

inline int64_t power_of_two_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// The tiles of a depthwise forward (input_grad false) or input gradient whose results are
// [channels, rows, columns] per image, or none where the tiles do not apply: a channel
// multiplier other than 1 (the element kernels), or a window over kTileSharedBytes even one row
// high. NHWC tiles take up to 32 channels (a warp's loads along the channels), then as many
// columns as fill the block; NCHW tiles up to 64 columns, then as many channels as the planes
// leave room for. Rows: kTileRowsPerThread per thread at most.
template <typename index_t>
std::optional<TileGeometry<index_t>> depthwise_tiles(const DepthwiseDims<index_t>& s,
                                                     bool input_grad, size_t element_size) {
  if (s.multiplier != 1 || s.batch == 0) return std::nullopt;
  const int64_t channels = s.channels;
  const int64_t rows = input_grad ? s.height : s.out_height;
  const int64_t columns = input_grad ? s.width : s.out_width;
  if (rows == 0 || columns == 0) return std::nullopt;
  int64_t tile_channels, tile_columns;
  if (s.channels_last) {
    tile_channels = std::min<int64_t>(32, power_of_two_at_least(channels));
    tile_columns = std::min(kThreads / tile_channels, power_of_two_at_least(columns));
  } else {
    tile_columns = std::min<int64_t>(64, power_of_two_at_least(columns));
    int64_t fill = 1;  // channels per tile, while the planes leave threads idle
    while (fill * 2 * tile_columns * rows <= kThreads && fill * 2 <= channels) fill *= 2;
    tile_channels = fill;
  }
  const int64_t phases = kThreads / (tile_channels * tile_columns);
  // The window's rows and columns for tiles of `r` rows (and tile_columns columns).
  const auto window = [&](int64_t r, int64_t kernel, int64_t stride, int64_t dilation) {
    const int64_t reach = (kernel - 1) * dilation;
    return input_grad ? (r - 1 + reach) / stride + 1 : (r - 1) * stride + reach + 1;
  };
  const int64_t window_columns = window(tile_columns, s.kernel_w, s.stride_w, s.dilation_w);
  int64_t tile_rows = std::min<int64_t>(rows, phases * kTileRowsPerThread);
  while (tile_rows > 1 && tile_channels * window(tile_rows, s.kernel_h, s.stride_h, s.dilation_h) *
                                  window_columns * static_cast<int64_t>(element_size) >
                              kTileSharedBytes) {
    tile_rows = (tile_rows + 1) / 2;
  }
  const int64_t window_rows = window(tile_rows, s.kernel_h, s.stride_h, s.dilation_h);
  if (tile_channels * window_rows * window_columns * static_cast<int64_t>(element_size) >
      kTileSharedBytes) {
    return std::nullopt;
  }
  TileGeometry<index_t> g;
  g.channels = tile_channels;
  g.rows = tile_rows;
  g.columns = tile_columns;
  g.phases = phases;
  g.window_rows = window_rows;
  g.window_columns = window_columns;
  g.channel_tiles = (channels + tile_channels - 1) / tile_channels;
  g.row_tiles = (rows + tile_rows - 1) / tile_rows;
  g.column_tiles = (columns + tile_columns - 1) / tile_columns;
  g.channels_last = s.channels_last;
  return g;
}

}  // namespace torch_convbp
