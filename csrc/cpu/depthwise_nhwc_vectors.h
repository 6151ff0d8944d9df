// The channels_last depthwise forward's and input gradient's inner columns in vector registers,
// for 3x3 kernels with one output channel per input channel (MobileNet's and EfficientNet's
// layers; the input gradient at stride 1). depthwise_nhwc_cpu.cpp sums the rest (the border
// columns, a tail of channels under one vector, other kernels, strides and channel multipliers)
// through its lists of terms.
//
// Each result is the same sum as there, so the same bits: from zero, the taps in (ki, kj) order,
// each product added by one multiply-add, taps in the padding rows skipped. Here a vector of
// channels' 9 weights wait in registers across the row, and four result columns are summed side
// by side (four chains of multiply-adds in flight), where the lists of terms loaded each tap's
// offsets and weights again for every pixel (benchmarks/NOTES.md, section 77).
#pragma once

#include "../shape.h"
#include "cpu_kernels.h"
#include "vector_ops.h"

namespace torch_convbp {

// Result columns summed side by side.
constexpr int kVectorColumns = 4;

// Where a row of results reads its source (an NHWC image of `width` pixels of `channels`
// channels): tap (ki, kj) of result column x reads source pixel (rows[ki], x * scale + offset +
// kj * step); rows[ki] < 0 in the padding. The forward reads input pixel (ih, ow * stride_w -
// pad_w + kj * dilation_w); the input gradient, at stride 1, output pixel (oh, iw + pad_w - kj *
// dilation_w).
template <int K>
struct SourceTaps {
  int64_t rows[K];
  int64_t scale, offset, step, width, channels;
};

// `count` result columns from x (count <= kVectorColumns), channels [first, first + lanes): for
// each, the sum over the taps of the tap's weights (w_by_tap: [taps, result_channels] in acc_t)
// times the source vector the tap reads, into result (the result row, `result_channels` channels
// a pixel).
template <class Ops, int K, int count, typename acc_t, typename V, typename scalar_t>
TORCH_CONVBP_INLINE void sum_columns(const scalar_t* source, const acc_t* w_by_tap,
                                     const SourceTaps<K>& taps, int64_t x, int64_t first,
                                     scalar_t* result, int64_t result_channels) {
  V w[K * K];
  for (int tap = 0; tap < K * K; ++tap) {
    w[tap] = load_vector<acc_t, V>(w_by_tap + tap * result_channels + first);
  }
  V sums[count];
  for (int j = 0; j < count; ++j) sums[j] = Ops::template splat<V>(acc_t(0));
#pragma GCC unroll 3
  for (int ki = 0; ki < K; ++ki) {
    if (taps.rows[ki] < 0) continue;
    const scalar_t* row = source + taps.rows[ki] * taps.width * taps.channels + first;
#pragma GCC unroll 3
    for (int kj = 0; kj < K; ++kj) {
      for (int j = 0; j < count; ++j) {
        const int64_t column = (x + j) * taps.scale + taps.offset + kj * taps.step;
        const V value = load_vector<acc_t, V>(row + column * taps.channels);
        sums[j] = Ops::multiply_add(w[ki * K + kj], value, sums[j]);
      }
    }
  }
  for (int j = 0; j < count; ++j) {
    store_vector<acc_t>(result + (x + j) * result_channels + first, sums[j]);
  }
}

// The result row's columns [columns.begin, columns.end) (whose taps all lie inside the source's
// width), channels [0, *done) in vectors of Ops, compiled for its target (run_compiled_for);
// *done is set to where the rest begins. w_by_tap: the weight as [taps, channels] in acc_t.
template <int K>
struct InnerColumns {
  template <class Ops, typename scalar_t, typename acc_t>
  static TORCH_CONVBP_INLINE void run(const scalar_t* source, const acc_t* w_by_tap,
                                      const SourceTaps<K>& taps, Span columns, scalar_t* result,
                                      int64_t result_channels, int64_t* done) {
    using V = typename Vector<acc_t, Ops::kBytes>::type;
    constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
    // A group of columns at a time, all its vectors of channels before the next group: the
    // source rows stay in the cache (a vector of channels at a time along the whole row read
    // them from L2 once per vector: benchmarks/NOTES.md, section 77). (Loops, not a lambda: GCC
    // compiles a lambda for the default target, where Ops's operations are calls.)
    const int64_t vectors = result_channels / lanes;
    int64_t x = columns.begin;
    for (; x + kVectorColumns <= columns.end; x += kVectorColumns) {
      for (int64_t v = 0; v < vectors; ++v) {
        sum_columns<Ops, K, kVectorColumns, acc_t, V>(source, w_by_tap, taps, x, v * lanes, result,
                                                      result_channels);
      }
    }
    for (; x < columns.end; ++x) {
      for (int64_t v = 0; v < vectors; ++v) {
        sum_columns<Ops, K, 1, acc_t, V>(source, w_by_tap, taps, x, v * lanes, result,
                                         result_channels);
      }
    }
    const int64_t first = vectors * lanes;
    *done = first;
  }
};

}  // namespace torch_convbp
