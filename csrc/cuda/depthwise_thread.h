// What one CUDA thread of the depthwise kernels computes, as host-and-device functions: the
// launch sequences of depthwise_launch.h run the functors at the end, on the GPU and, through the
// CPU harness (tests/cuda_harness/), on the CPU, where the results are compared bitwise with the
// CPU kernels (cpu/depthwise_cpu.cpp), which sum in the same orders (summation.h).
//
// One input channel per group, channel multiplier m = Cout / C: output channel o reads input
// channel o / m. Sums are taken in opmath (float for float16 and bfloat16).
//
// The activations (input, output and their gradients) are either all NCHW (contiguous) or all
// NHWC (dense channels_last); the weight [Cout, 1, kh, kw] is contiguous. The layout changes only
// where an element lies, never the order of a sum, so both layouts give the same bits.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include "../shape.h"
#include "../summation.h"
#include "../taps.h"
#include "divisor.h"
#include "plane_dims.h"

namespace torch_convbp {

// ConvShape in the kernel's index type, and the activations' layout.
template <typename index_t>
struct DepthwiseDims : PlaneDims<index_t> {
  index_t batch, multiplier;
  bool channels_last;
  DepthwiseDims(const ConvShape& s, bool channels_last)
      : PlaneDims<index_t>(s),
        batch(s.batch),
        multiplier(s.out_channels / s.in_channels),
        channels_last(channels_last) {}
};

// One channel of one image of an activation [N, C, H, W]: element (h, w) lies at
// base + h * row_stride + w * column_stride.
template <typename index_t>
struct Plane {
  index_t base, row_stride, column_stride;
  C10_HOST_DEVICE index_t at(index_t h, index_t w) const {
    return base + h * row_stride + w * column_stride;
  }
};
template <typename index_t>
C10_HOST_DEVICE inline Plane<index_t> plane_of(bool channels_last, index_t n, index_t c,
                                               index_t channels, index_t height, index_t width) {
  if (channels_last) return {n * height * width * channels + c, width * channels, channels};
  return {(n * channels + c) * height * width, width, 1};
}

// The element (n, c, h, w) at memory offset i of an activation [N, C, H, W] of `plane` = H * W
// pixels. Three divisions, each remainder taken by a multiplication; the divisors are plain
// values (the hardware's division) or Divisors fixed at launch (divisor.h).
template <typename index_t>
struct Element {
  index_t n, c, h, w;
};
template <typename index_t, typename D>
C10_HOST_DEVICE inline Element<index_t> element_at(bool channels_last, index_t i, const D& channels,
                                                   const D& plane, const D& width) {
  if (channels_last) {  // i = ((n * height + h) * width + w) * channels + c
    const index_t pixel = quotient(i, channels), n = quotient(pixel, plane);
    const index_t in_plane = pixel - n * value_of(plane), h = quotient(in_plane, width);
    return {n, i - pixel * value_of(channels), h, in_plane - h * value_of(width)};
  }
  // i = ((n * channels + c) * height + h) * width + w
  const index_t nc = quotient(i, plane), n = quotient(nc, channels);
  const index_t in_plane = i - nc * value_of(plane), h = quotient(in_plane, width);
  return {n, nc - n * value_of(channels), h, in_plane - h * value_of(width)};
}

// The forward and the input gradient. Each result is a sum over the taps: the forward's of
// weight times input in (ki, kj) order; the input gradient's a gather, in (o, ki, kj) order, of
// what the forward took from the input element times the output gradient there (no atomics). A
// thread computes a strip of kStripRows rows of one column; the index work around the taps took
// most of the instructions of one thread per result (benchmarks/NOTES.md, sections 72 and 76):
// - the kernel's size known at compile time, K x K (0: the dims' size), so that the tap loops
//   unroll and a channel's weights wait in registers;
// - a strip's coordinates, planes and weights found once for its kStripRows results;
// - the coordinates split by Divisors fixed at launch (divisor.h);
// - where all of a result's taps lie inside the plane they read (no padding), the taps read at
//   constant steps from one address, with no bounds tests; elsewhere each is tested.
constexpr int kStripRows = 4;

// The divisors that split an offset of a grid [N, C, H, W] into (n, c, h, w).
template <typename index_t>
struct GridDivisors {
  Divisor<index_t> channels, plane, width;
  GridDivisors(index_t channels, index_t height, index_t width)
      : channels(channels), plane(height * width), width(width) {}
};

// The number of strips of `rows` rows that cover `height` rows.
constexpr int64_t strips_of(int64_t height, int64_t rows) { return (height + rows - 1) / rows; }

// DepthwiseDims with the divisors of a strip kernel's grid [N, C, strips, W] (the output's
// channels and columns for the forward, the input's for the input gradient) and of the channel
// multiplier. Built where the grid has elements, so that no divisor is 0.
template <typename index_t>
struct DepthwiseStripDims : DepthwiseDims<index_t> {
  GridDivisors<index_t> grid;
  Divisor<index_t> multiplier_divisor;
  DepthwiseStripDims(const ConvShape& s, bool channels_last, bool output_grid)
      : DepthwiseDims<index_t>(s, channels_last),
        grid(output_grid
                 ? GridDivisors<index_t>(s.out_channels, strips_of(s.out_height, kStripRows),
                                         s.out_width)
                 : GridDivisors<index_t>(s.in_channels, strips_of(s.height, kStripRows), s.width)),
        multiplier_divisor(s.out_channels / s.in_channels) {}
};

// Whether taps at first, first + dilation, ..., first + (taps - 1) * dilation all lie in [0, size).
template <typename index_t>
C10_HOST_DEVICE inline bool taps_inside(index_t first, index_t taps, index_t dilation,
                                        index_t size) {
  return first >= 0 && first + (taps - 1) * dilation < size;
}

// The weights of one output channel, tap by tap in opmath: for K x K kernels (K > 0) held in
// registers, else read where they lie.
template <int K, typename scalar_t>
struct TapWeights {
  at::opmath_type<scalar_t> value[K * K];
  C10_HOST_DEVICE explicit TapWeights(const scalar_t* w) {
    for (int tap = 0; tap < K * K; ++tap)
      value[tap] = static_cast<at::opmath_type<scalar_t>>(w[tap]);
  }
  C10_HOST_DEVICE at::opmath_type<scalar_t> operator[](int64_t tap) const { return value[tap]; }
};
template <typename scalar_t>
struct TapWeights<0, scalar_t> {
  const scalar_t* w;
  C10_HOST_DEVICE explicit TapWeights(const scalar_t* w) : w(w) {}
  C10_HOST_DEVICE at::opmath_type<scalar_t> operator[](int64_t tap) const {
    return static_cast<at::opmath_type<scalar_t>>(w[tap]);
  }
};

// Output (oh, ow)'s sum over the taps of plane x of the input.
template <int K, typename scalar_t, typename index_t>
C10_HOST_DEVICE inline at::opmath_type<scalar_t> output_sum(const scalar_t* input,
                                                            const Plane<index_t>& x,
                                                            const TapWeights<K, scalar_t>& w,
                                                            const DepthwiseDims<index_t>& s,
                                                            index_t oh, index_t ow) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t kernel_h = K > 0 ? K : s.kernel_h, kernel_w = K > 0 ? K : s.kernel_w;
  const index_t ih0 = input_index(oh, s.stride_h, s.pad_h, index_t(0), s.dilation_h);
  const index_t iw0 = input_index(ow, s.stride_w, s.pad_w, index_t(0), s.dilation_w);
  acc_t sum = 0;
  if (taps_inside(ih0, kernel_h, s.dilation_h, s.height) &&
      taps_inside(iw0, kernel_w, s.dilation_w, s.width)) {
    const scalar_t* first = input + x.at(ih0, iw0);
    const index_t row_step = s.dilation_h * x.row_stride;
    const index_t column_step = s.dilation_w * x.column_stride;
    for (index_t ki = 0; ki < kernel_h; ++ki) {
      for (index_t kj = 0; kj < kernel_w; ++kj) {
        sum = multiply_add(w[ki * kernel_w + kj],
                           static_cast<acc_t>(first[ki * row_step + kj * column_step]), sum);
      }
    }
    return sum;
  }
  for (index_t ki = 0; ki < kernel_h; ++ki) {
    const index_t ih = ih0 + ki * s.dilation_h;
    if (ih < 0 || ih >= s.height) continue;
    for (index_t kj = 0; kj < kernel_w; ++kj) {
      const index_t iw = iw0 + kj * s.dilation_w;
      if (iw < 0 || iw >= s.width) continue;
      sum = multiply_add(w[ki * kernel_w + kj], static_cast<acc_t>(input[x.at(ih, iw)]), sum);
    }
  }
  return sum;
}

