// The CPU kernel of the direct grouped convolution: several groups, each too narrow for the
// column matrix's GEMMs (route.cpp), on channels_last (NHWC)
// activations. ResNeXt's 3x3 layers (4 to 32 channels per group) are its users.
//
// Output element (pixel p, channel o of group g) = the sum over the taps in (ki, kj) order, and
// within a tap over the group's input channels i in order, of w[o, i, ki, kj] * x[p's tap,
// g * C/G + i], one multiply-add (one rounding) per term: the order of the CUDA threads
// (cuda/grouped_thread.h), so both devices give the same bits (the CPU harness checks it). Each
// element is summed by one thread, so the bits do not depend on the thread count either.
//
// It is computed the way a GEMM's micro-kernel computes its tile, with no column matrix: a block
// of PB adjacent output pixels x NV vectors of one group's output channels is held in vector
// registers while the terms are summed into it, each term one broadcast input value times a
// vector of weights. The weights are rearranged once per call, in the sums' type, into
// [G, kh*kw, C/G, Cout/G rounded up to whole vectors], so that a term's weights are adjacent.
//
// Groups narrower than a vector (ResNeXt's 4 per group: 4 of 8 AVX2 lanes) are summed across the
// groups instead, so that every lane works: each band's input is first spread over the output
// channels, spread[pixel][i][c] = x[pixel, group(c) * C/G + i] (Cout/G copies of each value), and
// a term is then a vector of the spread times a vector of weights [kh*kw, C/G, Cout] (the whole
// layer as one group). Each element keeps its terms and their order (benchmarks/NOTES.md,
// section 49). The vectors are 32 bytes, or 64 where the CPU has AVX-512 (section 51). bfloat16
// there, on a CPU with AVX512_BF16, keeps the spread and the weights as bfloat16 pairs of input
// channels and sums two terms an instruction (Avx512PairOps, vector_ops.h): the same terms in the
// same order, each rounded once, so the same bits wherever no value is subnormal (section 121).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "group_spread.h"
#include "vector_ops.h"

