// The CPU's depthwise weight gradient in the order of rows (summation.h, DepthwiseOrder::rows), on
// channels_last (NHWC) activations, or on NCHW ones a band of rows at a time transposed to NHWC in
// cache (no layout copies of the tensors). Weight entry (o, ki, kj) is
//   the sum over the groups of output rows, in order, of
//     the sum over the group's rows (n, oh), in order, of
//       the sum over ow, in increasing order, of dy(n, o, oh, ow) * x(n, o / m, ih, iw)
// where (ih, iw) is what tap (ki, kj) reads from output pixel (oh, ow), taps in the padding
// skipped; every sum starts from zero, each product is added by one multiply_add, and the groups
// of rows are fixed by the number of rows (kRowGroups), never by the thread count. Volumes (NDHWC
// or NCDHW) the same: their rows are (n, od, oh), and entry (o, kd, ki, kj) takes from row (n, od,
// oh) the 2-D row's sums over input slice id = od * sd - pd + kd * dd, where that lies inside;
// NCDHW ones of a kernel deeper than one slice a block of channels of a whole volume at a time.
//
// Why: the order of lanes (position j into lane j % 256, then a tree), which the CUDA kernels
// sum in, made every multiply-add load and store its lane from the L2 cache on the CPU: 2-3x
// oneDNN's time (benchmarks/NOTES.md, sections 65 and 74). Here a row's sums stay in vector
// registers along the row (vector_ops.h: AVX-512, AVX2 or any CPU, each lane rounded alike):
// for a 3x3 kernel all the taps' sums of two vectors of channels at once, for any other kernel
// a tap at a time; the row's x and dy stay in the cache across its taps.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../summation.h"
#include "cpu_kernels.h"
#include "depthwise_nhwc_cpu.h"
#include "transpose_copy_cpu.h"
#include "vector_ops.h"

