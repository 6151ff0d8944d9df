// The CPU kernels of the depthwise special case on channels_last (NHWC) activations.
//
// In NHWC the channels of a pixel are adjacent, so the innermost loop of every kernel runs along
// the channels (a vectorizable loop of C or Cout entries), where the NCHW kernels run along a row.
// Each result entry is still summed in the NCHW kernels' order (depthwise_cpu.cpp, summation.h):
// forward taps in (ki, kj) order, input-gradient terms in (o, ki, kj) order, and weight-gradient
// positions j into lane j % kSumLanes in increasing j, then the fixed tree. So an NHWC call gives
// bitwise what the NCHW call of the same values gives, on any thread count, and what the CUDA
// kernels give (cuda/depthwise_thread.h, checked by the CPU harness).
//
// Output channel o reads input channel o / m (channel multiplier m = Cout / C). The weight is
// used transposed, as [kh*kw, Cout] in opmath, so that a tap's weights are adjacent too.
//
// The forward and input gradient also take NCHW operands (Layout::nchw): a block of channels of
// one image at a time, transposed to NHWC in cache, computed as a convolution of its own, and
// transposed back. The channels of a depthwise convolution do not meet, so each entry's sum is the
// same as in the whole image's.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "../summation.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "depthwise_nhwc_cpu.h"
#include "depthwise_strips_cpu.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

// The weight [Cout, 1, (kd,) kh, kw] as [(kd*)kh*kw, Cout] in the sums' type: one tap's weights
// adjacent.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
std::vector<acc_t> weight_by_tap(const scalar_t* weight, const ConvShape& s) {
  const int64_t taps = s.taps();
  std::vector<acc_t> by_tap(taps * s.out_channels);
  for (int64_t o = 0; o < s.out_channels; ++o) {
    for (int64_t t = 0; t < taps; ++t) by_tap[t * s.out_channels + o] = weight[o * taps + t];
  }
  return by_tap;
}

// A block of channels summed in registers: every tap of a pixel adds into the block before it is
// stored, so each sum is loaded and stored once rather than once per tap.
constexpr int64_t kChannelBlock = 16;

// The terms of one pixel's sums, in summation order: term i multiplies the weights at
// weight_offset[i] by the operand pixel at operand_offset[i] (offsets in channels).
struct Terms {
  std::vector<int64_t> weight_offset, operand_offset;
  explicit Terms(int64_t most) { weight_offset.reserve(most), operand_offset.reserve(most); }
  void clear() { weight_offset.clear(), operand_offset.clear(); }
  void add(int64_t weight, int64_t operand) {
    weight_offset.push_back(weight), operand_offset.push_back(operand);
  }
};

// The pixels of a row whose kernel taps all lie inside the image (or, for the input gradient,
// inside the output): there a pixel's terms are those of the pixel `period` columns before it,
// with the operand `shift` elements further on. So a row builds their terms once per residue
// modulo the period, where building them for every pixel cost more than the sums themselves on
// narrow layers (benchmarks/NOTES.md, section 19).
struct RepeatingColumns {
  Span columns;
  int64_t period, shift;
};

// The terms of each pixel of a row. For pixel x, build(x, terms) builds them, with offsets
// from the operand of the row; the pixel's terms are then at `operand_shift` elements on.
class RowTerms {
 public:
  RowTerms(int64_t most_terms, int64_t most_period)
      : own_(most_terms), repeating_(most_period, Terms(most_terms)) {}

  struct Use {
    const Terms& terms;
    int64_t operand_shift;
  };
  template <typename Build>
  Use for_pixel(int64_t x, const RepeatingColumns& r, Build&& build) {
    if (x < r.columns.begin || x >= r.columns.end) {
      own_.clear();
      build(x, own_);
      return {own_, 0};
    }
    const int64_t residue = (x - r.columns.begin) % r.period, t = (x - r.columns.begin) / r.period;
    Terms& terms = repeating_[residue];
    if (t == 0) {  // the first such pixel of its residue: its terms serve those after it
      terms.clear();
      build(x, terms);
    }
    return {terms, t * r.shift};
  }

 private:
  Terms own_;
  std::vector<Terms> repeating_;
};

// sum[b] += wt[b] * op[operand_channel(first + b)] for one block: one pixel's term.
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void add_term(acc_t* sum, const acc_t* wt, const scalar_t* op, int64_t first,
                                  Channel operand_channel) {
  for (int64_t b = 0; b < kChannelBlock; ++b) {
    sum[b] = multiply_add(wt[b], static_cast<acc_t>(op[operand_channel(first + b)]), sum[b]);
  }
}

// One block of kChannelBlock adjacent channels (step 1): the sums in registers. The trip counts
// are constants, down to the stores, so that the compiler keeps `sum` in vector registers: with
// a store loop of a run-time length it kept them as 16 scalars (benchmarks/NOTES.md, section 18).
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void sum_full_block(const Terms& terms, const acc_t* w, const scalar_t* operand,
                                        int64_t first, Channel operand_channel, scalar_t* result) {
  acc_t sum[kChannelBlock] = {};
  for (size_t i = 0; i < terms.weight_offset.size(); ++i) {
    add_term(sum, w + terms.weight_offset[i] + first, operand + terms.operand_offset[i], first,
             operand_channel);
  }
  for (int64_t b = 0; b < kChannelBlock; ++b) result[first + b] = static_cast<scalar_t>(sum[b]);
}