namespace torch_convbp {
namespace {

// One tap of a run of pixels: where its input pixel lies, from the run's reference point in the
// image, and where its weights start in the rearranged weight (both in elements).
struct TapOffsets {
  int64_t input, weight;
};

// What every block of a row shares: the group's channel counts, the rearranged weight's row
// length (Cout/G rounded up to whole vectors), the step from one output column's input pixel to
// the next one's, the output's pixel size, and the step from one of a group's input channels to
// the next in the operand (1 in the input, a weight row in the spread). Summed across the
// groups, the "group" is the whole layer: C/G input and Cout output channels. (group_in counts
// the terms of a tap: input channels, or pairs of them where Ops sums bfloat16 in pairs.)
struct RowDims {
  int64_t group_in, group_out, weight_row, input_pixel_step, out_channels, operand_channel_step;
};

// The block of PB pixels x NV vectors of output channels (`count` of them real) whose first
// pixel reads the taps from `x` and writes to `y`: the sums held in registers over all terms,
// each rounded once to scalar_t as it is stored. A term's operand is one input value broadcast
// to the vector or, from the spread (`Spread`), a vector of it.
template <class Ops, int NV, int PB, bool Spread, typename operand_t, typename scalar_t,
          typename acc_t>
TORCH_CONVBP_INLINE void sum_block(const std::vector<TapOffsets>& taps, const operand_t* x,
                                   const acc_t* w, int64_t count, const RowDims& d, scalar_t* y) {
  using V = typename Vector<acc_t, Ops::kBytes>::type;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  V sum[PB][NV] = {};
  for (const TapOffsets& tap : taps) {
    const operand_t* x_tap = x + tap.input;
    const acc_t* w_tap = w + tap.weight;
    for (int64_t i = 0; i < d.group_in; ++i) {
      V weights[NV];
      for (int v = 0; v < NV; ++v) {
        std::memcpy(&weights[v], w_tap + i * d.weight_row + v * lanes, sizeof(V));
      }
      const operand_t* x_i = x_tap + i * d.operand_channel_step;
      for (int q = 0; q < PB; ++q) {
        if constexpr (Spread) {
          for (int v = 0; v < NV; ++v) {
            V values;
            std::memcpy(&values, x_i + q * d.input_pixel_step + v * lanes, sizeof(V));
            sum[q][v] = Ops::multiply_add(weights[v], values, sum[q][v]);
          }
        } else {
          const V value = Ops::template splat<V>(static_cast<acc_t>(x_i[q * d.input_pixel_step]));
          for (int v = 0; v < NV; ++v) sum[q][v] = Ops::multiply_add(weights[v], value, sum[q][v]);
        }
      }
    }
  }
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (count == NV * lanes) {  // whole vectors, stored as such
      for (int q = 0; q < PB; ++q) {
        for (int v = 0; v < NV; ++v) {
          std::memcpy(y + q * d.out_channels + v * lanes, &sum[q][v], sizeof(V));
        }
      }
      return;
    }
  }
  // Each pixel's `count` sums through narrow (bfloat16_cpu.h): bfloat16 rounded 16 or 8 at a
  // time, where element by element c10's rounding took about a sixth of ResNeXt's bfloat16
  // forward (benchmarks/NOTES.md, section 121).
  for (int q = 0; q < PB; ++q) {
    acc_t row[NV * lanes];
    std::memcpy(row, &sum[q][0], sizeof(row));
    narrow(row, count, y + q * d.out_channels);
  }
}

// Pixels per block for NV vectors of channels: PB * NV sums, NV weight vectors and a splat in the
// 16 AVX2 registers, or in AVX-512's 32 (`bytes` 64: more pixels share each weight vector).
// Slices of at most 2 vectors: 4 vectors x 3 pixels needs 17 AVX2 registers, and spilled
// (benchmarks/NOTES.md, section 21).
constexpr int kMaxSliceVectors = 2;
constexpr int pixels_per_block(int nv, int bytes) {
  return bytes == 64 ? (nv == 1 ? 12 : 8) : (nv == 1 ? 8 : 6);
}

// The output columns [begin, end) of a row for one group's channels [first, first + count), all
// with the same taps relative to their own column: blocks of PB pixels, then the rest in blocks
// of 4, 2 and 1 (a 7x7 layer's 5 inner columns had gone one pixel at a time).
// `x` is the input at column `begin`'s reference point, `y` the output at column `begin`.
template <class Ops, int NV, bool Spread, typename operand_t, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_columns(const std::vector<TapOffsets>& taps, Span columns,
                                     const operand_t* x, const acc_t* w, int64_t count,
                                     const RowDims& d, scalar_t* y) {
  constexpr int PB = pixels_per_block(NV, Ops::kBytes);
  int64_t k = 0;  // columns done
  const int64_t total = columns.end - columns.begin;
  for (; k + PB <= total; k += PB) {
    sum_block<Ops, NV, PB, Spread>(taps, x + k * d.input_pixel_step, w, count, d,
                                   y + k * d.out_channels);
  }
  for (; k + 4 <= total; k += 4) {  // (more than one where PB is 12)
    sum_block<Ops, NV, 4, Spread>(taps, x + k * d.input_pixel_step, w, count, d,
                                  y + k * d.out_channels);
  }
  if (k + 2 <= total) {
    sum_block<Ops, NV, 2, Spread>(taps, x + k * d.input_pixel_step, w, count, d,
                                  y + k * d.out_channels);
    k += 2;
  }
  if (k < total) {
    sum_block<Ops, NV, 1, Spread>(taps, x + k * d.input_pixel_step, w, count, d,
                                  y + k * d.out_channels);
  }
}

// The same for a group's channels in slices of at most kMaxSliceVectors vectors, each summed by
// the block shape of its vector count. A slice of the spread starts at its first channel; the
// input's broadcast values are the same for every slice.
template <class Ops, bool Spread, typename operand_t, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_group(const std::vector<TapOffsets>& taps, Span columns,
                                   const operand_t* x, const acc_t* w, const RowDims& d,
                                   scalar_t* y) {
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  constexpr int64_t slice = kMaxSliceVectors * lanes;
  for (int64_t first = 0; first < d.group_out; first += slice) {
    const int64_t count = std::min(slice, d.group_out - first);
    const operand_t* x_slice = Spread ? x + first : x;
    if (count > lanes) {
      sum_columns<Ops, 2, Spread>(taps, columns, x_slice, w + first, count, d, y + first);
    } else {
      sum_columns<Ops, 1, Spread>(taps, columns, x_slice, w + first, count, d, y + first);
    }
  }
}

// The taps of output column ow of row oh that read inside the image, in (ki, kj) order, as
// offsets from the operand's pixel (0, ow * stride_w) (for the columns whose taps all read
// inside, the same for each; `all_columns` skips the column test there). The operand holds the
// image's rows from `first_row` on, `pixel_size` elements a pixel.
void build_taps(const ConvShape& s, int64_t oh, int64_t ow, bool all_columns,
                int64_t weight_tap_size, int64_t first_row, int64_t pixel_size,
                std::vector<TapOffsets>& taps) {
  taps.clear();
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    const int64_t ih = input_row(s, oh, ki);
    if (ih < 0) continue;
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      // iw = ow * stride_w + shift
      const int64_t shift = input_index(int64_t{0}, s.stride_w, s.pad_w, kj, s.dilation_w);
      const int64_t iw = ow * s.stride_w + shift;
      if (!all_columns && (iw < 0 || iw >= s.width)) continue;
      taps.push_back({((ih - first_row) * s.width + shift) * pixel_size,
                      (ki * s.kernel_w + kj) * weight_tap_size});
    }
  }
}

