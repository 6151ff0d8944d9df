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
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "../summation.h"
#include "depthwise_cpu.h"

namespace torch_convbp {
namespace {

// The weight [Cout, 1, kh, kw] as [kh*kw, Cout] in the sums' type: one tap's weights adjacent.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
std::vector<acc_t> weight_by_tap(const scalar_t* weight, const ConvShape& s) {
  const int64_t taps = s.kernel_h * s.kernel_w;
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

// result[b] = the sum over the terms, in order, of w[b * step] * operand[b * step] for the
// channels b of one pixel: the sums of kChannelBlock channels at a time in registers. The
// channels of the weights and operands are `step` apart (the multiplier m for the input
// gradient's view of the output channels, 1 otherwise). The forward with m > 1 reads input
// channel o / m, which `operand_channel` maps.
template <typename scalar_t, typename acc_t, typename Channel>
inline void sum_terms(const Terms& terms, const acc_t* w, const scalar_t* operand, int64_t channels,
                      int64_t step, Channel operand_channel, scalar_t* result) {
  const size_t count = terms.weight_offset.size();
  for (int64_t first = 0; first < channels; first += kChannelBlock) {
    const int64_t block = std::min(kChannelBlock, channels - first);
    acc_t sum[kChannelBlock] = {};
    if (block == kChannelBlock && step == 1) {  // the vectorized case
      for (size_t i = 0; i < count; ++i) {
        const acc_t* wt = w + terms.weight_offset[i] + first;
        const scalar_t* op = operand + terms.operand_offset[i];
        for (int64_t b = 0; b < kChannelBlock; ++b) {
          sum[b] = multiply_add(wt[b], static_cast<acc_t>(op[operand_channel(first + b)]), sum[b]);
        }
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        const acc_t* wt = w + terms.weight_offset[i];
        const scalar_t* op = operand + terms.operand_offset[i];
        for (int64_t b = 0; b < block; ++b) {
          const int64_t channel = (first + b) * step;
          sum[b] = multiply_add(wt[channel], static_cast<acc_t>(op[operand_channel(channel)]),
                                sum[b]);
        }
      }
    }
    for (int64_t b = 0; b < block; ++b) result[first + b] = static_cast<scalar_t>(sum[b]);
  }
}

// Output row oh of one image, all columns and channels: each output element is the sum over the
// taps, in (ki, kj) order, of the tap's weight times the input element the tap reads.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void forward_row(const scalar_t* image, const acc_t* w_by_tap,
                                            int64_t oh, Terms& terms, scalar_t* out,
                                            const ConvShape& s) {
  const int64_t c = s.in_channels, cout = s.out_channels, m = cout / c;
  for (int64_t ow = 0; ow < s.out_width; ++ow) {
    terms.clear();
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      const int64_t ih = input_row(s, oh, ki);
      if (ih < 0) continue;
      for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
        const int64_t iw = ow * s.stride_w - s.pad_w + kj * s.dilation_w;
        if (iw >= 0 && iw < s.width) terms.add((ki * s.kernel_w + kj) * cout, (ih * s.width + iw) * c);
      }
    }
    scalar_t* y = out + ow * cout;
    if (m == 1) {
      sum_terms(terms, w_by_tap, image, cout, 1, [](int64_t o) { return o; }, y);
    } else {
      sum_terms(terms, w_by_tap, image, cout, 1, [m](int64_t o) { return o / m; }, y);
    }
  }
}

// Input row ih of one image, all columns and channels: each input-gradient element is the sum,
// in (o, ki, kj) order, of what the forward took from it times the output gradient there. The
// m output channels of input channel ch are ch * m + k: a term per (k, ki, kj), whose weights
// and output gradient start at channel k and step by m.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void input_grad_row(const scalar_t* grad_image, const acc_t* w_by_tap,
                                               int64_t ih, Terms& terms, scalar_t* grad_in,
                                               const ConvShape& s) {
  const int64_t c = s.in_channels, cout = s.out_channels, m = cout / c;
  for (int64_t iw = 0; iw < s.width; ++iw) {
    terms.clear();
    for (int64_t k = 0; k < m; ++k) {
      for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
        const int64_t oh = output_index(ih, s.pad_h, ki, s.dilation_h, s.stride_h, s.out_height);
        if (oh < 0) continue;
        for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
          const int64_t ow = output_index(iw, s.pad_w, kj, s.dilation_w, s.stride_w, s.out_width);
          if (ow >= 0) terms.add((ki * s.kernel_w + kj) * cout + k, (oh * s.out_width + ow) * cout + k);
        }
      }
    }
    sum_terms(terms, w_by_tap, grad_image, c, m, [](int64_t o) { return o; }, grad_in + iw * c);
  }
}