// Any block: `block` channels from `first`, `step` apart.
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void sum_any_block(const Terms& terms, const acc_t* w, const scalar_t* operand,
                                       int64_t first, int64_t block, int64_t step,
                                       Channel operand_channel, scalar_t* result) {
  acc_t sum[kChannelBlock] = {};
  for (size_t i = 0; i < terms.weight_offset.size(); ++i) {
    const acc_t* wt = w + terms.weight_offset[i];
    const scalar_t* op = operand + terms.operand_offset[i];
    for (int64_t b = 0; b < block; ++b) {
      const int64_t channel = (first + b) * step;
      sum[b] = multiply_add(wt[channel], static_cast<acc_t>(op[operand_channel(channel)]), sum[b]);
    }
  }
  for (int64_t b = 0; b < block; ++b) result[first + b] = static_cast<scalar_t>(sum[b]);
}

// result[b] = the sum over the terms, in order, of w[b * step] * operand[b * step] for the
// channels b of one pixel, kChannelBlock channels at a time. The channels of the weights and
// operands are `step` apart (the multiplier m for the input gradient's view of the output
// channels, 1 otherwise). The forward with m > 1 reads input channel o / m, which
// `operand_channel` maps.
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void sum_terms(const Terms& terms, const acc_t* w, const scalar_t* operand,
                                   int64_t channels, int64_t step, Channel operand_channel,
                                   scalar_t* result) {
  for (int64_t first = 0; first < channels; first += kChannelBlock) {
    const int64_t block = std::min(kChannelBlock, channels - first);
    if (block == kChannelBlock && step == 1) {
      sum_full_block(terms, w, operand, first, operand_channel, result);
    } else {
      sum_any_block(terms, w, operand, first, block, step, operand_channel, result);
    }
  }
}

// Pixels whose terms are the same but for a shift of the operand, summed side by side: kPixels
// pixels, `operand_step` elements apart in the operand and `result_step` in the result. A term's
// weights are then loaded once for all of them, and its offsets read once: one pixel at a time,
// each multiply-add loaded its weight and its operand, and the kernels waited on the loads
// (benchmarks/NOTES.md, section 110). Each pixel's sums are the one-pixel kernels' sums.
constexpr int64_t kPixels = 4;

// Asks for this block's operand lines of the next kPixels pixels, at the first and the last term
// (the forward's last tap and the input gradient's first reach furthest on, into the row that
// no earlier result row has read). Side by side, the pixels' loads jump 4 pixels ahead block by
// block, and the hardware's prefetcher no longer kept up where the operands stream from memory:
// without this, 128@56's forward and input gradient took 1.1-1.3x the one-pixel sums' time
// (benchmarks/NOTES.md, section 110).
template <typename scalar_t>
TORCH_CONVBP_INLINE void prefetch_next_pixels(const Terms& terms, const scalar_t* operand,
                                              int64_t operand_step, int64_t channel) {
  if (terms.operand_offset.empty()) return;
  const scalar_t* first = operand + terms.operand_offset.front() + channel;
  const scalar_t* last = operand + terms.operand_offset.back() + channel;
  for (int64_t p = kPixels; p < 2 * kPixels; ++p) {
    __builtin_prefetch(first + p * operand_step);
    __builtin_prefetch(last + p * operand_step);
  }
}

// The sums are four arrays of their own, not one [kPixels][kChannelBlock]: GCC kept those on the
// stack, these in vector registers.
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void sum_full_block_of_pixels(const Terms& terms, const acc_t* w,
                                                  const scalar_t* operand, int64_t operand_step,
                                                  int64_t first, Channel operand_channel,
                                                  scalar_t* result, int64_t result_step) {
  static_assert(kPixels == 4);
  acc_t sum0[kChannelBlock] = {}, sum1[kChannelBlock] = {}, sum2[kChannelBlock] = {},
        sum3[kChannelBlock] = {};
  prefetch_next_pixels(terms, operand, operand_step, operand_channel(first));
  for (size_t i = 0; i < terms.weight_offset.size(); ++i) {
    const acc_t* wt = w + terms.weight_offset[i] + first;
    const scalar_t* op = operand + terms.operand_offset[i];
    add_term(sum0, wt, op, first, operand_channel);
    add_term(sum1, wt, op + operand_step, first, operand_channel);
    add_term(sum2, wt, op + 2 * operand_step, first, operand_channel);
    add_term(sum3, wt, op + 3 * operand_step, first, operand_channel);
  }
  for (int64_t b = 0; b < kChannelBlock; ++b) {
    result[first + b] = static_cast<scalar_t>(sum0[b]);
    result[result_step + first + b] = static_cast<scalar_t>(sum1[b]);
    result[2 * result_step + first + b] = static_cast<scalar_t>(sum2[b]);
    result[3 * result_step + first + b] = static_cast<scalar_t>(sum3[b]);
  }
}

