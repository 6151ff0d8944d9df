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
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../checks.h"
#include "cpu_kernels.h"
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
// the next one's, and the output's pixel size.
struct RowDims {
  int64_t group_in, group_out, weight_row, input_pixel_step, out_channels;
};

// The block of PB pixels x NV vectors of output channels (`count` of them real) whose first
// pixel reads the taps from `x` and writes to `y`: the sums held in registers over all terms,
// each rounded once to scalar_t as it is stored.
template <class Ops, int NV, int PB, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_block(const std::vector<TapOffsets>& taps, const scalar_t* x,
                                   const acc_t* w, int64_t count, const RowDims& d, scalar_t* y) {
  using V = typename Vector<acc_t>::type;
  constexpr int64_t lanes = Vector<acc_t>::lanes;
  V sum[PB][NV] = {};
  for (const TapOffsets& tap : taps) {
    const scalar_t* x_tap = x + tap.input;
    const acc_t* w_tap = w + tap.weight;
    for (int64_t i = 0; i < d.group_in; ++i) {
      V weights[NV];
      for (int v = 0; v < NV; ++v) {
        std::memcpy(&weights[v], w_tap + i * d.weight_row + v * lanes, sizeof(V));
      }
      for (int q = 0; q < PB; ++q) {
        const V value =
            Ops::template splat<V>(static_cast<acc_t>(x_tap[q * d.input_pixel_step + i]));
        for (int v = 0; v < NV; ++v) sum[q][v] = Ops::multiply_add(weights[v], value, sum[q][v]);
      }
    }
  }
  for (int q = 0; q < PB; ++q) {
    for (int v = 0; v < NV; ++v) {
      for (int64_t l = 0; l < lanes; ++l) {
        if (v * lanes + l < count)
          y[q * d.out_channels + v * lanes + l] = static_cast<scalar_t>(sum[q][v][l]);
      }
    }
  }
}

// Pixels per block for NV vectors of channels: PB * NV sums, NV weight vectors and a splat in the
// 16 AVX2 registers. Slices of at most 2 vectors: 4 vectors x 3 pixels needs 17, and spilled
// (benchmarks/NOTES.md, section 21).
constexpr int kMaxSliceVectors = 2;
constexpr int pixels_per_block(int nv) { return nv == 1 ? 8 : 6; }

// The output columns [begin, end) of a row for one group's channels [first, first + count), all
// with the same taps relative to their own column: blocks of PB pixels, then the rest in blocks
// of 4, 2 and 1 (a 7x7 layer's 5 inner columns had gone one pixel at a time).
// `x` is the input at column `begin`'s reference point, `y` the output at column `begin`.
template <class Ops, int NV, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_columns(const std::vector<TapOffsets>& taps, Span columns,
                                     const scalar_t* x, const acc_t* w, int64_t count,
                                     const RowDims& d, scalar_t* y) {
  constexpr int PB = pixels_per_block(NV);
  int64_t k = 0;  // columns done
  const int64_t total = columns.end - columns.begin;
  for (; k + PB <= total; k += PB) {
    sum_block<Ops, NV, PB>(taps, x + k * d.input_pixel_step, w, count, d, y + k * d.out_channels);
  }
  if (k + 4 <= total) {
    sum_block<Ops, NV, 4>(taps, x + k * d.input_pixel_step, w, count, d, y + k * d.out_channels);
    k += 4;
  }
  if (k + 2 <= total) {
    sum_block<Ops, NV, 2>(taps, x + k * d.input_pixel_step, w, count, d, y + k * d.out_channels);
    k += 2;
  }
  if (k < total) {
    sum_block<Ops, NV, 1>(taps, x + k * d.input_pixel_step, w, count, d, y + k * d.out_channels);
  }
}