// Input (ih, iw)'s gather from plane dy of the output gradient (one output channel), added to
// sum. Each axis's output index stepped tap by tap (OutputIndexByTap). At stride 1 its taps read dy
// at (ih + pad_h - ki * dilation_h, iw + pad_w - kj * dilation_w); where those all lie inside, at
// constant steps back from the first.
template <int K, typename scalar_t, typename index_t>
C10_HOST_DEVICE inline at::opmath_type<scalar_t> add_input_grad(
    const scalar_t* grad_output, const Plane<index_t>& dy, const TapWeights<K, scalar_t>& w,
    const DepthwiseDims<index_t>& s, index_t ih, index_t iw, at::opmath_type<scalar_t> sum) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t kernel_h = K > 0 ? K : s.kernel_h, kernel_w = K > 0 ? K : s.kernel_w;
  if (s.stride_h == 1 && s.stride_w == 1 &&
      taps_inside(ih + s.pad_h - (kernel_h - 1) * s.dilation_h, kernel_h, s.dilation_h,
                  s.out_height) &&
      taps_inside(iw + s.pad_w - (kernel_w - 1) * s.dilation_w, kernel_w, s.dilation_w,
                  s.out_width)) {
    const scalar_t* first = grad_output + dy.at(ih + s.pad_h, iw + s.pad_w);
    const index_t row_step = s.dilation_h * dy.row_stride;
    const index_t column_step = s.dilation_w * dy.column_stride;
    for (index_t ki = 0; ki < kernel_h; ++ki) {
      for (index_t kj = 0; kj < kernel_w; ++kj) {
        sum = multiply_add(w[ki * kernel_w + kj],
                           static_cast<acc_t>(first[-(ki * row_step + kj * column_step)]), sum);
      }
    }
    return sum;
  }
  OutputIndexByTap<index_t> row(ih, s.pad_h, s.dilation_h, s.stride_h);
  for (index_t ki = 0; ki < kernel_h; ++ki, row.next()) {
    const index_t oh = row.at(s.out_height);
    if (oh < 0) continue;
    OutputIndexByTap<index_t> column(iw, s.pad_w, s.dilation_w, s.stride_w);
    for (index_t kj = 0; kj < kernel_w; ++kj, column.next()) {
      const index_t ow = column.at(s.out_width);
      if (ow < 0) continue;
      sum =
          multiply_add(w[ki * kernel_w + kj], static_cast<acc_t>(grad_output[dy.at(oh, ow)]), sum);
    }
  }
  return sum;
}