// sum_terms for kPixels pixels that share their terms (as above).
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void sum_terms_of_pixels(const Terms& terms, const acc_t* w,
                                             const scalar_t* operand, int64_t operand_step,
                                             int64_t channels, int64_t step,
                                             Channel operand_channel, scalar_t* result,
                                             int64_t result_step) {
  for (int64_t first = 0; first < channels; first += kChannelBlock) {
    const int64_t block = std::min(kChannelBlock, channels - first);
    if (block == kChannelBlock && step == 1) {
      sum_full_block_of_pixels(terms, w, operand, operand_step, first, operand_channel, result,
                               result_step);
    } else {
      for (int64_t p = 0; p < kPixels; ++p) {
        sum_any_block(terms, w, operand + p * operand_step, first, block, step, operand_channel,
                      result + p * result_step);
      }
    }
  }
}

// Output row oh of depth slice od of one image (od 0 of a 2-D one), all columns and channels:
// each output element is the sum over the taps, in (kd, ki, kj) order, of the tap's weight times
// the input element the tap reads. `done`: the row's pixels its caller computed already (a
// bfloat16 row's strips), strip_pixels of its inner columns, or none.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_WIDE_VECTOR_CLONES void forward_row(const scalar_t* image, const acc_t* w_by_tap,
                                                 int64_t od, int64_t oh, RowTerms& row_terms,
                                                 scalar_t* out, const ConvShape& s,
                                                 Span done = {0, 0}) {
  const int64_t c = s.in_channels, cout = s.out_channels, m = cout / c;
  // The columns every tap reads inside the image; the next output column reads stride_w input
  // columns on.
  RepeatingColumns inner{inner_columns(s), 1, s.stride_w * c};
  // A 3x3 kernel's inner columns in strips first (depthwise_strips_cpu.h); the rest here, the
  // inner columns' terms built again where the strips end.
  Span strips = done;
  if constexpr (std::is_same_v<scalar_t, float> && std::is_same_v<acc_t, float>) {
    if (done.end == done.begin) {
      strips = {inner.columns.begin,
                depthwise_strips(StripPass::forward, image, w_by_tap, oh, inner.columns, out, s)};
    }
  }
  if (strips.end > strips.begin) inner.columns.begin = strips.end;
  const auto build = [&](int64_t ow, Terms& terms) {
    for (int64_t kd = 0; kd < s.kernel_d; ++kd) {
      const int64_t id = input_index(od, s.stride_d, s.pad_d, kd, s.dilation_d);
      if (id < 0 || id >= s.depth) continue;
      for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
        const int64_t ih = input_row(s, oh, ki);
        if (ih < 0) continue;
        for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
          const int64_t iw = input_index(ow, s.stride_w, s.pad_w, kj, s.dilation_w);
          if (iw >= 0 && iw < s.width) {
            terms.add(((kd * s.kernel_h + ki) * s.kernel_w + kj) * cout,
                      ((id * s.height + ih) * s.width + iw) * c);
          }
        }
      }
    }
  };
  const auto same = [](int64_t o) { return o; };
  const auto divided = [m](int64_t o) { return o / m; };
  for (int64_t ow = 0; ow < s.out_width;) {
    if (ow == strips.begin && strips.end > strips.begin) {
      ow = strips.end;
      continue;
    }
    // (the sums are called here, not from a lambda, so that they are compiled into this clone)
    const RowTerms::Use use = row_terms.for_pixel(ow, inner, build);
    const scalar_t* x = image + use.operand_shift;
    scalar_t* y = out + ow * cout;
    if (ow >= inner.columns.begin && ow + kPixels <= inner.columns.end) {
      if (m == 1) {
        sum_terms_of_pixels(use.terms, w_by_tap, x, inner.shift, cout, 1, same, y, cout);
      } else {
        sum_terms_of_pixels(use.terms, w_by_tap, x, inner.shift, cout, 1, divided, y, cout);
      }
      ow += kPixels;
    } else {
      if (m == 1) {
        sum_terms(use.terms, w_by_tap, x, cout, 1, same, y);
      } else {
        sum_terms(use.terms, w_by_tap, x, cout, 1, divided, y);
      }
      ow += 1;
    }
  }
}

// The input columns that every kernel column on their stride reads from inside the output:
// iw + pad_w - (kw-1)*dilation_w >= 0 and iw + pad_w <= (OW-1)*stride_w. Their taps repeat
// with the stride's period, one output column on.
Span input_grad_inner_columns(const ConvShape& s) {
  return {
      std::max<int64_t>(0,
                        input_index(int64_t{0}, s.stride_w, s.pad_w, s.kernel_w - 1, s.dilation_w)),
      std::min(s.width,
               input_index(s.out_width - 1, s.stride_w, s.pad_w, int64_t{0}, s.dilation_w) + 1)};
}

