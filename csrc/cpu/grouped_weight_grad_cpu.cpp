// The CPU kernel of the direct grouped weight gradient: the layers whose forward the direct
// grouped kernel computes (several groups of at most 32 output channels, route.cpp), on
// channels_last (NHWC) activations. Each group's GEMM
// dW_g = dY_g @ col_g^T would be [Cout/G, P] @ [P, C/G*kh*kw]: a few rows thin, and the column
// matrix is written and read for so little work (benchmarks/NOTES.md, section 22).
//
// Entry (o, i, ki, kj), of group g = o / (Cout/G), is summed in the order of the CUDA kernel
// (cuda/grouped_thread.h), so both devices give the same bits (the CPU harness checks it):
//   image n's partial sum = the multiply-adds, from 0, over image n's output pixels (oh, ow) in
//                           row-major order whose tap reads inside the image, of
//                           dy[n, oh, ow, o] * x[n, ih, iw, g * C/G + i], one rounding each;
//   the entry             = 0 + partial(0) + partial(1) + ... in the order of the images, one
//                           rounding per addition, then one rounding to scalar_t.
// Each entry is summed by one thread, so the bits do not depend on the thread count either.
//
// For one image, tap and group, a block of CB input channels x NV vectors of output channels
// (a tile of that tap's entries) is held in vector registers while the image's pixels are summed
// into it, each term one broadcast input value times a vector of output gradients: a GEMM
// micro-kernel's tile with P as its inner dimension, read straight from the NHWC tensors. The
// block is then added to the group's totals, in the sums' type. The image's channels of the
// group stay in cache over its taps.
//
// Groups of half a vector (ResNeXt's 4 per group) are summed across the groups (group_spread.h):
// a task takes a slice of the output channels of several groups, spreads each image's input over
// them, and each term is a vector of the spread times a vector of output gradients, every lane
// working. The entries' terms and their order stay as above (benchmarks/NOTES.md, section 49).
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

// One tap of one image, within the output rows `out_rows`: the output pixels whose tap reads
// inside the image (a rectangle, `rows` x `columns`), where the first one's terms are (element
// offsets in x, or in its spread, from image row `x_first_row` on, `x_pixel_size` elements a
// pixel, and in the image of dy, `dy_pixel_size` elements a pixel), and the steps to the next row
// and column of that rectangle in each.
struct TapPixels {
  int64_t rows, columns;
  int64_t x_first, dy_first;
  int64_t x_row, x_column, dy_row, dy_column;
};

TapPixels tap_pixels(const ConvShape& s, int64_t ki, int64_t kj, Span out_rows, int64_t x_first_row,
                     int64_t x_pixel_size, int64_t dy_pixel_size) {
  const int64_t row_offset = input_index(int64_t{0}, s.stride_h, s.pad_h, ki, s.dilation_h);
  const Span valid = valid_columns(row_offset, s.stride_h, s.height, s.out_height);
  const Span rows{
      std::max(valid.begin, out_rows.begin),
      std::max(std::max(valid.begin, out_rows.begin), std::min(valid.end, out_rows.end))};
  const Tap tap = tap_columns(s, kj);
  const int64_t ih = input_index(rows.begin, s.stride_h, s.pad_h, ki, s.dilation_h) - x_first_row;
  const int64_t iw = tap.columns.begin * s.stride_w + tap.offset;
  return {rows.end - rows.begin,
          tap.columns.end - tap.columns.begin,
          (ih * s.width + iw) * x_pixel_size,
          (rows.begin * s.out_width + tap.columns.begin) * dy_pixel_size,
          s.stride_h * s.width * x_pixel_size,
          s.stride_w * x_pixel_size,
          s.out_width * dy_pixel_size,
          dy_pixel_size};
}

// NV whole vectors of acc_t from p, of which the first `count` values are a group's output
// gradients: the lanes past them hold the next group's, whose sums land in the totals' padding
// and are never written out. (Zeroing them lane by lane, per pixel, had kept the sums out of
// registers.)
template <int NV, typename acc_t, typename V, typename scalar_t>
TORCH_CONVBP_INLINE void load_vectors(const scalar_t* p, V (&out)[NV]) {
  constexpr int64_t lanes = sizeof(V) / sizeof(acc_t);
  for (int v = 0; v < NV; ++v) {  // a vector at a time: one copy of the whole array went through
                                  // the stack, and stalled each load on four stores
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      std::memcpy(&out[v], p + v * lanes, sizeof(out[v]));
    } else {
      acc_t values[lanes];
      for (int64_t l = 0; l < lanes; ++l) values[l] = static_cast<acc_t>(p[v * lanes + l]);
      std::memcpy(&out[v], values, sizeof(values));
    }
  }
}

