// The CPU kernels of the depthwise special case: one input channel per group, with channel
// multiplier m = Cout / C, so output channel o reads input channel o / m. A direct loop over the
// kernel taps takes the place of im2col + GEMM, whose GEMMs would be [m, kh*kw] @ [kh*kw, P].
//
// Each parallel task owns whole planes (or whole weight rows) of its result, and every sum runs in
// a fixed order, the CUDA kernels' order (cuda/depthwise_thread.h, summation.h): kernel taps in
// (ki, kj) order for the forward, (o, ki, kj) for the input gradient, and for the weight gradient
// kSumLanes partial sums over the positions, then a fixed tree. Every product is one fused
// multiply-add. So the results are the same whatever the thread count, and bitwise the same as
// the CUDA kernels' (checked by the CPU harness of tests/cuda_harness/). The weight gradient's
// default on the CPU is another order, of rows (summation.h, depthwise_rows_cpu.cpp): NHWC,
// NCHW operands copied to it; TORCH_CONVBP_CPU_DEPTHWISE_ORDER=lanes selects these kernels. Sums
// are taken in opmath (float for float16 and bfloat16). These kernels read NCHW; a call whose
// activations are channels_last goes to depthwise_nhwc_cpu.cpp, which keeps the same orders. (The
// route sends NCHW calls with small planes there too, through layout copies: route.cpp.)
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "../layout.h"
#include "../summation.h"
#include "cpu_kernels.h"
#include "depthwise_nhwc_cpu.h"
#include "vector_ops.h"

namespace torch_convbp {
namespace {

// A 3x3 plane read as a correlation: target pixel (r, c) reads, at tap (ki, kj), the source
// pixel (r * row_stride + row_base + ki * row_step, c + column_base + kj * column_step), where
// that lies inside the source. The forward reads the input so; the stride-1 input gradient reads
// the output gradient so, its taps mirrored (negative steps).
struct Correlation {
  int64_t source_height, source_width, target_height, target_width;
  int64_t row_stride, row_base, row_step, column_base, column_step;
};

// Whether a float32 plane's taps are summed in vector registers (PlaneOfVectors): a 3x3 kernel
// read with stride 1 along the rows (the forward at any row stride, the input gradient at
// stride 1 with one output channel per input channel). The tap-by-tap loops below load and store
// their float32 accumulator around every product, and on rows of 56 pixels or fewer they paid for
// each row's loop set-up and remainder too: about 2x the time (benchmarks/NOTES.md, section 87).
bool plane_of_vectors(const ConvShape& s) {
  return s.kernel_h == 3 && s.kernel_w == 3 && s.stride_w == 1;
}

// One 3x3 plane: target = the sum over each pixel's taps inside the source, in (ki, kj) order from
// zero, each product one multiply-add: the tap-by-tap loops' products in their order, so their
// bits. Compiled for the target of Ops (run_compiled_for). The pixels whose nine taps all lie
// inside (the inner columns of the rows whose kernel rows all do) a vector at a time, the nine
// weights and the sum in registers; where those columns do not fill the last vector, it overlaps
// the one before, whose pixels it writes again with the same bits. The border pixels one by one.
struct PlaneOfVectors {
  template <class Ops>
  static TORCH_CONVBP_INLINE void run(const float* source, const float* w, float* target,
                                      const Correlation& c) {
    using V = typename Vector<float, Ops::kBytes>::type;
    constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
    int64_t offsets[3];
    int64_t inner_begin = 0, inner_end = c.target_width;  // the columns every tap reads inside
    for (int kj = 0; kj < 3; ++kj) {
      offsets[kj] = c.column_base + kj * c.column_step;
      const Span inside = valid_columns(offsets[kj], 1, c.source_width, c.target_width);
      inner_begin = std::max(inner_begin, inside.begin);
      inner_end = std::min(inner_end, inside.end);
    }
    V weights[9];
    for (int t = 0; t < 9; ++t) weights[t] = Ops::template splat<V>(w[t]);
    for (int64_t r = 0; r < c.target_height; ++r) {
      const float* rows[3];
      bool every_row = true;
      for (int ki = 0; ki < 3; ++ki) {
        const int64_t row = r * c.row_stride + c.row_base + ki * c.row_step;
        const bool inside = row >= 0 && row < c.source_height;
        rows[ki] = inside ? source + row * c.source_width : nullptr;
        every_row = every_row && inside;
      }
      float* out = target + r * c.target_width;
      // the pixels [begin, end) in vectors
      const bool vectors = every_row && inner_end - inner_begin >= lanes;
      const int64_t begin = vectors ? inner_begin : 0, end = vectors ? inner_end : 0;
      for (int64_t col = begin; col < end; col += lanes) {
        const int64_t at = std::min(col, end - lanes);
        V sum = Ops::template splat<V>(0.0f);
        for (int ki = 0; ki < 3; ++ki) {
          for (int kj = 0; kj < 3; ++kj) {
            V x;
            std::memcpy(&x, rows[ki] + at + offsets[kj], sizeof(V));
            sum = Ops::multiply_add(weights[ki * 3 + kj], x, sum);
          }
        }
        std::memcpy(out + at, &sum, sizeof(V));
      }
      one_by_one(rows, offsets, w, out, c.source_width, 0, begin);
      one_by_one(rows, offsets, w, out, c.source_width, end, c.target_width);
    }
  }