// Input row ih of depth slice id of one image (id 0 of a 2-D one), all columns and channels:
// each input-gradient element is the sum, in (o, kd, ki, kj) order, of what the forward took from
// it times the output gradient there. The m output channels of input channel ch are ch * m + k: a
// term per (k, kd, ki, kj), whose weights and output gradient start at channel k and step by m.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_WIDE_VECTOR_CLONES void input_grad_row(const scalar_t* grad_image,
                                                    const acc_t* w_by_tap, int64_t id, int64_t ih,
                                                    RowTerms& row_terms, scalar_t* grad_in,
                                                    const ConvShape& s, Span done = {0, 0}) {
  const int64_t c = s.in_channels, cout = s.out_channels, m = cout / c;
  Span inner = input_grad_inner_columns(s);
  // A 3x3 kernel's inner columns in strips first (depthwise_strips_cpu.h), as the forward's; or
  // `done`, those its caller computed already (a bfloat16 row's strips).
  Span strips = done;
  if constexpr (std::is_same_v<scalar_t, float> && std::is_same_v<acc_t, float>) {
    if (done.end == done.begin) {
      strips = {inner.begin, depthwise_strips(StripPass::input_grad, grad_image, w_by_tap, ih,
                                              inner, grad_in, s)};
    }
  }
  if (strips.end > strips.begin) inner.begin = strips.end;
  const RepeatingColumns repeating{inner, s.stride_w, cout};
  // The taps that read input pixel (id, ih, iw), from any output row of the image (taps.h).
  const ColumnGeometry image = column_geometry(s, c, s.groups, 0, s.output_rows());
  const auto build = [&](int64_t iw, Terms& terms) {
    for (int64_t k = 0; k < m; ++k) {
      for_each_tap_reading(image, id, ih, iw, [&](int64_t tap, int64_t row, int64_t ow) {
        terms.add(tap * cout + k, (row * s.out_width + ow) * cout + k);
      });
    }
  };
  // With stride 1, kPixels adjacent inner columns share their terms, one output column (cout
  // elements) apart. With a longer stride those of a residue do, but summed side by side (their
  // 1-4 terms each, their results `stride` pixels apart) the 3x3/2 layer's input gradient took
  // 1.4x the time (benchmarks/NOTES.md, section 110).
  const bool side_by_side = s.stride_w == 1;
  const auto same = [](int64_t o) { return o; };
  for (int64_t iw = 0; iw < s.width;) {
    if (iw == strips.begin && strips.end > strips.begin) {
      iw = strips.end;
      continue;
    }
    const RowTerms::Use use = row_terms.for_pixel(iw, repeating, build);
    const scalar_t* dy = grad_image + use.operand_shift;
    if (side_by_side && iw >= inner.begin && iw + kPixels <= inner.end) {
      sum_terms_of_pixels(use.terms, w_by_tap, dy, cout, c, m, same, grad_in + iw * c, c);
      iw += kPixels;
    } else {
      sum_terms(use.terms, w_by_tap, dy, c, m, same, grad_in + iw * c);
      iw += 1;
    }
  }
}

// l[b] += dy[b] * x[x_channel(first + b)] for kChannelBlock channels b of one position. The sums
// go through a local array, loaded, added into and stored back: the compiler cannot tell that l
// does not overlap dy or x, and written in place it kept the products scalar, one at a time
// (benchmarks/NOTES.md, section 18). A block's trip counts are constants (one or two vectors).
template <int64_t count, typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_INLINE void add_products(acc_t* l, const scalar_t* dy, const scalar_t* x,
                                      int64_t first, Channel x_channel) {
  acc_t sum[count];
  for (int64_t b = 0; b < count; ++b) sum[b] = l[b];
  for (int64_t b = 0; b < count; ++b) {
    sum[b] = multiply_add(static_cast<acc_t>(dy[b]), static_cast<acc_t>(x[x_channel(first + b)]),
                          sum[b]);
  }
  for (int64_t b = 0; b < count; ++b) l[b] = sum[b];
}

// One image's share of the weight gradient of `count` output channels (dy and, for m == 1, x
// start at the first of them): for each position j = first_position + oh * OW + ow, in increasing
// j, and each tap, lanes[j % kSumLanes][tap][b] += dy[j, b] * x[at the tap, x_channel(b)]. The
// lanes of one position are adjacent ([kSumLanes, taps, count]), and its output gradient is read
// once for all its taps: the layout [taps, kSumLanes, count] that added a tap at a time over
// every position took 1.1-1.8x the time (benchmarks/NOTES.md, section 42).
template <typename scalar_t, typename acc_t, typename Channel>
TORCH_CONVBP_WIDE_VECTOR_CLONES void add_weight_grad_lanes(const scalar_t* image,
                                                           const scalar_t* grad_image,
                                                           int64_t first_position, int64_t count,
                                                           Channel x_channel, acc_t* lanes,
                                                           const ConvShape& s) {
  const int64_t cout = s.out_channels, taps = s.kernel_h * s.kernel_w;
  const int64_t full = count / kChannelBlock * kChannelBlock;
  int64_t lane = first_position % kSumLanes;
  for (int64_t oh = 0; oh < s.out_height; ++oh) {
    for (int64_t ow = 0; ow < s.out_width; ++ow) {
      const scalar_t* dy = grad_image + (oh * s.out_width + ow) * cout;
      acc_t* position_lanes = lanes + lane * taps * count;
      for_each_tap_inside(image, oh, ow, s, [&](int64_t tap, const scalar_t* x) {
        acc_t* l = position_lanes + tap * count;
        int64_t b = 0;
        for (; b < full; b += kChannelBlock) {
          add_products<kChannelBlock>(l + b, dy + b, x, b, x_channel);
        }
        for (; b < count; ++b) add_products<1>(l + b, dy + b, x, b, x_channel);
      });
      lane = lane + 1 == kSumLanes ? 0 : lane + 1;
    }
  }
}