// The block below, entry by entry, for a block whose whole vectors would read past dy's end
// (the last group's last pixels, where its channels fill no whole vector): the same terms in the
// same order, each rounded once (std::fma, as each lane of the vectors), from 0 and added to the
// totals, or continuing the partial sums (`Carried`). Input channel c's value for output channel
// o is at c * channel_step + o * lane_step in a pixel of x (1, 0) or of the spread (its channel
// step, 1).
template <bool Carried, typename operand_t, typename scalar_t, typename acc_t>
void sum_tap_block_by_entries(const TapPixels& t, const operand_t* x, int64_t channel_step,
                              int64_t lane_step, const scalar_t* dy, int64_t channels,
                              int64_t count, acc_t* total, int64_t total_row) {
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t o = 0; o < count; ++o) {
      acc_t sum = Carried ? total[c * total_row + o] : acc_t(0);
      for (int64_t r = 0; r < t.rows; ++r) {
        for (int64_t k = 0; k < t.columns; ++k) {
          const acc_t value = static_cast<acc_t>(
              x[t.x_first + r * t.x_row + k * t.x_column + c * channel_step + o * lane_step]);
          const acc_t grad =
              static_cast<acc_t>(dy[t.dy_first + r * t.dy_row + k * t.dy_column + o]);
          sum = std::fma(value, grad, sum);
        }
      }
      total[c * total_row + o] = Carried ? sum : total[c * total_row + o] + sum;
    }
  }
}

// The block of CB input channels (from `x`'s first) x NV vectors of output channels (from
// `dy`'s first, `count` of them real), over the pixels of one tap of one image: summed in
// registers from 0, then added to the group's totals at `total` (rows of `total_row`). A term's
// input value is broadcast from x or, from the spread (`Spread`, input channels
// `channel_step` apart), a vector of it. The spread holds a band of an image's rows at a time:
// there `total` is the image's partial sums, which the block continues from and stores back, the
// same chain of multiply-adds carried from band to band.
template <class Ops, int NV, int CB, bool Spread, typename operand_t, typename scalar_t,
          typename acc_t>
TORCH_CONVBP_INLINE void sum_tap_block(const TapPixels& t, const operand_t* x, int64_t channel_step,
                                       const scalar_t* dy, int64_t count, const scalar_t* dy_end,
                                       acc_t* total, int64_t total_row) {
  using V = typename Vector<acc_t, Ops::kBytes>::type;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  if (t.rows > 0 && t.columns > 0) {
    const int64_t last = t.dy_first + (t.rows - 1) * t.dy_row + (t.columns - 1) * t.dy_column;
    if (dy_end - (dy + last) < NV * lanes) {
      return sum_tap_block_by_entries<Spread>(t, x, channel_step, Spread ? 1 : 0, dy, CB, count,
                                              total, total_row);
    }
  }
  V sum[CB][NV] = {};
  if constexpr (Spread) {
    for (int c = 0; c < CB; ++c) {
      for (int v = 0; v < NV; ++v) {
        std::memcpy(&sum[c][v], total + c * total_row + v * lanes, sizeof(V));
      }
    }
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    const operand_t* x_row = x + t.x_first + r * t.x_row;
    const scalar_t* dy_row = dy + t.dy_first + r * t.dy_row;
    for (int64_t k = 0; k < t.columns; ++k) {
      V grads[NV];
      load_vectors<NV, acc_t>(dy_row + k * t.dy_column, grads);
      const operand_t* x_pixel = x_row + k * t.x_column;
      for (int c = 0; c < CB; ++c) {
        if constexpr (Spread) {
          for (int v = 0; v < NV; ++v) {
            V values;
            std::memcpy(&values, x_pixel + c * channel_step + v * lanes, sizeof(V));
            sum[c][v] = Ops::multiply_add(values, grads[v], sum[c][v]);
          }
        } else {
          const V value = Ops::template splat<V>(static_cast<acc_t>(x_pixel[c]));
          for (int v = 0; v < NV; ++v) sum[c][v] = Ops::multiply_add(value, grads[v], sum[c][v]);
        }
      }
    }
  }
  for (int c = 0; c < CB; ++c) {
    for (int v = 0; v < NV; ++v) {
      V partial = sum[c][v];
      if constexpr (!Spread) {
        V before;
        std::memcpy(&before, total + c * total_row + v * lanes, sizeof(V));
        partial = before + sum[c][v];
      }
      std::memcpy(total + c * total_row + v * lanes, &partial, sizeof(V));
    }
  }
}