// A run of output pixels that share their taps relative to their own, from pixel (oh, ow): along
// row `oh` (the inner columns, or one edge column), or down edge column `ow` (its inner rows).
// `span` is the run's columns along a row ([ow, ...)), or [0, its rows) down a column;
// `all_inside`, that every column of the run reads its taps inside the width.
struct PixelRun {
  int64_t oh, ow;
  Span span;
  bool all_inside, down;
};

// What a task keeps from band to band: the runs of a band and the taps of one, and the spread of
// the band's input rows where the groups are summed across.
template <typename acc_t>
struct BandScratch {
  std::vector<PixelRun> runs;
  std::vector<TapOffsets> taps;
  std::vector<acc_t> spread;
};

// The output rows `rows` as runs (appended to `runs`): the inner columns of a row share one list
// of taps and go as a run along the row. The edge columns of the inner rows go as runs down the
// column, each column with its own taps: one pixel at a time, as the other edge pixels go, a
// block was a single chain of multiply-adds, waiting on each one's latency, and 2 to 3 of every 7
// to 14 columns of ResNeXt's small images took most of their time (benchmarks/NOTES.md,
// section 51).
inline void band_runs(const ConvShape& s, Span rows, std::vector<PixelRun>& runs) {
  const Span inner = inner_columns(s), all_inner_rows = inner_rows(s);
  const Span down{std::max(rows.begin, all_inner_rows.begin),
                  std::max(rows.begin, std::min(rows.end, all_inner_rows.end))};
  const auto is_edge = [&](int64_t ow) { return ow < inner.begin || ow >= inner.end; };
  runs.clear();
  for (int64_t oh = rows.begin; oh < rows.end; ++oh) {
    const bool inner_row = oh >= down.begin && oh < down.end;
    for (int64_t ow = 0; ow < s.out_width;) {
      const bool is_inner = ow == inner.begin && inner.end > inner.begin;
      const Span run = is_inner ? inner : Span{ow, ow + 1};  // the inner columns, or an edge one
      if (!(inner_row && is_edge(ow))) runs.push_back({oh, ow, run, is_inner, false});
      ow = run.end;
    }
  }
  if (down.end == down.begin) return;
  for (int64_t ow = 0; ow < s.out_width; ++ow) {
    if (is_edge(ow)) runs.push_back({down.begin, ow, Span{0, down.end - down.begin}, false, true});
  }
}