// The rows of the NHWC images a task reads, in the sums' type: each row of bfloat16 or float16
// converted once, when a result row first needs it, into an image of floats laid out as the
// source (so the kernels' offsets hold). Why: the kernels sum blocks of 16 channels that GCC
// vectorizes in float32, but with c10's conversion inside, one element at a time: 6-9x float32's
// time (benchmarks/NOTES.md, section 97). The same values, so the same sums and bits. The image
// is left uninitialized: only the rows a task converts (its result rows' reach) are written, and
// so only their pages are ever resident; and of each row only its `runs` (element ranges of the
// row: source_runs_outside), where the kernels read no other elements.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
class WidenedRows {
 public:
  WidenedRows(int64_t image_rows, int64_t row_size, std::vector<Span> runs)
      : values_(new acc_t[image_rows * row_size]), row_size_(row_size), runs_(std::move(runs)) {}

  // The image `image` with at least its rows [needed.begin, needed.end) converted. A task's
  // result rows ask for rows of one image in increasing order, then for the next image's.
  const acc_t* with_rows(const scalar_t* image, Span needed) {
    if (image != image_ || needed.begin > converted_.end) {
      image_ = image;
      converted_ = {needed.begin, needed.begin};
    }
    const int64_t from = std::max(converted_.end, needed.begin);
    for (int64_t row = from; row < needed.end; ++row) {
      for (const Span& run : runs_) {
        const int64_t first = row * row_size_ + run.begin;
        widen(image + first, run.end - run.begin, values_.get() + first);
      }
    }
    converted_.end = std::max(converted_.end, needed.end);
    return values_.get();
  }

 private:
  std::unique_ptr<acc_t[]> values_;
  int64_t row_size_;
  std::vector<Span> runs_;
  const scalar_t* image_ = nullptr;
  Span converted_{0, 0};
};

// The output rows that input row ih's gradient reads: those whose kernel rows reach it.
Span output_rows_reading(const ConvShape& s, int64_t ih) {
  const int64_t last = ih + s.pad_h, first = last - (s.kernel_h - 1) * s.dilation_h;
  const int64_t begin = std::max<int64_t>(0, ceil_div_signed(first, s.stride_h));
  const int64_t end = std::min(s.out_height, last / s.stride_h + 1);
  return {std::min(begin, end), end};
}

// The element runs of a source row (the forward's input, the input gradient's dY) that a pass's
// result pixels outside `done` read, `done` a run of result pixels of a stride-1 layer: the
// source columns within the kernel columns' reach of the pixels left of it and right of it; the
// whole row where `done` is empty. The forward's pixel ow reads input columns ow - pad + [0,
// reach], the input gradient's pixel iw dY columns iw + pad - [0, reach].
std::vector<Span> source_runs_outside(StripPass pass, const ConvShape& s, Span done) {
  const bool forward = pass == StripPass::forward;
  const int64_t width = forward ? s.width : s.out_width;
  const int64_t row = width * (forward ? s.in_channels : s.out_channels);
  if (done.end <= done.begin) return {{0, row}};
  const int64_t reach = (s.kernel_w - 1) * s.dilation_w;
  const int64_t shift = forward ? -s.pad_w : s.pad_w - reach;  // of a pixel's first column read
  const int64_t left_end = std::clamp<int64_t>(done.begin + shift + reach, 0, width);
  const int64_t right_begin = std::clamp<int64_t>(done.end + shift, 0, width);
  if (right_begin <= left_end) return {{0, row}};
  const int64_t pixel = row / width;
  return {{0, left_end * pixel}, {right_begin * pixel, row}};
}