// The same for a group's channels in slices of at most kMaxSliceVectors vectors, each summed by
// the block shape of its vector count.
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_group(const std::vector<TapOffsets>& taps, Span columns,
                                   const scalar_t* x, const acc_t* w, const RowDims& d,
                                   scalar_t* y) {
  constexpr int64_t lanes = Vector<acc_t>::lanes;
  constexpr int64_t slice = kMaxSliceVectors * lanes;
  for (int64_t first = 0; first < d.group_out; first += slice) {
    const int64_t count = std::min(slice, d.group_out - first);
    if (count > lanes) {
      sum_columns<Ops, 2>(taps, columns, x, w + first, count, d, y + first);
    } else {
      sum_columns<Ops, 1>(taps, columns, x, w + first, count, d, y + first);
    }
  }
}

// The taps of output column ow of row oh that read inside the image, in (ki, kj) order, as
// offsets from the input pixel (0, ow * stride_w) (for the columns whose taps all read inside,
// the same for each; `all_columns` skips the column test there).
void build_taps(const ConvShape& s, int64_t oh, int64_t ow, bool all_columns,
                int64_t weight_tap_size, std::vector<TapOffsets>& taps) {
  taps.clear();
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    const int64_t ih = input_row(s, oh, ki);
    if (ih < 0) continue;
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      // iw = ow * stride_w + shift
      const int64_t shift = input_index(int64_t{0}, s.stride_w, s.pad_w, kj, s.dilation_w);
      const int64_t iw = ow * s.stride_w + shift;
      if (!all_columns && (iw < 0 || iw >= s.width)) continue;
      taps.push_back(
          {(ih * s.width + shift) * s.in_channels, (ki * s.kernel_w + kj) * weight_tap_size});
    }
  }
}

// A band of output rows of one image: `rows` rows from `first_row`, all columns and channels.
// Group by group, so that a group's weights stay in cache over the band's pixels (row by row,
// all groups each, a 32-per-group layer of 7x7 pixels reloaded 36 KiB of weights per group for
// every 7 pixels: benchmarks/NOTES.md, section 21); the band's input rows stay in the L2 cache
// across the groups. The columns whose every tap reads inside the image share one list of taps;
// each column nearer the edge has its own.
template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void forward_band_body(const scalar_t* image, const acc_t* w, int64_t first_row,
                                           int64_t rows, std::vector<TapOffsets>& taps,
                                           scalar_t* out_image, const ConvShape& s,
                                           const RowDims& d) {
  const Span first = tap_columns(s, 0).columns, last = tap_columns(s, s.kernel_w - 1).columns;
  const int64_t inner_begin = std::max(first.begin, last.begin);
  const Span inner{inner_begin, std::max(inner_begin, std::min(first.end, last.end))};
  const int64_t weight_tap_size = d.group_in * d.weight_row;
  const int64_t weight_group_size = s.kernel_h * s.kernel_w * weight_tap_size;
  for (int64_t g = 0; g < s.groups; ++g) {
    for (int64_t oh = first_row; oh < first_row + rows; ++oh) {
      scalar_t* out = out_image + oh * s.out_width * s.out_channels + g * d.group_out;
      for (int64_t ow = 0; ow < s.out_width;) {
        const bool is_inner = ow == inner.begin && inner.end > inner.begin;
        const Span run = is_inner ? inner : Span{ow, ow + 1};  // the inner columns, or an edge one
        build_taps(s, oh, ow, is_inner, weight_tap_size, taps);
        sum_group<Ops>(taps, run, image + run.begin * d.input_pixel_step + g * d.group_in,
                       w + g * weight_group_size, d, out + run.begin * s.out_channels);
        ow = run.end;
      }
    }
  }
}

// The band compiled twice: for any x86-64 CPU and, where GCC builds it, for AVX2 with FMA.
template <typename scalar_t, typename acc_t>
void forward_band_baseline(const scalar_t* image, const acc_t* w, int64_t first_row, int64_t rows,
                           std::vector<TapOffsets>& taps, scalar_t* out_image, const ConvShape& s,
                           const RowDims& d) {
  forward_band_body<LaneOps>(image, w, first_row, rows, taps, out_image, s, d);
}