// The forward's thread i: output rows kStripRows * strip, ... (fewer at the bottom) of column ow
// of channel o of image n, (n, o, strip, ow) being offset i of the strip grid.
template <int K, typename scalar_t, typename index_t>
struct DepthwiseOutputStrip {
  const scalar_t* input;
  const scalar_t* weight;
  scalar_t* output;
  DepthwiseStripDims<index_t> s;
  C10_HOST_DEVICE void operator()(index_t i) const {
    const auto e = element_at(s.channels_last, i, s.grid.channels, s.grid.plane, s.grid.width);
    const index_t o = e.c, c = s.multiplier_divisor.quotient(o);
    const auto x = plane_of(s.channels_last, e.n, c, s.channels, s.height, s.width);
    const auto y = plane_of(s.channels_last, e.n, o, s.out_channels, s.out_height, s.out_width);
    const TapWeights<K, scalar_t> w(weight + o * s.kernel_h * s.kernel_w);
    const index_t first_row = e.h * kStripRows;
    for (int r = 0; r < kStripRows; ++r) {
      const index_t oh = first_row + r;
      if (oh >= s.out_height) break;
      output[y.at(oh, e.w)] = static_cast<scalar_t>(output_sum(input, x, w, s, oh, e.w));
    }
  }
};

// The input gradient's thread i: input rows kStripRows * strip, ... of column iw of channel c of
// image n, (n, c, strip, iw) being offset i of the strip grid; each the sum over the channel's
// output channels o, in order.
template <int K, typename scalar_t, typename index_t>
struct DepthwiseInputGradStrip {
  const scalar_t* grad_output;
  const scalar_t* weight;
  scalar_t* grad_input;
  DepthwiseStripDims<index_t> s;
  C10_HOST_DEVICE void operator()(index_t i) const {
    using acc_t = at::opmath_type<scalar_t>;
    const auto e = element_at(s.channels_last, i, s.grid.channels, s.grid.plane, s.grid.width);
    const index_t c = e.c, taps = s.kernel_h * s.kernel_w;
    const auto dx = plane_of(s.channels_last, e.n, c, s.channels, s.height, s.width);
    const index_t first_channel = c * s.multiplier;
    const auto first_dy =
        plane_of(s.channels_last, e.n, first_channel, s.out_channels, s.out_height, s.out_width);
    const TapWeights<K, scalar_t> first_w(weight + first_channel * taps);
    const index_t first_row = e.h * kStripRows;
    for (int r = 0; r < kStripRows; ++r) {
      const index_t ih = first_row + r;
      if (ih >= s.height) break;
      acc_t sum = add_input_grad(grad_output, first_dy, first_w, s, ih, e.w, acc_t(0));
      for (index_t o = first_channel + 1; o < first_channel + s.multiplier; ++o) {
        const auto dy =
            plane_of(s.channels_last, e.n, o, s.out_channels, s.out_height, s.out_width);
        sum = add_input_grad(grad_output, dy, TapWeights<K, scalar_t>(weight + o * taps), s, ih,
                             e.w, sum);
      }
      grad_input[dx.at(ih, e.w)] = static_cast<scalar_t>(sum);
    }
  }
};