// The rows [begin, end) of a pass's result (rows of `row_size` elements, `result_rows` an image)
// on bfloat16 or float16 operands: each row summed by compute_row(widened source image, row
// within the image, sums, done) in float32 from the source rows `source_rows_of(row)` widened
// (WidenedRows), then rounded into the result. bfloat16's strips (depthwise_strips_cpu.h) read and
// write its rows as they are, first: then only the source columns the other pixels read are
// widened, and only those pixels rounded after.
template <typename scalar_t, class SourceRows, class ComputeRow>
void rows_on_widened(StripPass pass, const scalar_t* source, int64_t source_rows,
                     int64_t source_row_size, const float* w_by_tap, scalar_t* result,
                     int64_t result_rows, int64_t row_size, const ConvShape& s, int64_t begin,
                     int64_t end, SourceRows&& source_rows_of, ComputeRow&& compute_row) {
  using acc_t = at::opmath_type<scalar_t>;
  const bool forward = pass == StripPass::forward;
  const Span inner = forward ? inner_columns(s) : input_grad_inner_columns(s);
  Span strips{0, 0};  // none, unless bfloat16's strips compute some pixels
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) strips = strip_pixels(s, inner);
  WidenedRows<scalar_t> images(source_rows, source_row_size, source_runs_outside(pass, s, strips));
  std::vector<acc_t> sums(row_size);
  const int64_t pixel = row_size / (forward ? s.out_width : s.width);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t n = row / result_rows, r = row % result_rows;
    const scalar_t* source_image = source + n * source_rows * source_row_size;
    scalar_t* out = result + row * row_size;
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      if (strips.end > strips.begin) {
        depthwise_strips(pass, source_image, w_by_tap, r, inner, out, s);
      }
    }
    compute_row(images.with_rows(source_image, source_rows_of(r)), r, sums.data(), strips);
    narrow(sums.data(), strips.begin * pixel, out);
    narrow(sums.data() + strips.end * pixel, row_size - strips.end * pixel,
           out + strips.end * pixel);
  }
}

// The forward of NHWC images, or of NDHWC volumes (float32 and float64 only): each task a run
// of output rows, the rows of every depth slice of every image in memory order.
template <typename scalar_t>
void forward_kernel(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                    const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const std::vector<acc_t> w_by_tap = weight_by_tap(weight, s);
  const int64_t taps = s.taps(), rows_per_image = s.output_rows();
  const int64_t row_size = s.out_width * s.out_channels, rows = s.batch * rows_per_image;
  const int64_t image_size = s.input_rows() * s.width * s.in_channels;
  at::parallel_for(0, rows, grain_for(row_size * taps), [&](int64_t begin, int64_t end) {
    RowTerms terms(taps, 1);
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t n = row / rows_per_image, r = row % rows_per_image;
        forward_row(input + n * image_size, w_by_tap.data(), r / s.out_height, r % s.out_height,
                    terms, output + row * row_size, s);
      }
    } else {
      TORCH_INTERNAL_ASSERT(s.is_planar());  // volumes: float32, float64 (check_depthwise_volumes)
      rows_on_widened(
          StripPass::forward, input, s.height, s.width * s.in_channels, w_by_tap.data(), output,
          s.out_height, row_size, s, begin, end,
          [&](int64_t oh) { return band_input_rows(s, oh, 1); },
          [&](const acc_t* image, int64_t oh, acc_t* sums, Span done) {
            forward_row(image, w_by_tap.data(), 0, oh, terms, sums, s, done);
          });
    }
  });
}

// The input gradient of NHWC images, or of NDHWC volumes (float32 and float64 only): each task a
// run of input rows, the rows of every depth slice of every image in memory order.
template <typename scalar_t>
void input_grad_kernel(const scalar_t* grad_output, const scalar_t* weight, scalar_t* grad_input,
                       const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const std::vector<acc_t> w_by_tap = weight_by_tap(weight, s);
  const int64_t taps = s.taps(), m = s.out_channels / s.in_channels;
  const int64_t rows_per_image = s.input_rows();
  const int64_t row_size = s.width * s.in_channels, rows = s.batch * rows_per_image;
  const int64_t grad_row_size = s.out_width * s.out_channels;
  const int64_t grad_image_size = s.output_rows() * grad_row_size;
  at::parallel_for(
      0, rows, grain_for(s.width * s.out_channels * taps), [&](int64_t begin, int64_t end) {
        RowTerms terms(taps * m, s.stride_w);
        if constexpr (std::is_same_v<scalar_t, acc_t>) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t n = row / rows_per_image, r = row % rows_per_image;
            input_grad_row(grad_output + n * grad_image_size, w_by_tap.data(), r / s.height,
                           r % s.height, terms, grad_input + row * row_size, s);
          }
        } else {
          TORCH_INTERNAL_ASSERT(s.is_planar());  // as the forward's
          rows_on_widened(
              StripPass::input_grad, grad_output, s.out_height, grad_row_size, w_by_tap.data(),
              grad_input, s.height, row_size, s, begin, end,
              [&](int64_t ih) { return output_rows_reading(s, ih); },
              [&](const acc_t* grad_image, int64_t ih, acc_t* sums, Span done) {
                input_grad_row(grad_image, w_by_tap.data(), 0, ih, terms, sums, s, done);
              });
        }
      });
}

// NCHW (NCDHW) operands in blocks of input channels of one image (volume): as many as keep a
// block's two bands within kBandElements (294 KiB of float32, in the L2 cache), a multiple of 16
// (the kernels' channel blocks), 16 to 192. Measured on 576@14, whose blocks are 192 channels:
// blocks of 64 took about 1.3x the time (a pixel's set-up over 4 channel blocks), a whole image's
// 576 about 1.4x (its bands out of L2) (benchmarks/NOTES.md, section 93). A volume's channels
// are larger than that: its blocks are 16 channels.
constexpr int64_t kBandElements = 192 * (196 + 196), kMostBandChannels = 192;
int64_t band_channels(const ConvShape& s) {
  const int64_t m = s.out_channels / s.in_channels;
  const int64_t per_channel = s.input_rows() * s.width + m * s.output_rows() * s.out_width;
  const int64_t fit = kBandElements / std::max<int64_t>(per_channel, 1) / 16 * 16;
  return std::clamp<int64_t>(fit, 16, kMostBandChannels);
}