// The output rows `rows`, all columns of the channels [0, d.group_out) that `out` (the image's
// output) starts at, from an operand whose rows start at image row `first_row`, `pixel_size`
// elements a pixel, run by run (band_runs). One call of sum_group for both kinds of run: its
// blocks are compiled once per kind of band, not twice (benchmarks/NOTES.md, section 78).
template <class Ops, bool Spread, typename operand_t, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_rows(const operand_t* operand, int64_t first_row, int64_t pixel_size,
                                  const acc_t* w, Span rows, BandScratch<acc_t>& scratch,
                                  scalar_t* out, const ConvShape& s, const RowDims& d) {
  const int64_t weight_tap_size = d.group_in * d.weight_row;
  RowDims column = d;  // a run down a column: the next pixel is a row on
  column.input_pixel_step = s.stride_h * s.width * pixel_size;
  column.out_channels = s.out_width * s.out_channels;
  band_runs(s, rows, scratch.runs);
  for (const PixelRun& run : scratch.runs) {
    build_taps(s, run.oh, run.ow, run.all_inside, weight_tap_size, first_row, pixel_size,
               scratch.taps);
    sum_group<Ops, Spread>(scratch.taps, run.span, operand + run.ow * d.input_pixel_step, w,
                           run.down ? column : d,
                           out + (run.oh * s.out_width + run.ow) * s.out_channels);
  }
}

// A band of output rows of one image, group by group: `rows` rows from `first_row`, all columns
// and channels. Group by group, so that a group's weights stay in cache over the band's pixels
// (row by row, all groups each, a 32-per-group layer of 7x7 pixels reloaded 36 KiB of weights per
// group for every 7 pixels: benchmarks/NOTES.md, section 21); the band's input rows stay in the L2
// cache across the groups.
// Input rows narrower than the sums (bfloat16, float16) are widened first, once per band (widen,
// bfloat16_cpu.h; into the scratch's spread, which this band does not use): a term's broadcast
// value is then one load, where converting it as it was read took the bfloat16 kernel to about
// twice float32's time (benchmarks/NOTES.md, section 121).
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void band_by_groups(const scalar_t* image, const acc_t* w, int64_t first_row,
                                        int64_t rows, BandScratch<acc_t>& scratch,
                                        scalar_t* out_image, const ConvShape& s, const RowDims& d) {
  const int64_t weight_group_size = s.kernel_h * s.kernel_w * d.group_in * d.weight_row;
  if constexpr (!std::is_same_v<scalar_t, acc_t>) {
    const Span input_rows = band_input_rows(s, first_row, rows);
    const int64_t row_size = s.width * s.in_channels;
    const int64_t count = std::max<int64_t>(input_rows.end - input_rows.begin, 0) * row_size;
    acc_t* widened = cache_aligned(scratch.spread, count);
    widen(image + input_rows.begin * row_size, count, widened);
    for (int64_t g = 0; g < s.groups; ++g) {
      sum_rows<Ops, false>(widened + g * d.group_in, input_rows.begin, s.in_channels,
                           w + g * weight_group_size, Span{first_row, first_row + rows}, scratch,
                           out_image + g * d.group_out, s, d);
    }
    return;
  }
  for (int64_t g = 0; g < s.groups; ++g) {
    sum_rows<Ops, false>(image + g * d.group_in, 0, s.in_channels, w + g * weight_group_size,
                         Span{first_row, first_row + rows}, scratch, out_image + g * d.group_out, s,
                         d);
  }
}