// The positions j = (n * out_height + oh) * out_width + ow of one lane, j = lane, lane +
// kSumLanes, ... in increasing order, as (n, oh, ow): j and kSumLanes split once (element_at of a
// one-channel grid), then a step adds kSumLanes's images, rows and columns with one carry each, no
// division: three divisions per position took most of the weight gradient's time on the GPU
// (benchmarks/NOTES.md, section 44).
template <typename index_t>
struct LanePositions {
  Element<index_t> at, step;  // c unused (0): the grid [N, 1, out_height, out_width]
  index_t out_height, out_width;
  C10_HOST_DEVICE LanePositions(index_t lane, index_t out_height, index_t out_width)
      : at(element_at<index_t, index_t>(false, lane, 1, out_height * out_width, out_width)),
        step(element_at<index_t, index_t>(false, kSumLanes, 1, out_height * out_width, out_width)),
        out_height(out_height),
        out_width(out_width) {}
  C10_HOST_DEVICE void next() {
    at.w += step.w;
    at.h += step.h;
    if (at.w >= out_width) {
      at.w -= out_width;
      ++at.h;
    }
    at.n += step.n;
    if (at.h >= out_height) {  // at.h < 2 * out_height: step.h < out_height
      at.h -= out_height;
      ++at.n;
    }
  }
};

