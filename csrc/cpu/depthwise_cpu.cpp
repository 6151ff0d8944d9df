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
// default on the CPU is another order, of rows (summation.h, depthwise_rows_cpu.cpp), in NHWC,
// NCHW operands a band of rows at a time transposed in cache;
// TORCH_CONVBP_CPU_DEPTHWISE_ORDER=lanes selects these kernels. Sums are taken in opmath (float for
// float16 and bfloat16). The float32 forward and input gradient sum in vector registers where
// depthwise_planes_cpu.cpp takes them (3x3 kernels, and strided kernels of at most 9 taps), in the
// same order. These kernels read NCHW; a call whose activations are channels_last goes to
// depthwise_nhwc_cpu.cpp, which keeps the same orders, and so do the forward and input gradient of
// small planes and the float32, bfloat16 and float16 ones the planes of vectors do not take
// (nchw_kernels), a block of channels at a time transposed in cache. The forward and input
// gradient of volumes (depthwise_conv3d*, NDHWC or NCDHW) are depthwise_nhwc_cpu.cpp's with a
// depth, their weight gradient depthwise_rows_cpu.cpp's.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../checks.h"
#include "../summation.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "depthwise_nhwc_cpu.h"
#include "depthwise_planes_cpu.h"

namespace torch_convbp {
namespace {

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

// output[n, o] = sum over the taps of weight[o, ki, kj] * (input[n, o/m] shifted by the tap): the
// loops, for large planes in the dtypes other than float32 (nchw_kernels).
template <typename scalar_t>
void forward_kernel(const scalar_t* input, const scalar_t* weight, scalar_t* output,
                    const ConvShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t multiplier = s.out_channels / s.in_channels;
  const int64_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const int64_t planes = s.batch * s.out_channels;
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

// The kernels of a forward or input gradient fed NCHW: the NHWC kernels on output planes under
// kMinNchwDepthwisePlane pixels; in float32, bfloat16 and float16 the planes of vectors where
// they take the call, else the NHWC kernels too, since the tap-by-tap loops above load and store
// an accumulator around every product where those sum in registers (5x5 layers: 0.3-0.6x the
// time) (benchmarks/NOTES.md, section 93); both sum bfloat16 and float16 widened to float32
// (section 97). float64 takes the loops.
enum class NchwKernels { nhwc, vector_planes, loops };
NchwKernels nchw_kernels(const ConvShape& s, at::ScalarType dtype,
                         bool (*vector_planes_take)(const ConvShape&)) {
  if (s.out_height * s.out_width < kMinNchwDepthwisePlane) return NchwKernels::nhwc;
  if (dtype == at::kDouble) return NchwKernels::loops;
  return vector_planes_take(s) ? NchwKernels::vector_planes : NchwKernels::nhwc;
}

// bfloat16 and float16 operands on the planes of vectors, which sum float32: a block of planes of
// one image at a time widened to float32 (source: `source_per_channel` planes of `source_plane`
// pixels per input channel), the float32 kernel on the block as a convolution of its own, the
// result planes rounded back. The same sums of the same values as the float32 call's.
constexpr int64_t kWidenedPlanesElements = int64_t{1} << 16;  // a block's planes: 256 KiB
template <typename scalar_t, typename Kernel>
void on_widened_planes(const scalar_t* source, int64_t source_plane, int64_t source_per_channel,
                       const scalar_t* weight, scalar_t* result, int64_t result_plane,
                       int64_t result_per_channel, const ConvShape& s, Kernel float32_kernel) {
  const int64_t taps = s.kernel_h * s.kernel_w, m = s.out_channels / s.in_channels;
  std::vector<float> w(s.out_channels * taps);
  widen(weight, s.out_channels * taps, w.data());
  const int64_t per_channel = source_plane * source_per_channel + result_plane * result_per_channel;
  const int64_t channels =
      std::clamp<int64_t>(kWidenedPlanesElements / per_channel, 1, s.in_channels);
  const int64_t blocks = (s.in_channels + channels - 1) / channels;
  at::parallel_for(0, s.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> wide_source, wide_result;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / blocks, first = task % blocks * channels;
      const int64_t count = std::min(channels, s.in_channels - first);
      const int64_t source_size = count * source_per_channel * source_plane;
      const int64_t result_size = count * result_per_channel * result_plane;
      wide_source.resize(source_size);
      wide_result.resize(result_size);
      widen(source + (n * s.in_channels + first) * source_per_channel * source_plane, source_size,
            wide_source.data());
      // The float32 kernel's own at::parallel_for runs inline here: ATen does not nest parallel
      // regions, so each block is one thread's, and the blocks are the tasks split across threads.
      float32_kernel(wide_source.data(), w.data() + first * m * taps, wide_result.data(),
                     depthwise_channel_block(s, count));
      narrow(wide_result.data(), result_size,
             result + (n * s.in_channels + first) * result_per_channel * result_plane);
    }
  });
}

Layout operand_layout(const LayoutCall& call) {
  return call.channels_last ? Layout::nhwc : Layout::nchw;
}

void depthwise_conv2d_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                          IntArrayRef padding, IntArrayRef dilation, const Tensor& output) {
  const LayoutCall call = check_depthwise("torch_convbp.depthwise_conv2d", input, weight, output,
                                          stride, padding, dilation);
  const ConvShape& s = call.shape;
  const NchwKernels kernels = nchw_kernels(s, input.scalar_type(), vector_planes_take_forward);
  if (call.channels_last || kernels == NchwKernels::nhwc) {
    return depthwise_nhwc_forward(input, weight, s, output, operand_layout(call));
  }
  if (kernels == NchwKernels::vector_planes && input.scalar_type() == at::kFloat) {
    return vector_planes_forward(input.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                                 output.mutable_data_ptr<float>(), s);
  }
  if (kernels == NchwKernels::vector_planes) {
    const int64_t m = s.out_channels / s.in_channels;
    return AT_DISPATCH_REDUCED_FLOATING_TYPES(input.scalar_type(), "depthwise_conv2d", [&] {
      on_widened_planes(input.const_data_ptr<scalar_t>(), s.height * s.width, 1,
                        weight.const_data_ptr<scalar_t>(), output.mutable_data_ptr<scalar_t>(),
                        s.out_height * s.out_width, m, s, vector_planes_forward);
    });
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d", [&] {
        forward_kernel(input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                       output.mutable_data_ptr<scalar_t>(), s);
      });
}