namespace torch_convbp {
namespace {

// Groups of output rows, whose sums are added in order at the end: the pieces of work for the
// threads (each task a group, all channels), and a count fixed by the number of rows.
constexpr int64_t kRowGroups = 16;

// Vectors of channels summed side by side along a row with every tap's sums in registers: two
// (a 3x3 kernel's 18 sums fill AVX-512's 32 registers; on AVX2, 16 registers, some spill, and
// still two 32-byte vectors, a whole cache line of float32 channels, took 0.68x the time of one:
// benchmarks/NOTES.md, section 74).
constexpr int kRegisterVectors = 2;

// One output pixel's products for every tap of a KH x KW kernel, added into the row's sums of
// `NV` vectors of output channels from `first`. kInside: every tap reads inside the image's
// columns, and the column checks are left out (the row's inner pixels).
template <class Ops, int KH, int KW, int NV, bool kInside, typename scalar_t, typename acc_t,
          typename V>
TORCH_CONVBP_INLINE void add_pixel(const scalar_t* image, const scalar_t* grad_row,
                                   const int64_t (&rows)[KH], int64_t ow, int64_t first,
                                   V (&sums)[NV][KH * KW], const ConvShape& s) {
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  const int64_t c = s.in_channels, cout = s.out_channels;
  V dy[NV];
  for (int v = 0; v < NV; ++v) {
    dy[v] = load_vector<acc_t, V>(grad_row + ow * cout + first + v * lanes);
  }
#pragma GCC unroll 8
  for (int ki = 0; ki < KH; ++ki) {
    if (rows[ki] < 0) continue;
#pragma GCC unroll 8
    for (int kj = 0; kj < KW; ++kj) {
      const int64_t iw = input_index(ow, s.stride_w, s.pad_w, int64_t{kj}, s.dilation_w);
      if (!kInside && (iw < 0 || iw >= s.width)) continue;
      const scalar_t* x = image + (rows[ki] * s.width + iw) * c + first;
      for (int v = 0; v < NV; ++v) {
        const V xv = load_vector<acc_t, V>(x + v * lanes);
        sums[v][ki * KW + kj] = Ops::multiply_add(dy[v], xv, sums[v][ki * KW + kj]);
      }
    }
  }
}

// Whether a row's inner pixels take add_window: a 3x3 kernel, stride 1 and undilated along the
// row, on AVX-512's 32 registers (a vector's nine sums, its three kernel rows' windows of three
// input vectors, and dy's).
template <class Ops, int KH, int KW>
bool takes_window(const ConvShape& s) {
  return Ops::kBytes == 64 && KH == 3 && KW == 3 && s.stride_w == 1 && s.dilation_w == 1;
}

// add_pixel's products for the inner pixels [inner.begin, inner.end) of one vector of channels
// from `first`, where kernel column kj of pixel ow reads input column ow - pad_w + kj: pixel
// ow + 1 reads what ow read shifted by one column, so each kernel row keeps a window of its three
// input vectors in registers and loads one new one per pixel. 4 loads per 9 multiply-adds, where
// add_pixel's 10 per 9 kept 576@14's weight gradient waiting on its loads (benchmarks/NOTES.md,
// section 114). The same products, added into each tap's sum in the same order of pixels.
template <class Ops, typename scalar_t, typename acc_t, typename V>
TORCH_CONVBP_INLINE void add_window(const scalar_t* image, const scalar_t* grad_row,
                                    const int64_t (&rows)[3], Span inner, int64_t first,
                                    V (&sums)[1][9], const ConvShape& s) {
  const int64_t c = s.in_channels, cout = s.out_channels;
  if (inner.begin >= inner.end) return;
  const scalar_t* row_at[3];  // kernel row ki's input row at the first inner pixel's column 0
  V window[3][3];
#pragma GCC unroll 3
  for (int ki = 0; ki < 3; ++ki) {
    row_at[ki] =
        rows[ki] < 0 ? nullptr : image + (rows[ki] * s.width + inner.begin - s.pad_w) * c + first;
    if (row_at[ki] == nullptr) continue;
    window[ki][0] = load_vector<acc_t, V>(row_at[ki]);
    window[ki][1] = load_vector<acc_t, V>(row_at[ki] + c);
  }
  for (int64_t ow = inner.begin, step = 0; ow < inner.end; ++ow, ++step) {
    const V dy = load_vector<acc_t, V>(grad_row + ow * cout + first);
#pragma GCC unroll 3
    for (int ki = 0; ki < 3; ++ki) {
      if (row_at[ki] == nullptr) continue;
      window[ki][2] = load_vector<acc_t, V>(row_at[ki] + (step + 2) * c);
#pragma GCC unroll 3
      for (int kj = 0; kj < 3; ++kj) {
        sums[0][ki * 3 + kj] = Ops::multiply_add(dy, window[ki][kj], sums[0][ki * 3 + kj]);
      }
      window[ki][0] = window[ki][1];
      window[ki][1] = window[ki][2];
    }
  }
}

// One output row's sums of `NV` vectors of output channels from `first`, for every tap of a
// KH x KW kernel, in registers along the row (KH, KW compile-time, the tap loops unrolled), then
// added into totals [taps][Cout]. m == 1: output channel o reads input channel o. The pixels in
// increasing order, the inner ones without the column checks (kWindow: by add_window).
template <class Ops, int KH, int KW, int NV, bool kWindow = false, typename scalar_t,
          typename acc_t>
TORCH_CONVBP_INLINE void row_of_vectors(const scalar_t* image, const scalar_t* grad_row, int64_t oh,
                                        int64_t first, acc_t* totals, const ConvShape& s) {
  using V = typename Vector<acc_t, Ops::kBytes>::type;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  constexpr int taps = KH * KW;
  const int64_t cout = s.out_channels;
  V sums[NV][taps];
  for (int v = 0; v < NV; ++v) {
    for (int t = 0; t < taps; ++t) sums[v][t] = Ops::template splat<V>(acc_t(0));
  }
  int64_t rows[KH];  // the input rows, -1 in the padding
  for (int ki = 0; ki < KH; ++ki) rows[ki] = input_row(s, oh, ki);
  const Span inner = inner_columns(s);
  for (int64_t ow = 0; ow < inner.begin; ++ow) {
    add_pixel<Ops, KH, KW, NV, false, scalar_t, acc_t>(image, grad_row, rows, ow, first, sums, s);
  }
  if constexpr (kWindow) {
    add_window<Ops, scalar_t, acc_t>(image, grad_row, rows, inner, first, sums, s);
  } else {
    for (int64_t ow = inner.begin; ow < inner.end; ++ow) {
      add_pixel<Ops, KH, KW, NV, true, scalar_t, acc_t>(image, grad_row, rows, ow, first, sums, s);
    }
  }
  for (int64_t ow = inner.end; ow < s.out_width; ++ow) {
    add_pixel<Ops, KH, KW, NV, false, scalar_t, acc_t>(image, grad_row, rows, ow, first, sums, s);
  }
  for (int v = 0; v < NV; ++v) {
    for (int t = 0; t < taps; ++t) {
      acc_t* total = totals + t * cout + first + v * lanes;
      acc_t row_sums[lanes];
      std::memcpy(row_sums, &sums[v][t], sizeof(V));
      for (int64_t l = 0; l < lanes; ++l) total[l] = total[l] + row_sums[l];
    }
  }
}

// The same sums for a kernel of any size: a tap at a time, `NV` vectors of output channels from
// `first` summed along the row's columns that read inside the image (NV independent chains),
// then added into totals. Each entry's products are summed along the row in the same order as
// row_of_vectors's; the row's dy and x stay in L1 across the taps.
template <class Ops, int NV, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void row_of_taps(const scalar_t* image, const scalar_t* grad_row, int64_t oh,
                                     int64_t first, acc_t* totals, const ConvShape& s) {
  using V = typename Vector<acc_t, Ops::kBytes>::type;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  const int64_t c = s.in_channels, cout = s.out_channels;
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    const int64_t ih = input_row(s, oh, ki);
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      V sums[NV];
      for (int v = 0; v < NV; ++v) sums[v] = Ops::template splat<V>(acc_t(0));
      if (ih >= 0) {
        const Tap tap = tap_columns(s, kj);
        const scalar_t* x_row = image + ih * s.width * c + first;
        for (int64_t ow = tap.columns.begin; ow < tap.columns.end; ++ow) {
          const scalar_t* x = x_row + (ow * s.stride_w + tap.offset) * c;
          const scalar_t* dy = grad_row + ow * cout + first;
          for (int v = 0; v < NV; ++v) {
            sums[v] = Ops::multiply_add(load_vector<acc_t, V>(dy + v * lanes),
                                        load_vector<acc_t, V>(x + v * lanes), sums[v]);
          }
        }
      }
      acc_t* total = totals + (ki * s.kernel_w + kj) * cout + first;
      for (int v = 0; v < NV; ++v) {
        acc_t row_sums[lanes];
        std::memcpy(row_sums, &sums[v], sizeof(V));
        for (int64_t l = 0; l < lanes; ++l)
          total[v * lanes + l] = total[v * lanes + l] + row_sums[l];
      }
    }
  }
}