// Each task one image's block of channels: source (NCHW) -> a band [pixels][channels] ->
// compute(band, block shape, result band) -> result (NCHW). `source_plane` and `result_plane`
// are the planes' (a volume's: all its slices') sizes, `source_per_channel` and
// `result_per_channel` the channels of source and result per input channel (1, or the multiplier m
// where they are output channels). The bands compute holds are in the sums' type: bfloat16 and
// float16 widened and narrowed around it, as WidenedRows does for NHWC operands.
template <typename scalar_t, typename Compute>
void by_channel_blocks(const scalar_t* source, int64_t source_plane, int64_t source_per_channel,
                       scalar_t* result, int64_t result_plane, int64_t result_per_channel,
                       const ConvShape& s, Compute&& compute) {
  const int64_t channels = band_channels(s);
  const int64_t blocks = (s.in_channels + channels - 1) / channels;
  const int64_t work = channels * s.output_rows() * s.out_width * s.taps();
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool widened = !std::is_same_v<scalar_t, acc_t>;
  at::parallel_for(0, s.batch * blocks, grain_for(work), [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> source_band, result_band;
    std::vector<acc_t> wide_source, wide_result;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / blocks, first = task % blocks * channels;
      const int64_t count = std::min(channels, s.in_channels - first);
      const int64_t source_channels = count * source_per_channel;
      const int64_t result_channels = count * result_per_channel;
      source_band.resize(source_plane * source_channels);
      result_band.resize(result_plane * result_channels);
      const int64_t source_first =
          n * s.in_channels * source_per_channel + first * source_per_channel;
      const int64_t result_first =
          n * s.in_channels * result_per_channel + first * result_per_channel;
      transpose_matrix(source + source_first * source_plane, source_plane, source_band.data(),
                       source_channels, source_channels, source_plane, sizeof(scalar_t));
      if constexpr (widened) {
        wide_source.resize(source_band.size());
        wide_result.resize(result_band.size());
        widen(source_band.data(), source_band.size(), wide_source.data());
        compute(first, depthwise_channel_block(s, count), wide_source.data(), wide_result.data());
        narrow(wide_result.data(), wide_result.size(), result_band.data());
      } else {
        compute(first, depthwise_channel_block(s, count), source_band.data(), result_band.data());
      }
      transpose_matrix(result_band.data(), result_channels, result + result_first * result_plane,
                       result_plane, result_plane, result_channels, sizeof(scalar_t));
    }
  });
}

// The forward of NCHW (NCDHW) operands: each block's output rows, of every depth slice, from its
// input band.
template <typename scalar_t>
void forward_of_nchw(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                     const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t m = s.out_channels / s.in_channels, taps = s.taps();
  by_channel_blocks(input, s.input_rows() * s.width, 1, output, s.output_rows() * s.out_width, m, s,
                    [&](int64_t first, const ConvShape& block, const acc_t* x, acc_t* y) {
                      const std::vector<acc_t> w = weight_by_tap(weight + first * m * taps, block);
                      RowTerms terms(taps, 1);
                      const int64_t row_size = block.out_width * block.out_channels;
                      for (int64_t row = 0; row < block.output_rows(); ++row) {
                        forward_row(x, w.data(), row / block.out_height, row % block.out_height,
                                    terms, y + row * row_size, block);
                      }
                    });
}

// The input gradient of NCHW (NCDHW) operands: each block's input rows, of every depth slice,
// from its output-gradient band.
template <typename scalar_t>
void input_grad_of_nchw(const scalar_t* grad_output, const scalar_t* weight, scalar_t* grad_input,
                        const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t m = s.out_channels / s.in_channels, taps = s.taps();
  by_channel_blocks(grad_output, s.output_rows() * s.out_width, m, grad_input,
                    s.input_rows() * s.width, 1, s,
                    [&](int64_t first, const ConvShape& block, const acc_t* dy, acc_t* dx) {
                      const std::vector<acc_t> w = weight_by_tap(weight + first * m * taps, block);
                      RowTerms terms(taps * m, block.stride_w);
                      const int64_t row_size = block.width * block.in_channels;
                      for (int64_t row = 0; row < block.input_rows(); ++row) {
                        input_grad_row(dy, w.data(), row / block.height, row % block.height, terms,
                                       dx + row * row_size, block);
                      }
                    });
}

// One level of summation.h's tree for `block` channels: lanes[lane][b] += lanes[lane + half][b]
// for lane < half, lanes `stride` entries apart. A full block has constant trip counts, and its
// sums go through a local array (as add_products): two vector additions per lane, where a loop of
// a run-time length cost more in its set-up than in its additions.
template <typename acc_t>
TORCH_CONVBP_INLINE void tree_level(acc_t* lanes, int64_t stride, int64_t block, int half) {
  for (int lane = 0; lane < half; ++lane) {
    acc_t* sum = lanes + lane * stride;
    const acc_t* other = lanes + (lane + half) * stride;
    if (block == kChannelBlock) {
      acc_t added[kChannelBlock];
      for (int64_t b = 0; b < kChannelBlock; ++b) added[b] = sum[b] + other[b];
      for (int64_t b = 0; b < kChannelBlock; ++b) sum[b] = added[b];
    } else {
      for (int64_t b = 0; b < block; ++b) sum[b] += other[b];
    }
  }
}