// One image's share of the weight gradient of output channels [first, first + count): for each
// tap and position j = first_position + oh * OW + ow, lanes[tap][j % kSumLanes][o - first] +=
// dy[j, o] * x[at the tap, o / m], in increasing j.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void add_weight_grad_lanes(const scalar_t* image,
                                                      const scalar_t* grad_image,
                                                      int64_t first_position, int64_t first,
                                                      int64_t count, acc_t* lanes,
                                                      const ConvShape& s) {
  const int64_t c = s.in_channels, cout = s.out_channels, m = cout / c;
  for (int64_t oh = 0; oh < s.out_height; ++oh) {
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      const int64_t ih = input_row(s, oh, ki);
      if (ih < 0) continue;
      for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
        acc_t* tap_lanes = lanes + (ki * s.kernel_w + kj) * kSumLanes * count;
        for_each_column(s.stride_w, tap_columns(s, kj), [&](int64_t ow, int64_t iw) {
          const int64_t lane = (first_position + oh * s.out_width + ow) % kSumLanes;
          acc_t* l = tap_lanes + lane * count;
          const scalar_t* dy = grad_image + (oh * s.out_width + ow) * cout + first;
          const scalar_t* x = image + (ih * s.width + iw) * c;
          if (m == 1) {
            for (int64_t b = 0; b < count; ++b) {
              l[b] = multiply_add(static_cast<acc_t>(dy[b]), static_cast<acc_t>(x[first + b]), l[b]);
            }
          } else {
            for (int64_t b = 0; b < count; ++b) {
              l[b] = multiply_add(static_cast<acc_t>(dy[b]),
                                  static_cast<acc_t>(x[(first + b) / m]), l[b]);
            }
          }
        });
      }
    }
  }
}

template <typename scalar_t>
void forward_kernel(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                    const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const std::vector<acc_t> w_by_tap = weight_by_tap(weight, s);
  const int64_t taps = s.kernel_h * s.kernel_w;
  const int64_t row_size = s.out_width * s.out_channels, rows = s.batch * s.out_height;
  const int64_t image_size = s.height * s.width * s.in_channels;
  at::parallel_for(0, rows, grain_for(row_size * taps), [&](int64_t begin, int64_t end) {
    Terms terms(taps);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / s.out_height, oh = row % s.out_height;
      forward_row(input + n * image_size, w_by_tap.data(), oh, terms, output + row * row_size, s);
    }
  });
}

template <typename scalar_t>
void input_grad_kernel(const scalar_t* grad_output, const scalar_t* weight, scalar_t* grad_input,
                       const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const std::vector<acc_t> w_by_tap = weight_by_tap(weight, s);
  const int64_t taps = s.kernel_h * s.kernel_w, m = s.out_channels / s.in_channels;
  const int64_t row_size = s.width * s.in_channels, rows = s.batch * s.height;
  const int64_t grad_image_size = s.out_height * s.out_width * s.out_channels;
  at::parallel_for(0, rows, grain_for(s.width * s.out_channels * taps), [&](int64_t begin, int64_t end) {
    Terms terms(taps * m);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / s.height, ih = row % s.height;
      input_grad_row(grad_output + n * grad_image_size, w_by_tap.data(), ih, terms,
                     grad_input + row * row_size, s);
    }
  });
}

// The output channels of one task of the weight gradient: a multiple of 8 (a vector), enough to
// give every thread a couple of tasks, and few enough that the lanes [taps, kSumLanes, block]
// stay within 4 MiB of float32. Longer blocks measured faster than blocks whose lanes fit L2
// (benchmarks/NOTES.md, section 14): each position's work is a loop over the block. Only the cut
// into tasks depends on the thread count, never an entry's order of summation.
int64_t weight_grad_block(const ConvShape& s) {
  const int64_t taps = s.kernel_h * s.kernel_w;
  const int64_t most = std::max<int64_t>(8, (int64_t{1} << 20) / (taps * kSumLanes) / 8 * 8);
  const int64_t share = (s.out_channels + 2 * at::get_num_threads() - 1) / (2 * at::get_num_threads());
  return std::clamp<int64_t>((share + 7) / 8 * 8, 8, most);
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
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> lanes(taps * kSumLanes * block);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t first = index * block, count = std::min(block, s.out_channels - first);
      std::fill(lanes.begin(), lanes.end(), acc_t(0));
      for (int64_t n = 0; n < s.batch; ++n) {
        add_weight_grad_lanes(input + n * image_size, grad_output + n * grad_image_size,
                              n * out_plane, first, count, lanes.data(), s);
      }
      for (int64_t t = 0; t < taps; ++t) {
        acc_t* tap_lanes = lanes.data() + t * kSumLanes * count;
        for (int half = kSumLanes / 2; half > 0; half /= 2) {  // summation.h's tree, per channel
          for (int lane = 0; lane < half; ++lane) {
            for (int64_t b = 0; b < count; ++b) {
              tap_lanes[lane * count + b] += tap_lanes[(lane + half) * count + b];
            }
          }
        }
        for (int64_t b = 0; b < count; ++b) {
          grad_weight[(first + b) * taps + t] = static_cast<scalar_t>(tap_lanes[b]);
        }
      }
    }
  });
}

}  // namespace

void depthwise_nhwc_forward(const Tensor& input, const Tensor& weight, const ConvShape& s,
                            const Tensor& output) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_nhwc", [&] {
    forward_kernel(input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                   output.mutable_data_ptr<scalar_t>(), s);
  });
}

void depthwise_nhwc_input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                               const Tensor& grad_input) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_nhwc", [&] {
    input_grad_kernel(grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                      grad_input.mutable_data_ptr<scalar_t>(), s);
  });
}

void depthwise_nhwc_weight_grad(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                                const Tensor& grad_weight) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_nhwc", [&] {
    weight_grad_kernel(input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
                       grad_weight.mutable_data_ptr<scalar_t>(), s);
  });
}

}  // namespace torch_convbp