// The vectors of one output row, compiled for the target of Ops (run_compiled_for): the
// channels [0, *done) in vectors, *done set to where the rest begins. A kernel of a compile-time
// size (KH, KW > 0: 3x3) with every tap's sums in registers, any other a tap at a time, four
// vectors of channels side by side (four chains of multiply-adds in flight).
template <int KH, int KW>
struct RowOfVectors {
  template <class Ops, typename scalar_t, typename acc_t>
  static TORCH_CONVBP_INLINE void run(const scalar_t* image, const scalar_t* grad_row, int64_t oh,
                                      acc_t* totals, int64_t* done, const ConvShape& s) {
    constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
    int64_t first = 0;
    if constexpr (KH > 0) {
      if (takes_window<Ops, KH, KW>(s)) {  // a vector at a time, its inner pixels by add_window
        for (; first + lanes <= s.out_channels; first += lanes) {
          row_of_vectors<Ops, KH, KW, 1, true>(image, grad_row, oh, first, totals, s);
        }
        *done = first;
        return;
      }
      for (; first + kRegisterVectors * lanes <= s.out_channels;
           first += kRegisterVectors * lanes) {
        row_of_vectors<Ops, KH, KW, kRegisterVectors>(image, grad_row, oh, first, totals, s);
      }
    } else {
      for (; first + 4 * lanes <= s.out_channels; first += 4 * lanes) {
        row_of_taps<Ops, 4>(image, grad_row, oh, first, totals, s);
      }
    }
    for (; first + lanes <= s.out_channels; first += lanes) {
      if constexpr (KH > 0) {
        row_of_vectors<Ops, KH, KW, 1>(image, grad_row, oh, first, totals, s);
      } else {
        row_of_taps<Ops, 1>(image, grad_row, oh, first, totals, s);
      }
    }
    *done = first;
  }
};