// lanes[0][b] = summation.h's tree over lanes[kSumLanes][count], per channel b. A block of
// kChannelBlock channels at a time goes through the whole tree: its lanes (16 KiB of float32)
// stay in the L1 cache, where level by level over all channels they streamed through memory
// 8 times (benchmarks/NOTES.md, section 19). Each channel's additions are the same.
template <typename acc_t>
TORCH_CONVBP_WIDE_VECTOR_CLONES void sum_lanes(acc_t* lanes, int64_t count) {
  for (int64_t first = 0; first < count; first += kChannelBlock) {
    const int64_t block = std::min(kChannelBlock, count - first);
    for (int half = kSumLanes / 2; half > 0; half /= 2)
      tree_level(lanes + first, count, block, half);
  }
}

// The output channels of one task of the weight gradient. Each task streams the whole of x and
// dy, reading its block's channels of every pixel, so:
// - a multiple of 16 channels, a 64-byte cache line of float32: blocks of 8 read half of every
//   line they fetched (benchmarks/NOTES.md, section 18);
// - as long as possible: a task per thread, or a multiple of the thread count where the lanes
//   [kSumLanes, taps, block] would pass kMostLanes (1 MiB of float32), in equal tasks for the
//   threads (section 18). Longer blocks measured faster than blocks of 16 channels on 56x56
//   planes (section 14); lanes past 1 MiB, out of L2, cost the small planes and the 5x5 kernels
//   15-30% (section 62).
// Only the cut into tasks depends on the thread count, never an entry's order of summation.
constexpr int64_t kMostLanes = int64_t{1} << 18;
int64_t weight_grad_block(const ConvShape& s) {
  const int64_t taps = s.kernel_h * s.kernel_w, threads = at::get_num_threads();
  const int64_t most = std::max<int64_t>(16, kMostLanes / (taps * kSumLanes) / 16 * 16);
  const auto block_for = [&](int64_t tasks) {
    return std::max<int64_t>(16, ((s.out_channels + tasks - 1) / tasks + 15) / 16 * 16);
  };
  int64_t tasks = threads;
  while (block_for(tasks) > most) tasks += threads;
  return block_for(tasks);
}

template <typename scalar_t>
void weight_grad_kernel(const scalar_t* input, const scalar_t* grad_output, scalar_t* grad_weight,
                        const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const int64_t image_size = s.height * s.width * s.in_channels;
  const int64_t grad_image_size = out_plane * s.out_channels;
  const int64_t block = weight_grad_block(s);
  const int64_t blocks = (s.out_channels + block - 1) / block;
  const int64_t m = s.out_channels / s.in_channels;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> lanes(kSumLanes * taps * block);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t first = index * block, count = std::min(block, s.out_channels - first);
      std::fill(lanes.begin(), lanes.end(), acc_t(0));
      for (int64_t n = 0; n < s.batch; ++n) {
        const scalar_t* x = input + n * image_size;
        const scalar_t* dy = grad_output + n * grad_image_size + first;
        if (m == 1) {  // output channel o reads input channel o
          add_weight_grad_lanes(
              x + first, dy, n * out_plane, count, [](int64_t b) { return b; }, lanes.data(), s);
        } else {  // output channel o reads input channel o / m
          add_weight_grad_lanes(
              x, dy, n * out_plane, count, [first, m](int64_t b) { return (first + b) / m; },
              lanes.data(), s);
        }
      }
      // the tree over the lanes of every (tap, channel) entry at once: lanes [kSumLanes, taps *
      // count]
      sum_lanes(lanes.data(), taps * count);
      for (int64_t t = 0; t < taps; ++t) {
        for (int64_t b = 0; b < count; ++b) {
          grad_weight[(first + b) * taps + t] = static_cast<scalar_t>(lanes[t * count + b]);
        }
      }
    }
  });
}

}  // namespace

void depthwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s,
                            const Tensor& output, Layout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_nhwc", [&] {
        const auto kernel =
            layout == Layout::nhwc ? forward_kernel<scalar_t> : forward_of_nchw<scalar_t>;
        kernel(input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
               output.mutable_data_ptr<scalar_t>(), s);
      });
}

void depthwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                               const Tensor& grad_input, Layout layout) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_nhwc", [&] {
        const auto kernel =
            layout == Layout::nhwc ? input_grad_kernel<scalar_t> : input_grad_of_nchw<scalar_t>;
        kernel(grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
               grad_input.mutable_data_ptr<scalar_t>(), s);
      });
}

void depthwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                                const Tensor& grad_weight) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_nhwc", [&] {
        weight_grad_kernel(input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
                           grad_weight.mutable_data_ptr<scalar_t>(), s);
      });
}

}  // namespace torch_convbp