// Input channels per block for NV vectors of output channels: CB * NV sums, NV gradient vectors
// and a splat in the 16 AVX2 registers, or in AVX-512's 32 (`bytes` 64).
constexpr int channels_per_block(int nv, int bytes) {
  return bytes == 64 ? (nv == 1 ? 16 : 12) : (nv == 1 ? 8 : 6);
}

// One tap of one image for a slice of NV vectors of a group's output channels: the group's
// input channels in blocks of CB, then the rest in blocks of 4, 2 and 1.
template <class Ops, int NV, bool Spread, typename operand_t, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_tap_slice(const TapPixels& t, const operand_t* x, int64_t channel_step,
                                       const scalar_t* dy, int64_t group_in, int64_t count,
                                       const scalar_t* dy_end, acc_t* total, int64_t total_row) {
  constexpr int CB = channels_per_block(NV, Ops::kBytes);
  // (calls written out: a lambda is compiled for the baseline, and would not inline the AVX2
  // operations)
  int64_t c = 0;  // input channels done
  for (; c + CB <= group_in; c += CB) {
    sum_tap_block<Ops, NV, CB, Spread>(t, x + c * channel_step, channel_step, dy, count, dy_end,
                                       total + c * total_row, total_row);
  }
  for (; c + 4 <= group_in; c += 4) {  // (more than one where CB is 12 or 16)
    sum_tap_block<Ops, NV, 4, Spread>(t, x + c * channel_step, channel_step, dy, count, dy_end,
                                      total + c * total_row, total_row);
  }
  if (c + 2 <= group_in) {
    sum_tap_block<Ops, NV, 2, Spread>(t, x + c * channel_step, channel_step, dy, count, dy_end,
                                      total + c * total_row, total_row);
    c += 2;
  }
  if (c < group_in) {
    sum_tap_block<Ops, NV, 1, Spread>(t, x + c * channel_step, channel_step, dy, count, dy_end,
                                      total + c * total_row, total_row);
  }
}

// What a task shares: the group's channel counts and the totals' row length (Cout/G rounded up
// to whole vectors).
struct GroupDims {
  int64_t group_in, group_out, total_row;
};

// One image's terms of group g for taps [first_tap, end_tap), added to the group's totals
// [taps, C/G, total_row]: for each tap and each slice of at most 2 vectors of output channels (as
// the forward's blocks, grouped_forward_cpu.cpp), the blocks above. `x` and `dy` are the group's
// first channels of the image's first pixel, `x_pixel` and `dy_pixel` elements a pixel.
template <class Ops, typename operand_t, typename grad_t, typename acc_t>
TORCH_CONVBP_INLINE void sum_image_taps(const operand_t* x, int64_t x_pixel, const grad_t* dy,
                                        int64_t dy_pixel, const grad_t* dy_end, int64_t first_tap,
                                        int64_t end_tap, const ConvShape& s, const GroupDims& d,
                                        acc_t* totals) {
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  constexpr int64_t slice = 2 * lanes;
  for (int64_t tap = first_tap; tap < end_tap; ++tap) {
    const TapPixels t =
        tap_pixels(s, tap / s.kernel_w, tap % s.kernel_w, {0, s.out_height}, 0, x_pixel, dy_pixel);
    acc_t* tap_totals = totals + tap * d.group_in * d.total_row;
    for (int64_t first = 0; first < d.group_out; first += slice) {
      const int64_t count = std::min(slice, d.group_out - first);
      if (count > lanes) {
        sum_tap_slice<Ops, 2, false>(t, x, 1, dy + first, d.group_in, count, dy_end,
                                     tap_totals + first, d.total_row);
      } else {
        sum_tap_slice<Ops, 1, false>(t, x, 1, dy + first, d.group_in, count, dy_end,
                                     tap_totals + first, d.total_row);
      }
    }
  }
}