// The input rows `rows` of an image spread over the output channels (group_spread.h), a pixel
// every `pixel_size` elements: a cache line more than the pixel's values, because at a power of
// two, as 4 x 128 floats are, the pixels a block reads fell into two sets of the L1 cache
// (benchmarks/NOTES.md, section 49).
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE const acc_t* spread_rows(const scalar_t* image, Span rows, const ConvShape& s,
                                             const RowDims& d, int64_t pixel_size,
                                             std::vector<acc_t>& buffer) {
  const int64_t pixels = std::max<int64_t>(rows.end - rows.begin, 0) * s.width;
  acc_t* spread = cache_aligned(buffer, pixels * pixel_size);
  spread_pixels<Ops>(image + rows.begin * s.width * s.in_channels, pixels, s, 0,
                     d.weight_row / Vector<acc_t, Ops::kBytes>::lanes, pixel_size, d.weight_row,
                     spread);
  return spread;
}

// The same band summed across the groups (groups of half a vector): its input rows spread once,
// then each row's terms read vectors of the spread.
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void band_across_groups(const scalar_t* image, const acc_t* w,
                                            int64_t first_row, int64_t rows,
                                            BandScratch<acc_t>& scratch, scalar_t* out_image,
                                            const ConvShape& s, const RowDims& d) {
  const Span input_rows = band_input_rows(s, first_row, rows);
  const int64_t pixel_size = d.input_pixel_step / s.stride_w;
  const acc_t* spread = spread_rows<Ops>(image, input_rows, s, d, pixel_size, scratch.spread);
  sum_rows<Ops, true>(spread, input_rows.begin, pixel_size, w, Span{first_row, first_row + rows},
                      scratch, out_image, s, d);
}

// The band, by groups or across them, compiled for each set of vector operations (run_compiled_for,
// vector_ops.h).
template <bool AcrossGroups>
struct Band {
  template <class Ops, typename scalar_t, typename acc_t>
  static TORCH_CONVBP_INLINE void run(const scalar_t* image, const acc_t* w, int64_t first_row,
                                      int64_t rows, BandScratch<acc_t>& scratch,
                                      scalar_t* out_image, const ConvShape& s, const RowDims& d) {
    if constexpr (AcrossGroups) {
      band_across_groups<Ops>(image, w, first_row, rows, scratch, out_image, s, d);
    } else {
      band_by_groups<Ops>(image, w, first_row, rows, scratch, out_image, s, d);
    }
  }
};

// Output rows per band: as many as read about `budget` bytes of the operand (`row_size` bytes per
// output row; an L2 cache's share), fewer where the bands would be fewer than the threads. Only
// the cut into tasks depends on the thread count, never an element's sum.
int64_t band_rows(const ConvShape& s, int64_t row_size, int64_t budget) {
  int64_t rows = std::clamp<int64_t>(budget / row_size, 1, s.out_height);
  const int64_t threads = at::get_num_threads();
  while (rows > 1 && s.batch * ((s.out_height + rows - 1) / rows) < threads) rows = (rows + 1) / 2;
  return rows;
}

// The weight [Cout, C/G, kh, kw] as [Cout / d.group_out, kh*kw, terms, weight_row] in the sums'
// type: per group (or, summed across the groups, for the whole layer), each tap's rows of output
// channels adjacent, zero past d.group_out. A row per input channel, or per pair of them where
// Ops sums terms in pairs (term_value, group_spread.h; d.group_in counts the rows).
template <class Ops, typename scalar_t, typename acc_t>
std::vector<acc_t> rearranged_weight(const scalar_t* weight, const ConvShape& s, const RowDims& d) {
  const int64_t taps = s.kernel_h * s.kernel_w, group_in = s.in_channels / s.groups;
  const int64_t blocks = s.out_channels / d.group_out;
  std::vector<acc_t> w(blocks * taps * d.group_in * d.weight_row, acc_t(0));
  for (int64_t o = 0; o < s.out_channels; ++o) {
    const int64_t g = o / d.group_out, j = o % d.group_out;
    for (int64_t i = 0; i < d.group_in; ++i) {
      for (int64_t t = 0; t < taps; ++t) {
        w[((g * taps + t) * d.group_in + i) * d.weight_row + j] =
            term_value<kTermsInPairs<Ops>, acc_t>(weight + o * group_in * taps + t, taps, i,
                                                  group_in);
      }
    }
  }
  return w;
}