  // The pixels [first, last) of a row: each tap inside the source (rows[ki] null for a kernel
  // row outside), in (ki, kj) order.
  static TORCH_CONVBP_INLINE void one_by_one(const float* const* rows, const int64_t* offsets,
                                             const float* w, float* out, int64_t source_width,
                                             int64_t first, int64_t last) {
    for (int64_t col = first; col < last; ++col) {
      float sum = 0;
      for (int ki = 0; ki < 3; ++ki) {
        if (rows[ki] == nullptr) continue;
        for (int kj = 0; kj < 3; ++kj) {
          const int64_t at = col + offsets[kj];
          if (at >= 0 && at < source_width) sum = multiply_add(w[ki * 3 + kj], rows[ki][at], sum);
        }
      }
      out[col] = sum;
    }
  }
};

// PlaneOfVectors over the planes [0, planes), in parallel on the CPU's widest vectors: plane p
// reads source(p) with the weights weights(p) and writes target(p) whole.
template <class Source, class Weights, class Target>
void planes_of_vectors(int64_t planes, int64_t grain, const Correlation& c, Source source,
                       Weights weights, Target target) {
  with_vector_ops([&](auto ops) {
    at::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        run_compiled_for<PlaneOfVectors>(ops, source(p), weights(p), target(p), c);
      }
    });
  });
}

// One output plane: out = sum over the taps of w[tap] * (x shifted by the tap), where x is the
// input plane it reads and acc an out_plane-sized scratch buffer.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void forward_plane(const scalar_t* x, const scalar_t* w, scalar_t* out,
                                              acc_t* acc, const ConvShape& s) {
  const int64_t out_plane = s.out_height * s.out_width;
  std::fill(acc, acc + out_plane, acc_t(0));
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      const acc_t weight = static_cast<acc_t>(w[ki * s.kernel_w + kj]);
      const Tap tap = tap_columns(s, kj);
      for (int64_t oh = 0; oh < s.out_height; ++oh) {
        const int64_t ih = input_row(s, oh, ki);
        if (ih < 0) continue;
        acc_t* acc_row = acc + oh * s.out_width;
        const scalar_t* x_row = x + ih * s.width;
        for_each_column(s.stride_w, tap, [&](int64_t ow, int64_t iw) {
          acc_row[ow] = multiply_add(weight, static_cast<acc_t>(x_row[iw]), acc_row[ow]);
        });
      }
    }
  }
  std::copy(acc, acc + out_plane, out);
}

// One input plane's share from one output channel: acc += the adjoint of forward_plane applied
// to that channel's output gradient dy.
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void add_input_grad_plane(const scalar_t* dy, const scalar_t* w,
                                                     acc_t* acc, const ConvShape& s) {
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      const acc_t weight = static_cast<acc_t>(w[ki * s.kernel_w + kj]);
      const Tap tap = tap_columns(s, kj);
      for (int64_t oh = 0; oh < s.out_height; ++oh) {
        const int64_t ih = input_row(s, oh, ki);
        if (ih < 0) continue;
        acc_t* acc_row = acc + ih * s.width;
        const scalar_t* dy_row = dy + oh * s.out_width;
        for_each_column(s.stride_w, tap, [&](int64_t ow, int64_t iw) {
          acc_row[iw] = multiply_add(weight, static_cast<acc_t>(dy_row[ow]), acc_row[iw]);
        });
      }
    }
  }
}

