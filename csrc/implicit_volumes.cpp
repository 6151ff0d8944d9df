// The rule of the volumes that the implicit route computes whole (implicit_volumes.h).
#include "implicit_volumes.h"

#include <algorithm>
#include <vector>

#include "checks.h"
#include "cpu/padded_planes.h"
#include "plan.h"

namespace torch_convbp {
namespace {

using at::Tensor;

// The first `count` slices of volume 0 of t [N, C, D, H, W], as a batch of images [count, C, H,
// W]: a view, channels_last images where t is channels_last_3d.
Tensor first_slices(const Tensor& t, int64_t count) {
  return t.select(0, 0).narrow(1, 0, count).transpose(0, 1);
}

// A view of t's memory with channels_last_3d strides: the layout in which the implicit kernels
// see the slices, for asking their 2-D route. Nothing reads through it (t's NCDHW memory holds as
// many elements, so the view stays within it).
Tensor channels_last_3d_strides(const Tensor& t) {
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return t;
  const int64_t c = t.size(1), d = t.size(2), h = t.size(3), w = t.size(4);
  return t.as_strided(t.sizes(), {c * d * h * w, 1, h * w * c, w * c, c});
}

// Whether NCDHW operands are worth the forward's and input gradient's copies into
// channels_last_3d: where the plane's kernel reads at least as many input values for the output
// pixels as the plane holds (kh*kw*OH*OW >= H*W), so that the 3-D column route would write more
// column values than the copies do. A plane strided past that (a 3x3/(4,4) kernel on 56x56: 9 *
// 14*14 against 56*56) keeps the 3-D route, which the copies would slow down (measured on MViT's
// pooling, a depthwise volume that has kernels of its own since: benchmarks/NOTES.md, sections
// 130 and 133). Every stride-1 plane passes, so the weight gradient's volumes (stride 1) are the
// same with or without it.
bool worth_copies(const ConvShape& s) {
  return s.kernel_h * s.kernel_w * s.out_height * s.out_width >= s.height * s.width;
}

}  // namespace

std::optional<RouteChoice> implicit_volume_route(Operator op, const ConvShape& s,
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
  // The weight gradient (stride 1: its kernel's) asks the forward's rule, on the input: the 2-D
  // rule of the weight gradient weighs im2col's kh*kw column values per input value against the
  // padded copies, where a volume's alternative is vol2col's kd times as many. 3x3x3 256@4x14 took
  // 1.30-1.35x ATen's time on the implicit kernel and 1.59-1.62x on the 3-D column route, where
  // the slices' weight gradient keeps the column route (channels_last, over 128 channels on an
  // AVX-512 Xeon; benchmarks/NOTES.md, section 137).
  // Its padded copies take one volume at least (cpu/padded_planes.h): past the workspace limit,
  // the 3-D column route, which takes bands of rows, keeps the memory bound.
  const bool weight_grad = op == Operator::weight_grad;
  if (weight_grad && (s.stride_h != 1 || s.stride_w != 1 ||
                      PaddedPlanes(s, /*even=*/false).weight_grad_image_bytes(s, sizeof(float)) >
                          workspace_limit())) {
    return std::nullopt;
  }
  const Operator asked = weight_grad ? Operator::forward : op;
  std::vector<Tensor> views;
  for (const Tensor& t : weight_grad ? activations.slice(0, 1) : activations) {
    views.push_back(first_slices(channels_last_3d_strides(t), count));
  }
  // Only where the slices' 2-D route has no column matrix: on the column route they would write
  // the same column values as vol2col.
  const RouteChoice choice = choose_route(asked, plane, views);
  if (choice.route != Route::implicit_nhwc) return std::nullopt;
  return choice;
}

}  // namespace torch_convbp
