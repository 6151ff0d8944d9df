// The weight gradient of 3-D convolutions as sums over their depth taps of 2-D ones on views, and
// the rule of the volumes that the implicit route computes (depth_taps.h).
#include "depth_taps.h"

#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <vector>

#include "checks.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// The output slices [begin, end) that depth tap t reaches (depth stride 1), each taking input
// slice od + offset.
struct TapSlices {
  int64_t begin, end, offset;
  int64_t count() const { return end - begin; }
};
TapSlices tap_slices(const ConvShape& s, int64_t t) {
  const int64_t offset = t * s.dilation_d - s.pad_d;
  return {std::max<int64_t>(0, -offset), std::min(s.out_depth, s.depth - offset), offset};
}

// Slices [begin, begin + count) of volume n of t [N, C, D, H, W], as a batch of images [count,
// C, H, W]: a view, channels_last images where t is channels_last_3d.
Tensor slices_of(const Tensor& t, int64_t n, int64_t begin, int64_t count) {
  return t.select(0, n).narrow(1, begin, count).transpose(0, 1);
}

// The operand in channels_last_3d memory, where the slices are NHWC images: itself, or (NCDHW)
// a copy.
Tensor in_channels_last_3d(const Tensor& t) {
  return t.contiguous(at::MemoryFormat::ChannelsLast3d);
}

// A view of t's memory with channels_last_3d strides: the layout its slices will have once
// in_channels_last_3d copies it, for choosing their route before copying. Nothing reads through
// it (t's NCDHW memory holds as many elements, so the view stays within it).
Tensor channels_last_3d_strides(const Tensor& t) {
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return t;
  const int64_t c = t.size(1), d = t.size(2), h = t.size(3), w = t.size(4);
  return t.as_strided(t.sizes(), {c * d * h * w, 1, h * w * c, w * c, c});
}

// Whether the slices' 2-D route computes them with no column matrix: the implicit route (GEMMs on
// views), which then computes the volume's forward and input gradient whole (choose_route), and
// whose weight gradient summed over the depth taps costs a pass of dW's taps per volume. (On the
// column route the slices would write the same column values as vol2col. Depthwise volumes have
// kernels of their own: benchmarks/NOTES.md, sections 130-133.)
bool slice_route_has_no_columns(const RouteChoice& choice) {
  return choice.route == Route::implicit_nhwc;
}

// Whether NCDHW operands are worth their copies into channels_last_3d: where the plane's kernel
// reads at least as many input values for the output pixels as the plane holds (kh*kw*OH*OW >=
// H*W), so that the 3-D column route would write more column values than the copies do. A plane
// strided past that (a 3x3/(4,4) kernel on 56x56: 9 * 14*14 against 56*56) keeps the 3-D route,
// which the copies would slow down (measured on MViT's pooling, a depthwise volume that has kernels
// of its own since: benchmarks/NOTES.md, sections 130 and 133).
bool worth_copies(const ConvShape& s) {
  return s.kernel_h * s.kernel_w * s.out_height * s.out_width >= s.height * s.width;
}

}  // namespace

std::optional<RouteChoice> depth_taps_route(Operator op, const ConvShape& s,
                                            at::TensorList activations) {
  // (A depthwise volume has kernels of its own: choose_route.)
  if (s.spatial_dims != 3 || s.kernel_d == 1 || s.stride_d != 1 || s.batch == 0 ||
      s.is_depthwise()) {
    return std::nullopt;
  }
  for (const Tensor& t : activations) {
    const bool copied = !t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
    if (!t.device().is_cpu() || t.scalar_type() != at::kFloat ||
        (copied && !(t.is_contiguous() && worth_copies(s)))) {
      return std::nullopt;
    }
  }
  // One volume's slices as the 2-D convolution's batch: as many as the shorter side has.
  const int64_t count = std::min(s.depth, s.out_depth);
  const ConvShape plane = check_convolution(
      "torch_convbp", 2, {count, s.in_channels, s.height, s.width},
      {s.out_channels, s.in_channels / s.groups, s.kernel_h, s.kernel_w}, {s.stride_h, s.stride_w},
      {s.pad_h, s.pad_w}, {s.dilation_h, s.dilation_w}, s.groups);
  std::vector<Tensor> views;
  for (const Tensor& t : activations) {
    views.push_back(slices_of(channels_last_3d_strides(t), 0, 0, count));
  }
  const RouteChoice choice = choose_route(op, plane, views);
  if (!slice_route_has_no_columns(choice)) return std::nullopt;
  return choice;
}

const char* depth_taps_why() {
  return "a 3-D convolution of channels_last_3d volumes (NCDHW ones copied into that format), "
         "depth stride 1: a sum over its depth taps of 2-D convolutions of each volume's slices, "
         "on the 2-D route ";
}

Tensor weight_grad_by_depth_taps(const Tensor& input_as_given, const Tensor& grad_output_as_given,
                                 at::IntArrayRef weight_size, const ConvShape& s,
                                 const SliceWeightGrad& conv2d_weight_grad) {
  const Tensor input = in_channels_last_3d(input_as_given);
  const Tensor grad_output = in_channels_last_3d(grad_output_as_given);
  const std::vector<int64_t> tap_size = {s.out_channels, s.in_channels / s.groups, s.kernel_h,
                                         s.kernel_w};
  std::vector<Tensor> taps;
  for (int64_t t = 0; t < s.kernel_d; ++t) {
    const TapSlices r = tap_slices(s, t);
    if (r.count() <= 0) {  // a tap that reaches no slice
      taps.push_back(at::zeros(tap_size, input.options()));
      continue;
    }
    // dW[:, :, t] = sum over n in order of conv2d_weight_grad(X[n, :, od + offset], dY[n, :, od])
    Tensor sum;
    for (int64_t n = 0; n < s.batch; ++n) {
      const Tensor term =
          conv2d_weight_grad(slices_of(input, n, r.begin + r.offset, r.count()),
                             slices_of(grad_output, n, r.begin, r.count()), tap_size);
      sum = n == 0 ? term : sum.add_(term);
    }
    taps.push_back(sum);
  }
  return at::stack(taps, 2).view(weight_size);  // [Cout, C/G, kd, kh, kw]
}

}  // namespace torch_convbp