// A task's copies of one image's channels of a group, widened to the sums' type (bfloat16 and
// float16 only).
template <typename acc_t>
struct WidenedGroup {
  std::vector<acc_t> x, dy;
};

// Group g's totals [taps, C/G, total_row] for taps [first_tap, end_tap), summed over the images in
// order (sum_image_taps). Images narrower than the sums have their group's channels widened
// first (widen, bfloat16_cpu.h), x as [pixels, C/G] and dy as [pixels, total_row] (zeros past
// Cout/G): a term's values are then loads, where converting each as it was read took the
// bfloat16 kernel to 3-4x float32's time (benchmarks/NOTES.md, section 121). Compiled for each set
// of vector operations (run_compiled_for, vector_ops.h).
struct GroupTotals {
  template <class Ops, typename scalar_t, typename acc_t>
  static TORCH_CONVBP_INLINE void run(const scalar_t* input, const scalar_t* grad_output, int64_t g,
                                      int64_t first_tap, int64_t end_tap, const ConvShape& s,
                                      const GroupDims& d, WidenedGroup<acc_t>& widened,
                                      acc_t* totals);
};

template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void GroupTotals::run(const scalar_t* input, const scalar_t* grad_output,
                                          int64_t g, int64_t first_tap, int64_t end_tap,
                                          const ConvShape& s, const GroupDims& d,
                                          WidenedGroup<acc_t>& widened, acc_t* totals) {
  const int64_t pixels = s.height * s.width, out_pixels = s.out_height * s.out_width;
  const int64_t image_size = pixels * s.in_channels, grad_image_size = out_pixels * s.out_channels;
  for (int64_t n = 0; n < s.batch; ++n) {
    const scalar_t* x = input + n * image_size + g * d.group_in;
    const scalar_t* dy = grad_output + n * grad_image_size + g * d.group_out;
    if constexpr (!std::is_same_v<scalar_t, acc_t>) {
      widened.x.resize(pixels * d.group_in);
      widened.dy.resize(out_pixels * d.total_row);
      for (int64_t p = 0; p < pixels; ++p) {
        widen(x + p * s.in_channels, d.group_in, widened.x.data() + p * d.group_in);
      }
      for (int64_t p = 0; p < out_pixels; ++p) {
        acc_t* row = widened.dy.data() + p * d.total_row;
        widen(dy + p * s.out_channels, d.group_out, row);
        std::fill(row + d.group_out, row + d.total_row, acc_t(0));
      }
      const acc_t* dy_wide = widened.dy.data();
      sum_image_taps<Ops>(widened.x.data(), d.group_in, dy_wide, d.total_row,
                          dy_wide + widened.dy.size(), first_tap, end_tap, s, d, totals);
    } else {
      sum_image_taps<Ops>(x, s.in_channels, dy, s.out_channels,
                          grad_output + s.batch * grad_image_size, first_tap, end_tap, s, d,
                          totals);
    }
  }
}

// What a task summing across the groups keeps from slice to slice: an image's partial sums
// [taps, C/G, 2 * lanes], and the spread of a band of its rows.
template <typename acc_t>
struct SliceScratch {
  std::vector<acc_t> partial, spread;
};

// Output rows per band, summed across the groups: as many as spread into about 64 KiB (the L1
// cache and a little more; the kernel rows the band's first and last rows reach beyond it are
// spread by both bands).
int64_t spread_band_rows(const ConvShape& s, int64_t spread_pixel_bytes) {
  const int64_t input_rows = (int64_t{64} << 10) / (s.width * spread_pixel_bytes);
  const int64_t reach = (s.kernel_h - 1) * s.dilation_h + 1;
  return std::clamp<int64_t>((input_rows - reach) / s.stride_h + 1, 1, s.out_height);
}