#ifdef TORCH_CONVBP_AVX2_BANDS
template <typename scalar_t, typename acc_t>
__attribute__((target("avx2,fma"))) void forward_band_avx2(const scalar_t* image, const acc_t* w,
                                                           int64_t first_row, int64_t rows,
                                                           std::vector<TapOffsets>& taps,
                                                           scalar_t* out_image, const ConvShape& s,
                                                           const RowDims& d) {
  forward_band_body<Avx2Ops>(image, w, first_row, rows, taps, out_image, s, d);
}

#endif

// Output rows per band: as many as read about 256 KiB of input (an L2 cache's share), fewer
// where the bands would be fewer than the threads. Only the cut into tasks depends on the thread
// count, never an element's sum.
int64_t band_rows(const ConvShape& s, int64_t element_size) {
  const int64_t input_rows_size = s.stride_h * s.width * s.in_channels * element_size;
  int64_t rows = std::clamp<int64_t>((int64_t{256} << 10) / input_rows_size, 1, s.out_height);
  const int64_t threads = at::get_num_threads();
  while (rows > 1 && s.batch * ((s.out_height + rows - 1) / rows) < threads) rows = (rows + 1) / 2;
  return rows;
}

// The weight [Cout, C/G, kh, kw] as [G, kh*kw, C/G, weight_row] in the sums' type, each tap's
// rows of one group's output channels adjacent, zero past Cout/G.
template <typename scalar_t, typename acc_t>
std::vector<acc_t> rearranged_weight(const scalar_t* weight, const ConvShape& s, const RowDims& d) {
  const int64_t taps = s.kernel_h * s.kernel_w;
  std::vector<acc_t> w(s.groups * taps * d.group_in * d.weight_row, acc_t(0));
  for (int64_t o = 0; o < s.out_channels; ++o) {
    const int64_t g = o / d.group_out, j = o % d.group_out;
    for (int64_t i = 0; i < d.group_in; ++i) {
      for (int64_t t = 0; t < taps; ++t) {
        w[((g * taps + t) * d.group_in + i) * d.weight_row + j] =
            weight[(o * d.group_in + i) * taps + t];
      }
    }
  }
  return w;
}

template <typename scalar_t>
void forward_kernel(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                    const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t lanes = Vector<acc_t>::lanes;
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  const RowDims d{group_in, group_out, (group_out + lanes - 1) / lanes * lanes,
                  s.stride_w * s.in_channels, s.out_channels};
  const std::vector<acc_t> w = rearranged_weight<scalar_t, acc_t>(weight, s, d);
  const int64_t rows = band_rows(s, sizeof(scalar_t));
  const int64_t bands = (s.out_height + rows - 1) / rows;
  const int64_t image_size = s.height * s.width * s.in_channels;
  const int64_t out_image_size = s.out_height * s.out_width * s.out_channels;
  at::parallel_for(0, s.batch * bands, 1, [&](int64_t begin, int64_t end) {
    std::vector<TapOffsets> taps;
    taps.reserve(s.kernel_h * s.kernel_w);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / bands, first_row = task % bands * rows;
      const int64_t count = std::min(rows, s.out_height - first_row);
      const scalar_t* image = input + n * image_size;
      scalar_t* out_image = output + n * out_image_size;
#ifdef TORCH_CONVBP_AVX2_BANDS
      if (cpu_has_avx2_fma()) {
        forward_band_avx2(image, w.data(), first_row, count, taps, out_image, s, d);
        continue;
      }
#endif
      forward_band_baseline(image, w.data(), first_row, count, taps, out_image, s, d);
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
        forward_kernel(input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                       output.mutable_data_ptr<scalar_t>(), s);
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) { m.impl("grouped_conv2d", &grouped_conv2d_cpu); }

}  // namespace torch_convbp
