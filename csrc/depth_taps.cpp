// 3-D convolutions as sums over their depth taps of 2-D convolutions on views (depth_taps.h).
#include "depth_taps.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <vector>

#include "checks.h"
#include "plan.h"

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

// Volumes [first, first + volumes) of t [N, C, D, H, W], their slices [begin, begin + count), as
// [volumes, count, C, H, W]: a view of channels_last_3d memory.
struct SliceRun {
  int64_t first, volumes, begin, count;
  Tensor of(const Tensor& t) const {
    return t.narrow(0, first, volumes).narrow(2, begin, count).transpose(1, 2);
  }
};

// The run's slices as one batch of images [volumes * count, C, H, W], channels_last: a view where
// they are every slice of each volume, or of one volume, else a copy.
Tensor slice_batch(const Tensor& t, const SliceRun& run) {
  const Tensor slices = run.of(t);
  const at::IntArrayRef image = slices.sizes().slice(2);
  if (run.count == t.size(2) || run.volumes == 1) {
    return slices.flatten(0, 1);  // a view: the volumes' slices lie one run apart
  }
  Tensor batch = at::empty({run.volumes * run.count, image[0], image[1], image[2]},
                           t.options().memory_format(at::MemoryFormat::ChannelsLast));
  batch.view(slices.sizes()).copy_(slices);
  return batch;
}

// The volumes a 2-D call takes at once: every volume, or as many as the workspace limit holds
// their batch's copies and the call's result for (at least one). One call per depth tap over every
// volume, rather than a call per volume and tap, gives the 2-D route a batch of N * count slices:
// on few shallow slices (r3d_18's 256@4x14) the implicit route's tiles took a row or two each, and
// each tile read every tap's weights from L3 (benchmarks/NOTES.md, section 129).
int64_t volumes_per_call(const ConvShape& s) {
  const int64_t slices = std::max(s.depth, s.out_depth);
  const int64_t volume_bytes =
      slices * (s.in_channels * s.height * s.width + s.out_channels * s.out_height * s.out_width) *
      int64_t{sizeof(float)};
  return std::clamp<int64_t>(workspace_limit() / std::max<int64_t>(volume_bytes, 1), 1, s.batch);
}

// (at::zeros ignores the options' memory format.)
Tensor zeros_channels_last_3d(at::IntArrayRef size, const Tensor& like) {
  return at::empty(size, like.options().memory_format(at::MemoryFormat::ChannelsLast3d)).zero_();
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

// Whether the slices' 2-D route computes them with no column matrix, so that summing its results
// over the depth taps costs a pass of the result per tap and nothing else: the implicit route
// (GEMMs on views). (Depthwise volumes, which took the depthwise kernels on NHWC slices, have
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
  if (s.spatial_dims != 3 || s.kernel_d == 1 || s.stride_d != 1 || s.batch == 0) {
    return std::nullopt;
  }
  // A volume with kernels of its own (the depthwise ones) takes them.
  if (choose_route(op, s, activations).route == Route::depthwise) return std::nullopt;
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
    views.push_back(slice_batch(channels_last_3d_strides(t), {0, 1, 0, count}));
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

Tensor forward_by_depth_taps(const Tensor& input_as_given, const Tensor& weight, const ConvShape& s,
                             const SliceForward& conv2d) {
  const Tensor input = in_channels_last_3d(input_as_given);
  Tensor output = zeros_channels_last_3d(
      {s.batch, s.out_channels, s.out_depth, s.out_height, s.out_width}, input);
  const int64_t per_call = volumes_per_call(s);
  for (int64_t first = 0; first < s.batch; first += per_call) {
    const int64_t volumes = std::min(per_call, s.batch - first);
    for (int64_t t = 0; t < s.kernel_d; ++t) {
      const TapSlices r = tap_slices(s, t);
      if (r.count() <= 0) continue;
      // Y[n, :, od] += conv2d(X[n, :, od + offset], W[:, :, t]) for the run of od, every volume
      const SliceRun into{first, volumes, r.begin, r.count()},
          from{first, volumes, r.begin + r.offset, r.count()};
      const Tensor products = conv2d(slice_batch(input, from), weight.select(2, t));
      Tensor run = into.of(output);
      run.add_(products.view(run.sizes()));
    }
  }
  return output;
}

Tensor input_grad_by_depth_taps(const Tensor& grad_output_as_given, const Tensor& weight,
                                const ConvShape& s, const SliceInputGrad& conv2d_input_grad) {
  const Tensor grad_output = in_channels_last_3d(grad_output_as_given);
  Tensor grad_input =
      zeros_channels_last_3d({s.batch, s.in_channels, s.depth, s.height, s.width}, grad_output);
  const int64_t per_call = volumes_per_call(s);
  for (int64_t first = 0; first < s.batch; first += per_call) {
    const int64_t volumes = std::min(per_call, s.batch - first);
    for (int64_t t = 0; t < s.kernel_d; ++t) {
      const TapSlices r = tap_slices(s, t);
      if (r.count() <= 0) continue;
      // dX[n, :, od + offset] += conv2d_input_grad(dY[n, :, od], W[:, :, t]) for the run of od,
      // every volume
      const SliceRun from{first, volumes, r.begin, r.count()},
          into{first, volumes, r.begin + r.offset, r.count()};
      const Tensor products =
          conv2d_input_grad(slice_batch(grad_output, from), weight.select(2, t),
                            {volumes * r.count(), s.in_channels, s.height, s.width});
      Tensor run = into.of(grad_input);
      run.add_(products.view(run.sizes()));
    }
  }
  return grad_input;
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
          conv2d_weight_grad(slice_batch(input, {n, 1, r.begin + r.offset, r.count()}),
                             slice_batch(grad_output, {n, 1, r.begin, r.count()}), tap_size);
      sum = n == 0 ? term : sum.add_(term);
    }
    taps.push_back(sum);
  }
  return at::stack(taps, 2).view(weight_size);  // [Cout, C/G, kd, kh, kw]
}

}  // namespace torch_convbp