// Lane `lane`'s partial sum of weight-gradient entry `entry` = (o, ki, kj): the products of the
// output gradient and the input at the tap, over the positions j = (n * out_height + oh) *
// out_width + ow with j % kSumLanes == lane, in increasing j. The lanes are then summed by the
// fixed tree of summation.h.
template <typename scalar_t, typename index_t>
C10_HOST_DEVICE inline at::opmath_type<scalar_t> depthwise_weight_grad_lane(
    const scalar_t* input, const scalar_t* grad_output, const DepthwiseDims<index_t>& s,
    index_t entry, index_t lane) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t taps = s.kernel_h * s.kernel_w;
  const index_t o = entry / taps, ki = entry % taps / s.kernel_w, kj = entry % s.kernel_w;
  const index_t c = o / s.multiplier;
  acc_t sum = 0;
  for (LanePositions<index_t> p(lane, s.out_height, s.out_width); p.at.n < s.batch; p.next()) {
    const index_t n = p.at.n, oh = p.at.h, ow = p.at.w;
    const index_t ih = input_index(oh, s.stride_h, s.pad_h, ki, s.dilation_h);
    const index_t iw = input_index(ow, s.stride_w, s.pad_w, kj, s.dilation_w);
    if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) continue;
    const auto dy = plane_of(s.channels_last, n, o, s.out_channels, s.out_height, s.out_width);
    const auto x = plane_of(s.channels_last, n, c, s.channels, s.height, s.width);
    sum = multiply_add(static_cast<acc_t>(grad_output[dy.at(oh, ow)]),
                       static_cast<acc_t>(input[x.at(ih, iw)]), sum);
  }
  return sum;
}

// The NHWC weight gradient runs the lanes above as threads of their own, then sums each entry's
// lanes in a second kernel, so that a warp's threads take adjacent output channels of one tap
// and lane: their loads are adjacent in NHWC memory (coalesced), where one block per entry would
// read with a stride of Cout between threads. The lanes' partial sums wait in a scratch buffer,
// [entries of a slice, kSumLanes], the output channels taken in slices of this many entries at
// most (16 MiB of float32 lanes).
constexpr int64_t kLaneScratchEntries = 16384;

// The output channels of one slice: whole channels (all their taps), at least one.
C10_HOST_DEVICE inline int64_t lane_slice_channels(int64_t taps) {
  return kLaneScratchEntries / taps > 0 ? kLaneScratchEntries / taps : 1;
}

// Thread t of a slice of `channels` output channels from `first_channel` on: consecutive threads
// take consecutive channels, then taps, then lanes. Its entry (o, tap), its lane, and where its
// partial sum goes in the slice's scratch [channels * taps, kSumLanes].
template <typename index_t>
struct SliceLane {
  index_t entry, lane, scratch;
};
template <typename index_t>
C10_HOST_DEVICE inline SliceLane<index_t> slice_lane(index_t t, index_t first_channel,
                                                     index_t channels, index_t taps) {
  const index_t o = t % channels, rest = t / channels;
  const index_t tap = rest % taps, lane = rest / taps;
  return {(first_channel + o) * taps + tap, lane, (o * taps + tap) * kSumLanes + lane};
}

// Lane `lane` of the K taps of kernel row ki of output channel o of a K x K kernel, at once: the
// positions of the lane walked once, the output gradient loaded once per position for the row's
// taps, whose sums wait in registers. Each tap's sum takes the same products in the same order as
// depthwise_weight_grad_lane's: the same bits, with 1 / K of its index work and output-gradient
// loads per product. (All K x K taps in one thread left a layer's 128 channels 128 blocks, 12% of
// the GPU's threads: benchmarks/NOTES.md, section 76.) Where a position's row of taps lies inside
// the input, they read at constant steps from one address, with no bounds tests. Writes tap kj's
// sum to lanes[kj * kSumLanes].
template <int K, typename scalar_t, typename index_t>
C10_HOST_DEVICE inline void depthwise_weight_grad_row_lanes(const scalar_t* input,
                                                            const scalar_t* grad_output,
                                                            const DepthwiseDims<index_t>& s,
                                                            index_t o, index_t ki, index_t lane,
                                                            at::opmath_type<scalar_t>* lanes) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t sum[K];
  for (int kj = 0; kj < K; ++kj) sum[kj] = 0;
  const index_t c = o / s.multiplier;
  for (LanePositions<index_t> p(lane, s.out_height, s.out_width); p.at.n < s.batch; p.next()) {
    const index_t n = p.at.n, oh = p.at.h, ow = p.at.w;
    const index_t ih = input_index(oh, s.stride_h, s.pad_h, ki, s.dilation_h);
    if (ih < 0 || ih >= s.height) continue;
    const auto dy = plane_of(s.channels_last, n, o, s.out_channels, s.out_height, s.out_width);
    const auto x = plane_of(s.channels_last, n, c, s.channels, s.height, s.width);
    const auto g = static_cast<acc_t>(grad_output[dy.at(oh, ow)]);
    const index_t iw0 = input_index(ow, s.stride_w, s.pad_w, index_t(0), s.dilation_w);
    if (taps_inside(iw0, index_t(K), s.dilation_w, s.width)) {
      const scalar_t* first = input + x.at(ih, iw0);
      const index_t column_step = s.dilation_w * x.column_stride;
      for (int kj = 0; kj < K; ++kj) {
        sum[kj] = multiply_add(g, static_cast<acc_t>(first[kj * column_step]), sum[kj]);
      }
      continue;
    }
    for (int kj = 0; kj < K; ++kj) {
      const index_t iw = iw0 + kj * s.dilation_w;
      if (iw < 0 || iw >= s.width) continue;
      sum[kj] = multiply_add(g, static_cast<acc_t>(input[x.at(ih, iw)]), sum[kj]);
    }
  }
  for (int kj = 0; kj < K; ++kj) lanes[kj * kSumLanes] = sum[kj];
}

