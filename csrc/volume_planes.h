// 3-D convolutions that are 2-D ones on views of their tensors (volume_planes.cpp), so that they
// take the 2-D routes: the implicit, pointwise, depthwise and grouped kernels are 2-D, and
// choose_route sends other volumes to the column routes (route.cpp). Two forms:
//
// - depth slices: a kernel one slice deep, depth stride 1, no depth padding (R(2+1)D's 1x3x3
//   layers). Each depth slice of each volume is an image: [N, C, D, H, W] as [N*D, C, H, W], a
//   kernel [kh, kw]. A view of channels_last_3d activations only: NCDHW ones would be copied into
//   images, and through those copies (and the 2-D route's) the steps of R(2+1)D's layers took
//   1.05-1.09x the column route's time (benchmarks/NOTES.md, section 123).
// - pixel columns: a kernel one pixel in each plane, stride 1 and no padding along the height and
//   width (R(2+1)D's 3x1x1 layers, 1x1x1 ones). Each slice's plane is one image row of H*W pixels:
//   [N, C, D, H, W] as [N, C, D, H*W], a kernel [kd, 1]. A view in either format.
//
// The 2-D convolution has the same terms as the 3-D one, so its values are the convolution's;
// its routes' sums, their order and their bits are the 2-D routes'.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <vector>

#include "shape.h"

namespace torch_convbp {

enum class PlanarForm { depth_slices, pixel_columns };

// The form in which 3-D convolution `s` of these activation operands (the forward's input, the
// input gradient's output gradient, the weight gradient's both) is a 2-D one on views, if any.
std::optional<PlanarForm> planar_form(const ConvShape& s, at::TensorList activations);

// The 2-D convolution's stride, padding and dilation (pairs).
struct PlanarArguments {
  std::array<int64_t, 2> stride, padding, dilation;
};
PlanarArguments planar_arguments(PlanarForm form, const ConvShape& s);

// An activation [N, C, D, H, W] (or its size) as the 2-D convolution's [N', C, H', W'], and back:
// `volume_size` is the 5-D size the 4-D `t` stands for.
std::vector<int64_t> size_as_planes(at::IntArrayRef volume_size, PlanarForm form);
at::Tensor activation_as_planes(const at::Tensor& t, PlanarForm form);
at::Tensor activation_as_volume(const at::Tensor& t, PlanarForm form, at::IntArrayRef volume_size);

// A weight [Cout, C/G, kd, kh, kw] (or its size) as the 2-D convolution's [Cout, C/G, kh', kw']:
// without its unit depth (depth slices) or its unit width (pixel columns); and back.
std::vector<int64_t> weight_size_as_planes(at::IntArrayRef volume_size, PlanarForm form);
at::Tensor weight_as_planes(const at::Tensor& w, PlanarForm form);
at::Tensor weight_as_volume(const at::Tensor& w, at::IntArrayRef volume_size);

// explain()'s words for the form.
const char* planar_form_why(PlanarForm form);

}  // namespace torch_convbp