// With the vectors of Ops (vector_ops.h): groups narrower than a vector, that divide it, are
// summed across (section 49); the others group by group, their channels from the first lane of a
// vector.
template <class Ops, typename scalar_t>
void forward_kernel(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                    const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  const auto whole_vectors = [](int64_t n) { return (n + lanes - 1) / lanes * lanes; };
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  const bool across_groups = summed_across_groups(s, lanes);
  TORCH_INTERNAL_ASSERT(across_groups || !kTermsInPairs<Ops>, "terms in pairs: the spread's only");
  const int64_t terms = terms_of<Ops>(group_in);
  const int64_t spread_pixel = terms * whole_vectors(s.out_channels) + 64 / sizeof(acc_t);
  const RowDims d =
      across_groups
          ? RowDims{terms,
                    s.out_channels,
                    whole_vectors(s.out_channels),
                    s.stride_w * spread_pixel,
                    s.out_channels,
                    whole_vectors(s.out_channels)}
          : RowDims{group_in,       group_out, whole_vectors(group_out), s.stride_w * s.in_channels,
                    s.out_channels, 1};
  const std::vector<acc_t> w = rearranged_weight<Ops, scalar_t, acc_t>(weight, s, d);
  const int64_t rows =
      across_groups
          ? band_rows(s, s.stride_h * s.width * spread_pixel * int64_t(sizeof(acc_t)), 512 << 10)
          : band_rows(s, s.stride_h * s.width * s.in_channels * int64_t(sizeof(scalar_t)),
                      256 << 10);
  const int64_t bands = (s.out_height + rows - 1) / rows;
  const int64_t image_size = s.height * s.width * s.in_channels;
  const int64_t out_image_size = s.out_height * s.out_width * s.out_channels;
  at::parallel_for(0, s.batch * bands, 1, [&](int64_t begin, int64_t end) {
    BandScratch<acc_t> scratch;
    scratch.taps.reserve(s.kernel_h * s.kernel_w);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / bands, first_row = task % bands * rows;
      const int64_t count = std::min(rows, s.out_height - first_row);
      const scalar_t* image = input + n * image_size;
      scalar_t* out_image = output + n * out_image_size;
      if (across_groups) {
        run_compiled_for<Band<true>>(Ops{}, image, w.data(), first_row, count, scratch, out_image,
                                     s, d);
      } else {
        run_compiled_for<Band<false>>(Ops{}, image, w.data(), first_row, count, scratch, out_image,
                                      s, d);
      }
    }
  });
}

void grouped_conv2d_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                        IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                        const Tensor& output) {
  const ConvShape s = check_grouped("torch_convbp.grouped_conv2d", input, weight, output, stride,
                                    padding, dilation, groups);
  if (output.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_conv2d", [&] {
#ifdef TORCH_CONVBP_AVX512_BANDS
        if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {  // two terms an instruction
          if (cpu_has_bfloat16_pairs() && summed_across_groups(s, /*lanes=*/16)) {
            return forward_kernel<Avx512PairOps>(input.const_data_ptr<scalar_t>(),
                                                 weight.const_data_ptr<scalar_t>(),
                                                 output.mutable_data_ptr<scalar_t>(), s);
          }
        }
#endif
        with_ops_for_groups<at::opmath_type<scalar_t>>(s, [&](auto ops) {
          forward_kernel<decltype(ops)>(input.const_data_ptr<scalar_t>(),
                                        weight.const_data_ptr<scalar_t>(),
                                        output.mutable_data_ptr<scalar_t>(), s);
        });
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) { m.impl("grouped_conv2d", &grouped_conv2d_cpu); }

}  // namespace torch_convbp