// The same sums for any kernel and any run of `count` channels from `first` (a tail of the
// channels under one vector, channel multipliers): the row's sums in a local array, channel by
// channel.
template <typename scalar_t, typename acc_t, typename Channel>
void row_of_any(const scalar_t* image, const scalar_t* grad_row, int64_t oh, int64_t first,
                int64_t count, Channel x_channel, acc_t* totals, std::vector<acc_t>& sums,
                const ConvShape& s) {
  const int64_t cout = s.out_channels, taps = s.kernel_h * s.kernel_w;
  sums.assign(taps * count, acc_t(0));
  for (int64_t ow = 0; ow < s.out_width; ++ow) {
    const scalar_t* dy = grad_row + ow * cout + first;
    for_each_tap_inside(image, oh, ow, s, [&](int64_t tap, const scalar_t* x) {
      acc_t* sum = sums.data() + tap * count;
      for (int64_t b = 0; b < count; ++b) {
        sum[b] = multiply_add(static_cast<acc_t>(dy[b]),
                              static_cast<acc_t>(x[x_channel(first + b)]), sum[b]);
      }
    });
  }
  for (int64_t t = 0; t < taps; ++t) {
    for (int64_t b = 0; b < count; ++b) {
      totals[t * cout + first + b] = totals[t * cout + first + b] + sums[t * count + b];
    }
  }
}

// One output row (n, oh), every output channel: with one output channel per input channel in
// vectors (RowOfVectors) on the CPU's widest vector operations, the rest (a tail of channels
// under one vector, channel multipliers) through row_of_any.
template <int KH, int KW, class Ops, typename scalar_t, typename acc_t>
void add_row(Ops ops, const scalar_t* image, const scalar_t* grad_row, int64_t oh, acc_t* totals,
             std::vector<acc_t>& sums, const ConvShape& s) {
  const int64_t m = s.out_channels / s.in_channels;
  int64_t first = 0;
  if (m == 1) run_compiled_for<RowOfVectors<KH, KW>>(ops, image, grad_row, oh, totals, &first, s);
  if (first == s.out_channels) return;
  if (m == 1) {
    row_of_any(
        image, grad_row, oh, first, s.out_channels - first, [](int64_t o) { return o; }, totals,
        sums, s);
  } else {
    row_of_any(
        image, grad_row, oh, first, s.out_channels - first, [m](int64_t o) { return o / m; },
        totals, sums, s);
  }
}

// The rows [first, end) of an NCHW image's planes (or of an NCDHW volume's slice; each channel's
// plane `channel_stride` apart, W wide) as an NHWC band [(end - first) * W][C], by one transposing
// copy of [C][(end - first) * W].
template <typename scalar_t>
void nhwc_band(const scalar_t* image, int64_t channels, int64_t channel_stride, int64_t width,
               int64_t first, int64_t end, std::vector<scalar_t>& band) {
  band.resize((end - first) * width * channels);
  if (band.empty()) return;
  transpose_matrix(image + first * width, channel_stride, band.data(), channels, channels,
                   (end - first) * width, sizeof(scalar_t));
}

// `channels` consecutive planes of `size` pixels (a volume's block of channels) as one NHWC band
// [size][channels]: nhwc_band's one row of `size` pixels.
template <typename scalar_t>
void nhwc_volume(const scalar_t* planes, int64_t channels, int64_t size,
                 std::vector<scalar_t>& band) {
  nhwc_band(planes, channels, size, size, 0, 1, band);
}