// Summed across the groups (groups of half a vector): the totals [taps, C/G, 2 * lanes] of the
// output channels' vectors [first_vector, first_vector + vectors) (1 or 2: two to four groups),
// taps [first_tap, end_tap), over the images in order. An image goes in bands of `band` output
// rows: each band's input rows spread over those channels (few enough to stay in the L1 cache
// over the band's taps: read from the L2 cache once per tap and block, a whole image's spread
// took 1.7x the time of the broadcast kernel; NOTES section 49), and every tap's blocks carry the
// image's partial sums on to the next band. The image's partial sums are then added to the totals.
// Compiled for each set of vector operations (run_compiled_for, vector_ops.h).
struct SliceTotals {
  template <class Ops, typename scalar_t, typename acc_t>
  static TORCH_CONVBP_INLINE void run(const scalar_t* input, const scalar_t* grad_output,
                                      int64_t first_vector, int64_t vectors, int64_t first_tap,
                                      int64_t end_tap, int64_t band, const ConvShape& s,
                                      SliceScratch<acc_t>& scratch, acc_t* totals);
};

template <class Ops, typename scalar_t, typename acc_t>
TORCH_CONVBP_INLINE void SliceTotals::run(const scalar_t* input, const scalar_t* grad_output,
                                          int64_t first_vector, int64_t vectors, int64_t first_tap,
                                          int64_t end_tap, int64_t band, const ConvShape& s,
                                          SliceScratch<acc_t>& scratch, acc_t* totals) {
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  const int64_t group_in = s.in_channels / s.groups, total_row = 2 * lanes;
  const int64_t channel_step = vectors * lanes, pixel_size = group_in * channel_step;
  const int64_t first = first_vector * lanes;
  const int64_t count = std::min(channel_step, s.out_channels - first);
  const int64_t grad_image_size = s.out_height * s.out_width * s.out_channels;
  const scalar_t* dy_end = grad_output + s.batch * grad_image_size;
  std::vector<acc_t>& partial = scratch.partial;
  partial.resize(s.kernel_h * s.kernel_w * group_in * total_row);
  for (int64_t n = 0; n < s.batch; ++n) {
    const scalar_t* image = input + n * s.height * s.width * s.in_channels;
    const scalar_t* dy = grad_output + n * grad_image_size + first;
    std::fill(partial.begin(), partial.end(), acc_t(0));
    for (int64_t first_row = 0; first_row < s.out_height; first_row += band) {
      const Span out_rows{first_row, std::min(first_row + band, s.out_height)};
      const Span in_rows = band_input_rows(s, first_row, out_rows.end - out_rows.begin);
      const int64_t pixels = std::max<int64_t>(in_rows.end - in_rows.begin, 0) * s.width;
      acc_t* spread = cache_aligned(scratch.spread, pixels * pixel_size);
      spread_pixels<Ops>(image + in_rows.begin * s.width * s.in_channels, pixels, s, first_vector,
                         vectors, pixel_size, channel_step, spread);
      for (int64_t tap = first_tap; tap < end_tap; ++tap) {
        const TapPixels t = tap_pixels(s, tap / s.kernel_w, tap % s.kernel_w, out_rows,
                                       in_rows.begin, pixel_size, s.out_channels);
        acc_t* tap_partial = partial.data() + tap * group_in * total_row;
        if (vectors == 2) {
          sum_tap_slice<Ops, 2, true>(t, spread, channel_step, dy, group_in, count, dy_end,
                                      tap_partial, total_row);
        } else {
          sum_tap_slice<Ops, 1, true>(t, spread, channel_step, dy, group_in, count, dy_end,
                                      tap_partial, total_row);
        }
      }
    }
    for (int64_t e = first_tap * group_in * total_row; e < end_tap * group_in * total_row; ++e) {
      totals[e] += partial[e];
    }
  }
}

// The weight gradient's tasks: `units` (groups, or slices of output channels across the groups)
// and, where the units are fewer than the threads, parts of their taps (a tap's entries never
// span two tasks). sum(unit, first_tap, end_tap, scratch, totals) fills a task's totals [taps,
// C/G, total_row], from 0, for the output channels [first_out(unit), + channels(unit)), which are
// then rounded into grad_weight [Cout, C/G, kh, kw]; a thread's tasks share one Scratch. Only the
// cut into tasks depends on the thread count, never an entry's sum.
template <typename Scratch, typename scalar_t, typename acc_t, typename FirstOut, typename Channels,
          typename Sum>