// Thread t of a slice of `channels` output channels from `first_channel` on: the lane of a kernel
// row of its channel (depthwise_weight_grad_row_lanes) into the slice's scratch
// [channels * taps, kSumLanes], as SliceLaneThread's. Adjacent threads take adjacent lanes in
// NCHW (adjacent positions, adjacent in memory), adjacent channels in NHWC.
template <int K, typename scalar_t, typename index_t>
struct SliceRowLanesThread {
  const scalar_t* input;
  const scalar_t* grad_output;
  at::opmath_type<scalar_t>* scratch;
  DepthwiseDims<index_t> s;
  index_t first_channel, channels;
  C10_HOST_DEVICE void operator()(index_t t) const {
    index_t o, ki, lane;
    if (s.channels_last) {
      o = t % channels;
      const index_t rest = t / channels;
      ki = rest % K, lane = rest / K;
    } else {
      lane = t % kSumLanes;
      const index_t rest = t / kSumLanes;
      ki = rest % K, o = rest / K;
    }
    depthwise_weight_grad_row_lanes<K>(input, grad_output, s, first_channel + o, ki, lane,
                                       scratch + (o * (K * K) + ki * K) * kSumLanes + lane);
  }
};

// The other threads of the kernels, as the functors a Launcher runs (launch.h).
// Lane `lane` of weight-gradient entry `entry` (a lane sum's lane, launch.h).
template <typename scalar_t, typename index_t>
struct DepthwiseWeightGradLane {
  const scalar_t* input;
  const scalar_t* grad_output;
  DepthwiseDims<index_t> s;
  C10_HOST_DEVICE at::opmath_type<scalar_t> operator()(index_t entry, index_t lane) const {
    return depthwise_weight_grad_lane(input, grad_output, s, entry, lane);
  }
};

// The NHWC weight gradient's first kernel: thread t of a slice computes its lane into scratch.
template <typename scalar_t, typename index_t>
struct SliceLaneThread {
  const scalar_t* input;
  const scalar_t* grad_output;
  at::opmath_type<scalar_t>* scratch;
  DepthwiseDims<index_t> s;
  index_t first_channel, channels;
  C10_HOST_DEVICE void operator()(index_t t) const {
    const auto l = slice_lane(t, first_channel, channels, s.kernel_h * s.kernel_w);
    scratch[l.scratch] = depthwise_weight_grad_lane(input, grad_output, s, l.entry, l.lane);
  }
};

// Its second kernel's lanes: row `row` of the slice's scratch [rows, kSumLanes].
template <typename acc_t, typename index_t>
struct ScratchLane {
  const acc_t* scratch;
  C10_HOST_DEVICE acc_t operator()(index_t row, index_t lane) const {
    return scratch[row * kSumLanes + lane];
  }
};

// Writes a lane sum's total, rounded to scalar_t, to out[item].
template <typename scalar_t, typename index_t>
struct WriteRounded {
  scalar_t* out;
  template <typename acc_t>
  C10_HOST_DEVICE void operator()(index_t item, acc_t total) const {
    out[item] = static_cast<scalar_t>(total);
  }
};

}  // namespace torch_convbp