// The input slices (n, id) that output slice `slice` = (n, od) reads, one per depth tap kd inside
// the volume: f(kd, n * D + id). A 2-D convolution's: slice n, f(0, n).
template <typename F>
TORCH_CONVBP_INLINE void for_each_input_slice(const ConvShape& s, int64_t slice, F&& f) {
  const int64_t n = slice / s.out_depth, od = slice % s.out_depth;
  for (int64_t kd = 0; kd < s.kernel_d; ++kd) {
    const int64_t id = input_index(od, s.stride_d, s.pad_d, kd, s.dilation_d);
    if (id >= 0 && id < s.depth) f(kd, n * s.depth + id);
  }
}

// Brings the operands of output row `row` of N * OD * OH (NHWC) toward the L2 cache: its row of
// dy and the input rows it reads, each in memory order. Why: a row's sums walk it once per vector
// or two of channels, reading 64 or 128 bytes of each pixel, a stride by which the CPU's own
// prefetchers did not bring the pixels from memory in time; asked for a row ahead, they come in
// memory order while the row before is summed (benchmarks/NOTES.md, section 96).
template <typename scalar_t>
TORCH_CONVBP_INLINE void prefetch_row(const scalar_t* input, const scalar_t* grad_output,
                                      int64_t row, const ConvShape& s) {
  const int64_t slice = row / s.out_height, oh = row % s.out_height;
  const int64_t out_row_size = s.out_width * s.out_channels, in_row_size = s.width * s.in_channels;
  prefetch_to_l2(grad_output + row * out_row_size, out_row_size * sizeof(scalar_t));
  for_each_input_slice(s, slice, [&](int64_t, int64_t input_slice) {
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      const int64_t ih = input_row(s, oh, ki);
      if (ih < 0) continue;
      prefetch_to_l2(input + (input_slice * s.height + ih) * in_row_size,
                     in_row_size * sizeof(scalar_t));
    }
  });
}

// Adds the output rows [first_row, end_row) of N * OD * OH, in order, into totals [taps][Cout]:
// each row's 2-D sums over each input slice it reads into the entries of that slice's depth tap,
// totals + kd * kh * kw * Cout. NCHW (NCDHW of a kernel one slice deep) operands per output slice:
// its rows of dy and, per input slice, the input rows they read as NHWC bands, whose shape counts
// its input rows from the band's first (the padding grown by as many), so that each row reads what
// it read in the whole image. A row's depth taps are added in another order here than in NHWC,
// each entry's the same.
template <int KH, int KW, class Ops, typename scalar_t, typename acc_t>
void add_rows(Ops ops, const scalar_t* input, const scalar_t* grad_output, int64_t first_row,
              int64_t end_row, acc_t* totals, std::vector<acc_t>& sums, const ConvShape& s,
              Layout layout) {
  const int64_t slice_size = s.height * s.width * s.in_channels;
  const int64_t out_row_size = s.out_width * s.out_channels;
  const int64_t depth_tap_entries = s.kernel_h * s.kernel_w * s.out_channels;
  if (layout == Layout::nhwc) {
    // The rows of a 3x3 kernel, whose sums stay in registers along the row; a kernel of any other
    // size walks the row a tap at a time, and gained nothing from it (section 96).
    constexpr bool prefetch = KH > 0;
    if (prefetch && first_row < end_row) prefetch_row(input, grad_output, first_row, s);
    for (int64_t row = first_row; row < end_row; ++row) {
      const int64_t slice = row / s.out_height, oh = row % s.out_height;
      if (prefetch && row + 1 < end_row) prefetch_row(input, grad_output, row + 1, s);
      for_each_input_slice(s, slice, [&](int64_t kd, int64_t input_slice) {
        add_row<KH, KW>(ops, input + input_slice * slice_size, grad_output + row * out_row_size, oh,
                        totals + kd * depth_tap_entries, sums, s);
      });
    }
    return;
  }
  // NCDHW: channel c of volume n at (n * C + c) * D * H * W, its slice id id * H * W on.
  const int64_t plane = s.height * s.width, out_plane = s.out_height * s.out_width;
  std::vector<scalar_t> x_band, dy_band;
  for (int64_t slice = first_row / s.out_height; slice * s.out_height < end_row; ++slice) {
    const int64_t first = std::max(first_row - slice * s.out_height, int64_t{0});
    const int64_t end = std::min(end_row - slice * s.out_height, s.out_height);
    const Span rows = band_input_rows(s, first, end - first);
    const int64_t n = slice / s.out_depth, od = slice % s.out_depth;
    nhwc_band(grad_output + (n * s.out_channels * s.out_depth + od) * out_plane, s.out_channels,
              s.out_depth * out_plane, s.out_width, first, end, dy_band);
    ConvShape band = s;
    band.pad_h += rows.begin;
    band.height = rows.end - rows.begin;
    for_each_input_slice(s, slice, [&](int64_t kd, int64_t input_slice) {
      const int64_t id = input_slice % s.depth;
      nhwc_band(input + (n * s.in_channels * s.depth + id) * plane, s.in_channels, s.depth * plane,
                s.width, rows.begin, rows.end, x_band);
      for (int64_t oh = first; oh < end; ++oh) {
        add_row<KH, KW>(ops, x_band.data(), dy_band.data() + (oh - first) * out_row_size, oh,
                        totals + kd * depth_tap_entries, sums, band);
      }
    });
  }
}