void depthwise_conv3d_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                          IntArrayRef padding, IntArrayRef dilation, const Tensor& output) {
  const LayoutCall call = check_depthwise_volumes("torch_convbp.depthwise_conv3d", input, weight,
                                                  output, stride, padding, dilation);
  depthwise_nhwc_forward(input, weight, call.shape, output, operand_layout(call));
}

void depthwise_conv3d_input_grad_cpu(const Tensor& grad_output, const Tensor& weight,
                                     IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                     const Tensor& grad_input) {
  const LayoutCall call =
      check_depthwise_volumes("torch_convbp.depthwise_conv3d_input_grad", grad_input, weight,
                              grad_output, stride, padding, dilation);
  depthwise_nhwc_input_grad(grad_output, weight, call.shape, grad_input, operand_layout(call));
}

// The weight gradient of volumes in the order of rows, the CPU's default for images (there is no
// kernel of volumes in the order of lanes: CUDA computes volumes on the 3-D column route).
void depthwise_conv3d_weight_grad_cpu(const Tensor& input, const Tensor& grad_output,
                                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                      const Tensor& grad_weight) {
  const LayoutCall call =
      check_depthwise_volumes("torch_convbp.depthwise_conv3d_weight_grad", input, grad_weight,
                              grad_output, stride, padding, dilation);
  depthwise_weight_grad_rows(input, grad_output, call.shape, grad_weight, operand_layout(call));
}

void depthwise_input_grad_cpu(const Tensor& grad_output, const Tensor& weight, IntArrayRef stride,
                              IntArrayRef padding, IntArrayRef dilation, const Tensor& grad_input) {
  const LayoutCall call = check_depthwise("torch_convbp.depthwise_input_grad", grad_input, weight,
                                          grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  const NchwKernels kernels =
      nchw_kernels(s, grad_output.scalar_type(), vector_planes_take_input_grad);
  if (call.channels_last || kernels == NchwKernels::nhwc) {
    return depthwise_nhwc_input_grad(grad_output, weight, s, grad_input, operand_layout(call));
  }
  if (kernels == NchwKernels::vector_planes && grad_output.scalar_type() == at::kFloat) {
    return vector_planes_input_grad(grad_output.const_data_ptr<float>(),
                                    weight.const_data_ptr<float>(),
                                    grad_input.mutable_data_ptr<float>(), s);
  }
  if (kernels == NchwKernels::vector_planes) {  // one output channel per input channel
    return AT_DISPATCH_REDUCED_FLOATING_TYPES(
        grad_output.scalar_type(), "depthwise_input_grad", [&] {
          on_widened_planes(grad_output.const_data_ptr<scalar_t>(), s.out_height * s.out_width, 1,
                            weight.const_data_ptr<scalar_t>(),
                            grad_input.mutable_data_ptr<scalar_t>(), s.height * s.width, 1, s,
                            vector_planes_input_grad);
        });
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_input_grad", [&] {
        input_grad_kernel(grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
                          grad_input.mutable_data_ptr<scalar_t>(), s);
      });
}

void depthwise_weight_grad_cpu(const Tensor& input, const Tensor& grad_output, IntArrayRef stride,
                               IntArrayRef padding, IntArrayRef dilation,
                               const Tensor& grad_weight) {
  const LayoutCall call = check_depthwise("torch_convbp.depthwise_weight_grad", input, grad_weight,
                                          grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  if (cpu_depthwise_order() == DepthwiseOrder::rows) {
    return depthwise_weight_grad_rows(input, grad_output, s, grad_weight, operand_layout(call));
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
  m.impl("depthwise_conv3d", &depthwise_conv3d_cpu);
  m.impl("depthwise_conv3d_input_grad", &depthwise_conv3d_input_grad_cpu);
  m.impl("depthwise_conv3d_weight_grad", &depthwise_conv3d_weight_grad_cpu);
  m.impl("depthwise_input_grad", &depthwise_input_grad_cpu);
  m.impl("depthwise_weight_grad", &depthwise_weight_grad_cpu);
}

}  // namespace torch_convbp
