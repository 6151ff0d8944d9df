// 3-D convolutions as 2-D ones on views of their tensors (volume_planes.h).
#include "volume_planes.h"

#include <algorithm>

namespace torch_convbp {
namespace {

// the weight's unit dimension in the form
int64_t unit_weight_dim(PlanarForm form) { return form == PlanarForm::depth_slices ? 2 : 4; }

}  // namespace

std::optional<PlanarForm> planar_form(const ConvShape& s, at::TensorList activations) {
  if (s.spatial_dims != 3) return std::nullopt;
  // First: a view in either format, where both forms hold (a 1x1x1 kernel of stride 1).
  if (s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 &&
      s.pad_w == 0) {
    return PlanarForm::pixel_columns;
  }
  const bool slices_are_images = std::all_of(activations.begin(), activations.end(), [](auto& t) {
    return t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  });
  if (s.kernel_d == 1 && s.stride_d == 1 && s.pad_d == 0 && slices_are_images) {
    return PlanarForm::depth_slices;
  }
  return std::nullopt;
}

PlanarArguments planar_arguments(PlanarForm form, const ConvShape& s) {
  if (form == PlanarForm::depth_slices) {
    return {{s.stride_h, s.stride_w}, {s.pad_h, s.pad_w}, {s.dilation_h, s.dilation_w}};
  }
  return {{s.stride_d, 1}, {s.pad_d, 0}, {s.dilation_d, 1}};
}

std::vector<int64_t> size_as_planes(at::IntArrayRef volume_size, PlanarForm form) {
  const int64_t n = volume_size[0], c = volume_size[1], d = volume_size[2], h = volume_size[3],
                w = volume_size[4];
  if (form == PlanarForm::depth_slices) return {n * d, c, h, w};
  return {n, c, d, h * w};
}

at::Tensor activation_as_planes(const at::Tensor& t, PlanarForm form) {
  const std::vector<int64_t> size = size_as_planes(t.sizes(), form);
  // [N, D, C, H, W] with N and D merged (a view in NDHWC), or H and W merged (a view in NCDHW and
  // NDHWC alike)
  const at::Tensor planes =
      form == PlanarForm::depth_slices ? t.transpose(1, 2).reshape(size) : t.reshape(size);
  // A view's unit dimensions keep strides of no meaning (a batch of one: the volume's C), which
  // can hide a channels_last view from suggest_memory_format and so from the routes: give it
  // channels_last's own.
  if (planes.is_contiguous(at::MemoryFormat::ChannelsLast) && !planes.is_contiguous()) {
    const int64_t c = size[1], h = size[2], w = size[3];
    return planes.as_strided(size, {h * w * c, 1, w * c, c});
  }
  return planes;
}

at::Tensor activation_as_volume(const at::Tensor& t, PlanarForm form, at::IntArrayRef volume_size) {
  const int64_t n = volume_size[0], c = volume_size[1], d = volume_size[2], h = volume_size[3],
                w = volume_size[4];
  if (form == PlanarForm::depth_slices) return t.view({n, d, c, h, w}).transpose(1, 2);
  return t.view({n, c, d, h, w});
}

std::vector<int64_t> weight_size_as_planes(at::IntArrayRef volume_size, PlanarForm form) {
  std::vector<int64_t> size(volume_size.begin(), volume_size.end());
  size.erase(size.begin() + unit_weight_dim(form));
  return size;
}

at::Tensor weight_as_planes(const at::Tensor& w, PlanarForm form) {
  return w.select(unit_weight_dim(form), 0);
}

at::Tensor weight_as_volume(const at::Tensor& w, at::IntArrayRef volume_size) {
  return w.view(volume_size);  // a unit dimension put back: a view in any memory format
}

const char* planar_form_why(PlanarForm form) {
  return form == PlanarForm::depth_slices
             ? "a 3-D convolution one slice deep: each depth slice an image, on the 2-D route "
             : "a 3-D convolution one pixel wide in each plane: each plane one image row, on the "
               "2-D route ";
}

}  // namespace torch_convbp