// The groups of output rows: `count` groups of `size` rows (the last one the rest).
struct RowGroups {
  int64_t rows, size, count;
  explicit RowGroups(const ConvShape& s)
      : rows(s.batch * s.output_rows()),
        size((rows + kRowGroups - 1) / kRowGroups),
        count(rows == 0 ? 0 : (rows + size - 1) / size) {}
  Span of(int64_t g) const { return {g * size, std::min(rows, (g + 1) * size)}; }
};

// Channels of an NCDHW volume's block: a 64-byte cache line of float32.
constexpr int64_t kVolumeBlock = 16;
int64_t volume_blocks(const ConvShape& s) {
  return (s.in_channels + kVolumeBlock - 1) / kVolumeBlock;
}

// The group sums [groups][taps][Cout] of NCDHW volumes whose kernel is deeper than one slice,
// a block of channels at a time: each volume's block of x and of dy transposed once into NDHWC
// bands in cache, then every group's rows of that volume summed on the bands as NDHWC rows, into
// the block's group sums. Why: by output slices (add_rows) each input slice went into a band once
// per depth tap reading it, three times for a 3-deep kernel, and those copies were most of the
// time (benchmarks/NOTES.md, section 135). Each entry's order is add_rows's: its group's rows in
// order, the groups of rows cut as by add_rows, so the bits are the same; the tasks are the blocks,
// each volume in turn: ceil(C / 16) pieces (taken where that gives every thread one, see
// weight_grad_rows).
template <int KH, int KW, class Ops, typename scalar_t, typename acc_t>
void group_sums_by_channel_blocks(Ops ops, const scalar_t* input, const scalar_t* grad_output,
                                  const RowGroups& groups, acc_t* group_sums, const ConvShape& s) {
  const int64_t m = s.out_channels / s.in_channels, taps = s.taps(), cout = s.out_channels;
  const int64_t volume = s.input_rows() * s.width, out_volume = s.output_rows() * s.out_width;
  const int64_t volume_rows = s.output_rows();
  const int64_t blocks = volume_blocks(s);
  if (groups.count == 0) return;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> x_band, dy_band;
    std::vector<acc_t> block_sums, sums;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kVolumeBlock;
      const ConvShape block =
          depthwise_channel_block(s, std::min(kVolumeBlock, s.in_channels - first));
      const int64_t entries = taps * block.out_channels;  // one group's, of this block
      block_sums.assign(groups.count * entries, acc_t(0));
      for (int64_t n = 0; n < s.batch; ++n) {
        nhwc_volume(input + (n * s.in_channels + first) * volume, block.in_channels, volume,
                    x_band);
        nhwc_volume(grad_output + (n * cout + first * m) * out_volume, block.out_channels,
                    out_volume, dy_band);
        const Span rows{n * volume_rows, (n + 1) * volume_rows};
        for (int64_t g = rows.begin / groups.size; g < groups.count; ++g) {
          const Span group = groups.of(g);
          if (group.begin >= rows.end) break;
          add_rows<KH, KW>(ops, x_band.data(), dy_band.data(),
                           std::max(group.begin, rows.begin) - rows.begin,
                           std::min(group.end, rows.end) - rows.begin,
                           block_sums.data() + g * entries, sums, block, Layout::nhwc);
        }
      }
      for (int64_t g = 0; g < groups.count; ++g) {
        for (int64_t t = 0; t < taps; ++t) {
          std::copy_n(block_sums.data() + g * entries + t * block.out_channels, block.out_channels,
                      group_sums + (g * taps + t) * cout + first * m);
        }
      }
    }
  });
}