// One image's share of one weight row, as the CUDA kernel splits it: for each tap, lanes[tap][l]
// += dy * (x at the tap) over the image's positions j = first_position + oh * out_width + ow
// with j % kSumLanes == l, in increasing j. A row of positions is cut where the lane wraps
// around, so that each piece is a unit-stride run of lanes (a vectorizable loop).
template <typename scalar_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void add_weight_grad_lanes(const scalar_t* x, const scalar_t* dy,
                                                      int64_t first_position, acc_t* lanes,
                                                      const ConvShape& s) {
  for (int64_t oh = 0; oh < s.out_height; ++oh) {
    const scalar_t* dy_row = dy + oh * s.out_width;
    const int64_t row_position = first_position + oh * s.out_width;
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      const int64_t ih = input_row(s, oh, ki);
      if (ih < 0) continue;
      const scalar_t* x_row = x + ih * s.width;
      for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
        const Tap tap = tap_columns(s, kj);
        acc_t* tap_lanes = lanes + (ki * s.kernel_w + kj) * kSumLanes;
        for (int64_t start = tap.columns.begin; start < tap.columns.end;) {
          const int64_t first_lane = (row_position + start) % kSumLanes;
          const int64_t stop = std::min(tap.columns.end, start + kSumLanes - first_lane);
          const int64_t shift = first_lane - start;  // column ow's lane is ow + shift
          for_each_column(s.stride_w, Tap{tap.offset, {start, stop}}, [&](int64_t ow, int64_t iw) {
            acc_t& lane = tap_lanes[ow + shift];
            lane =
                multiply_add(static_cast<acc_t>(dy_row[ow]), static_cast<acc_t>(x_row[iw]), lane);
          });
          start = stop;
        }
      }
    }
  }
}

// output[n, o] = sum over the taps of weight[o, ki, kj] * (input[n, o/m] shifted by the tap).
template <typename scalar_t>
void forward_kernel(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                    const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t multiplier = s.out_channels / s.in_channels;
  const int64_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const int64_t planes = s.batch * s.out_channels;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (plane_of_vectors(s)) {
      const Correlation c{s.height, s.width,      s.out_height, s.out_width, s.stride_h,
                          -s.pad_h, s.dilation_h, -s.pad_w,     s.dilation_w};
      return planes_of_vectors(
          planes, grain_for(out_plane * taps), c,
          [&](int64_t plane) {  // (n, o) reads the input's plane (n, o / m)
            const int64_t n = plane / s.out_channels, o = plane % s.out_channels;
            return input + (n * s.in_channels + o / multiplier) * s.height * s.width;
          },
          [&](int64_t plane) { return weight + plane % s.out_channels * taps; },
          [&](int64_t plane) { return output + plane * out_plane; });
    }
  }
  at::parallel_for(0, planes, grain_for(out_plane * taps), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(out_plane);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / s.out_channels, o = plane % s.out_channels;
      const scalar_t* x = input + (n * s.in_channels + o / multiplier) * s.height * s.width;
      forward_plane(x, weight + o * taps, output + plane * out_plane, acc.data(), s);
    }
  });
}

// grad_input[n, c] = sum over c's m output channels o of the adjoint of the forward: one input
// plane per task, so no two tasks write one pixel.
template <typename scalar_t>
void input_grad_kernel(const scalar_t* grad_output, const scalar_t* weight, scalar_t* grad_input,
                       const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t multiplier = s.out_channels / s.in_channels;
  const int64_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const int64_t plane_size = s.height * s.width, planes = s.batch * s.in_channels;
  const int64_t grain = grain_for(out_plane * taps * multiplier);
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (multiplier == 1 && s.stride_h == 1 && plane_of_vectors(s)) {
      // at stride 1, input pixel (ih, iw) reads dY at (ih + pad_h - ki d_h, iw + pad_w - kj d_w)
      const Correlation c{s.out_height, s.out_width,   s.height, s.width,      1,
                          s.pad_h,      -s.dilation_h, s.pad_w,  -s.dilation_w};
      return planes_of_vectors(
          planes, grain, c,
          [&](int64_t plane) { return grad_output + plane * out_plane; },  // (n, c): dY's (n, c)
          [&](int64_t plane) { return weight + plane % s.in_channels * taps; },
          [&](int64_t plane) { return grad_input + plane * plane_size; });
    }
  }
  at::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(plane_size);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / s.in_channels, c = plane % s.in_channels;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t o = c * multiplier; o < (c + 1) * multiplier; ++o) {
        add_input_grad_plane(grad_output + (n * s.out_channels + o) * out_plane, weight + o * taps,
                             acc.data(), s);
      }
      std::copy(acc.begin(), acc.end(), grad_input + plane * plane_size);
    }
  });
}