void weight_grad_tasks(int64_t units, int64_t total_row, FirstOut first_out, Channels channels,
                       Sum sum, scalar_t* grad_weight, const ConvShape& s) {
  const int64_t group_in = s.in_channels / s.groups, taps = s.kernel_h * s.kernel_w;
  const int64_t threads = at::get_num_threads();
  const int64_t tap_parts = std::min(taps, (threads + units - 1) / units);
  at::parallel_for(0, units * tap_parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> totals(taps * group_in * total_row);
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t unit = task / tap_parts, part = task % tap_parts;
      const int64_t first_tap = part * taps / tap_parts, end_tap = (part + 1) * taps / tap_parts;
      std::fill(totals.begin(), totals.end(), acc_t(0));
      sum(unit, first_tap, end_tap, scratch, totals.data());
      for (int64_t j = 0; j < channels(unit); ++j) {
        scalar_t* w = grad_weight + (first_out(unit) + j) * group_in * taps;
        for (int64_t i = 0; i < group_in; ++i) {
          for (int64_t tap = first_tap; tap < end_tap; ++tap) {
            w[i * taps + tap] = static_cast<scalar_t>(totals[(tap * group_in + i) * total_row + j]);
          }
        }
      }
    }
  });
}

// Across the groups, the units are slices of 2 vectors of output channels: each task spreads only
// its own channels' input. Group by group, the units are the groups.
template <class Ops, typename scalar_t>
void weight_grad_kernel(const scalar_t* input, const scalar_t* grad_output, scalar_t* grad_weight,
                        const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t lanes = Vector<acc_t, Ops::kBytes>::lanes;
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  if (summed_across_groups(s, lanes)) {
    const int64_t vectors = (s.out_channels + lanes - 1) / lanes;
    const int64_t band = spread_band_rows(s, group_in * 2 * lanes * int64_t(sizeof(acc_t)));
    const auto slice_vectors = [&](int64_t slice) {
      return std::min<int64_t>(2, vectors - 2 * slice);
    };
    const auto first_out = [&](int64_t slice) { return 2 * slice * lanes; };
    weight_grad_tasks<SliceScratch<acc_t>, scalar_t, acc_t>(
        (vectors + 1) / 2, 2 * lanes, first_out,
        [&](int64_t slice) {
          return std::min(slice_vectors(slice) * lanes, s.out_channels - first_out(slice));
        },
        [&](int64_t slice, int64_t first_tap, int64_t end_tap, SliceScratch<acc_t>& scratch,
            acc_t* totals) {
          run_compiled_for<SliceTotals>(Ops{}, input, grad_output, 2 * slice, slice_vectors(slice),
                                        first_tap, end_tap, band, s, scratch, totals);
        },
        grad_weight, s);
    return;
  }
  const GroupDims d{group_in, group_out, (group_out + lanes - 1) / lanes * lanes};
  weight_grad_tasks<WidenedGroup<acc_t>, scalar_t, acc_t>(
      s.groups, d.total_row, [&](int64_t g) { return g * group_out; },
      [&](int64_t) { return group_out; },
      [&](int64_t g, int64_t first_tap, int64_t end_tap, WidenedGroup<acc_t>& widened,
          acc_t* totals) {
        run_compiled_for<GroupTotals>(Ops{}, input, grad_output, g, first_tap, end_tap, s, d,
                                      widened, totals);
      },
      grad_weight, s);
}

void grouped_weight_grad_cpu(const Tensor& input, const Tensor& grad_output, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                             const Tensor& grad_weight) {
  const ConvShape s = check_grouped("torch_convbp.grouped_weight_grad", input, grad_weight,
                                    grad_output, stride, padding, dilation, groups);
  if (grad_weight.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "grouped_weight_grad", [&] {
        with_ops_for_groups<at::opmath_type<scalar_t>>(s, [&](auto ops) {
          weight_grad_kernel<decltype(ops)>(input.const_data_ptr<scalar_t>(),
                                            grad_output.const_data_ptr<scalar_t>(),
                                            grad_weight.mutable_data_ptr<scalar_t>(), s);
        });
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("grouped_weight_grad", &grouped_weight_grad_cpu);
}

}  // namespace torch_convbp