template <int KH, int KW, class Ops, typename scalar_t>
void weight_grad_rows(Ops ops, const scalar_t* input, const scalar_t* grad_output,
                      scalar_t* grad_weight, const ConvShape& s, Layout layout) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = s.taps(), cout = s.out_channels;
  const RowGroups row_groups(s);
  const int64_t groups = row_groups.count;
  // each group's sums [taps][Cout]
  std::vector<acc_t> group_sums(groups * taps * cout, acc_t(0));
  // NCDHW volumes of a kernel deeper than one slice by blocks of channels where there are as many
  // blocks as threads; on more threads (MViT's 96 channels are 6 blocks) by groups of rows, whose
  // bits are the same, as only the cut into tasks depends on the thread count.
  if (layout == Layout::nchw && s.kernel_d > 1 && volume_blocks(s) >= at::get_num_threads()) {
    group_sums_by_channel_blocks<KH, KW>(ops, input, grad_output, row_groups, group_sums.data(), s);
  } else {
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> sums;
      for (int64_t g = begin; g < end; ++g) {
        const Span group = row_groups.of(g);
        add_rows<KH, KW>(ops, input, grad_output, group.begin, group.end,
                         group_sums.data() + g * taps * cout, sums, s, layout);
      }
    });
  }
  // Each entry's total: its groups' sums added in order, from zero. Group by group over all the
  // entries at once, in parts of them for the threads (the same additions per entry): entry by
  // entry, the groups' sums were taps * Cout apart and one thread added them all, while the others
  // waited (benchmarks/NOTES.md, section 109).
  const int64_t entries = taps * cout;
  std::vector<acc_t> totals(entries, acc_t(0));
  at::parallel_for(0, entries, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t g = 0; g < groups; ++g) {
      const acc_t* group = group_sums.data() + g * entries;
      for (int64_t i = begin; i < end; ++i) totals[i] = totals[i] + group[i];
    }
  });
  for (int64_t o = 0; o < cout; ++o) {
    for (int64_t t = 0; t < taps; ++t) {
      grad_weight[o * taps + t] = static_cast<scalar_t>(totals[t * cout + o]);
    }
  }
}

// The kernel's size compile-time where it is 3x3 (every tap's sums in registers along a row),
// any other a tap at a time (5x5 ran in 0.7x the time so, 7x7 in a fifth of the lanes' time:
// benchmarks/NOTES.md, section 74), on the CPU's widest vectors.
template <typename scalar_t>
void weight_grad_rows_of(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                         const Tensor& grad_weight, Layout layout) {
  const scalar_t* x = input.const_data_ptr<scalar_t>();
  const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
  scalar_t* dw = grad_weight.mutable_data_ptr<scalar_t>();
  with_vector_ops([&](auto ops) {
    if (s.kernel_h == 3 && s.kernel_w == 3) {
      weight_grad_rows<3, 3>(ops, x, dy, dw, s, layout);
    } else {
      weight_grad_rows<0, 0>(ops, x, dy, dw, s, layout);
    }
  });
}

}  // namespace

void depthwise_weight_grad_rows(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                                const Tensor& grad_weight, Layout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_weight_grad_rows",
      [&] { weight_grad_rows_of<scalar_t>(input, grad_output, s, grad_weight, layout); });
}

}  // namespace torch_convbp