// grad_weight[o, ki, kj] = sum over images and output pixels of grad_output[n, o] * (input[n, o/m]
// at the tap). One weight row (all taps of o) per task; per tap, kSumLanes partial sums, then
// the fixed tree of summation.h: the CUDA kernel's order.
template <typename scalar_t>
void weight_grad_kernel(const scalar_t* input, const scalar_t* grad_output, scalar_t* grad_weight,
                        const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t multiplier = s.out_channels / s.in_channels;
  const int64_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const int64_t grain = grain_for(s.batch * out_plane * taps);
  at::parallel_for(0, s.out_channels, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> lanes(taps * kSumLanes);
    for (int64_t o = begin; o < end; ++o) {
      std::fill(lanes.begin(), lanes.end(), acc_t(0));
      for (int64_t n = 0; n < s.batch; ++n) {
        add_weight_grad_lanes(input + (n * s.in_channels + o / multiplier) * s.height * s.width,
                              grad_output + (n * s.out_channels + o) * out_plane, n * out_plane,
                              lanes.data(), s);
      }
      for (int64_t t = 0; t < taps; ++t) {
        acc_t* tap_lanes = lanes.data() + t * kSumLanes;
        for (int half = kSumLanes / 2; half > 0; half /= 2) {
          for (int lane = 0; lane < half; ++lane) tree_sum_step(tap_lanes, half, lane);
        }
        grad_weight[o * taps + t] = static_cast<scalar_t>(tap_lanes[0]);
      }
    }
  });
}

void depthwise_conv2d_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                          IntArrayRef padding, IntArrayRef dilation, const Tensor& output) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_conv2d", input, weight, output,
                                             stride, padding, dilation);
  const ConvShape& s = call.shape;
  if (call.channels_last) return depthwise_nhwc_forward(input, weight, s, output);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
        forward_kernel(input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                       output.mutable_data_ptr<scalar_t>(), s);
      });
}

void depthwise_input_grad_cpu(const Tensor& grad_output, const Tensor& weight, IntArrayRef stride,
                              IntArrayRef padding, IntArrayRef dilation, const Tensor& grad_input) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_input_grad", grad_input,
                                             weight, grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  if (call.channels_last) return depthwise_nhwc_input_grad(grad_output, weight, s, grad_input);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
        input_grad_kernel(grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                          grad_input.mutable_data_ptr<scalar_t>(), s);
      });
}

void depthwise_weight_grad_cpu(const Tensor& input, const Tensor& grad_output, IntArrayRef stride,
                               IntArrayRef padding, IntArrayRef dilation,
                               const Tensor& grad_weight) {
  const DepthwiseCall call = check_depthwise("torch_convbp.depthwise_weight_grad", input,
                                             grad_weight, grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  if (cpu_depthwise_order() == DepthwiseOrder::rows) {  // an NHWC kernel (NCHW operands copied)
    return depthwise_nhwc_weight_grad_rows(in_layout(input, Layout::nhwc),
                                           in_layout(grad_output, Layout::nhwc), s, grad_weight);
  }
  if (call.channels_last) return depthwise_nhwc_weight_grad(input, grad_output, s, grad_weight);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_weight_grad", [&] {
        weight_grad_kernel(input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
                           grad_weight.mutable_data_ptr<scalar_t>(), s);
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("depthwise_conv2d", &depthwise_conv2d_cpu);
  m.impl("depthwise_input_grad", &depthwise_input_grad_cpu);
  m.impl("depthwise_weight_grad", &depthwise_weight_grad_cpu);
}

}  // namespace torch_convbp
