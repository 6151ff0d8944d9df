// Every check of the operators' arguments, in one place (declared in checks.h).
// The fake (meta) kernels in torch_convbp/_meta.py mirror these checks for torch.compile.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "checks.h"
#include "layout.h"

namespace torch_convbp {
namespace {

std::string sizes_str(IntArrayRef sizes) { return c10::str(sizes); }

// A dtype as Python users write it (torch.float32), as the fake kernels print it.
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "torch.float64";
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return c10::toString(t);
  }
}

}  // namespace

void check_operands(const char* op, NamedTensors operands) {
  const auto& [first_name, first] = *operands.begin();
  const auto dtype = first->scalar_type();
  TORCH_CHECK(
      dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
      op, ": ", first_name, " must be float64, float32, float16 or bfloat16, got ",
      dtype_name(dtype));
  check_same_kind(op, operands);
}

void check_same_kind(const char* op, NamedTensors operands) {
  const auto& [first_name, first] = *operands.begin();
  const auto dtype = first->scalar_type();
  for (const auto& [name, tensor] : operands) {
    TORCH_CHECK(tensor->layout() == at::kStrided, op, ": ", name,
                " must be a dense (strided) tensor, got layout ", tensor->layout());
    TORCH_CHECK(tensor->scalar_type() == dtype, op, ": ", first_name, " (", dtype_name(dtype),
                ") and ", name, " (", dtype_name(tensor->scalar_type()),
                ") must have the same dtype");
    TORCH_CHECK(tensor->device() == first->device(), op, ": ", first_name, " (", first->device(),
                ") and ", name, " (", tensor->device(), ") must be on the same device");
  }
}

void check_grad_output(const char* op, const Tensor& grad_output, const ConvShape& s) {
  std::vector<int64_t> expected{s.batch, s.out_channels, s.out_height, s.out_width};
  if (!s.is_planar()) {
    expected.insert(expected.begin() + 2, s.out_depth);
  }
  TORCH_CHECK(grad_output.sizes() == IntArrayRef(expected), op, ": expected grad_output of size ",
              IntArrayRef(expected), " (the convolution's output), got ", grad_output.sizes());
}

ConvShape check_convolution(const char* op, int64_t dims, IntArrayRef input_size,
                            IntArrayRef weight_size, IntArrayRef stride, IntArrayRef padding,
                            IntArrayRef dilation, int64_t groups) {
  const bool volumes = dims == 3;
  const size_t rank = volumes ? 5 : 4;
  TORCH_CHECK(input_size.size() == rank, op,
              volumes ? ": expected a 5-D input [N, C, D, H, W], got size "
                      : ": expected a 4-D input [N, C, H, W], got size ",
              sizes_str(input_size));
  TORCH_CHECK(weight_size.size() == rank, op,
              volumes
                  ? ": expected a 5-D weight [out_channels, in_channels/groups, kD, kH, kW], "
                    "got size "
                  : ": expected a 4-D weight [out_channels, in_channels/groups, kH, kW], got size ",
              sizes_str(weight_size));
  for (const auto& [name, values] : {std::pair<const char*, IntArrayRef>{"stride", stride},
                                     {"padding", padding},
                                     {"dilation", dilation}}) {
    TORCH_CHECK(values.size() == static_cast<size_t>(dims), op, ": expected ", name, " to have ",
                volumes ? "3 values (depth, height, width)" : "2 values (height, width)", ", got ",
                sizes_str(values));
  }
  const auto all = [](IntArrayRef values, auto&& test) {
    return std::all_of(values.begin(), values.end(), test);
  };
  TORCH_CHECK(all(stride, [](int64_t v) { return v > 0; }), op, ": stride must be positive, got ",
              sizes_str(stride));
  TORCH_CHECK(all(dilation, [](int64_t v) { return v > 0; }), op,
              ": dilation must be positive, got ", sizes_str(dilation));
  TORCH_CHECK(all(padding, [](int64_t v) { return v >= 0; }), op,
              ": padding must be non-negative, got ", sizes_str(padding));
  TORCH_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  for (int64_t s : input_size) {
    TORCH_CHECK(s >= 0, op, ": input size must be non-negative, got ", sizes_str(input_size));
  }

  // The last two spatial dimensions are height and width; a third, before them, the depth.
  const size_t h = rank - 2, w = rank - 1;
  ConvShape s{};
  s.batch = input_size[0];
  s.in_channels = input_size[1];
  s.height = input_size[h];
  s.width = input_size[w];
  s.out_channels = weight_size[0];
  s.kernel_h = weight_size[h];
  s.kernel_w = weight_size[w];
  s.stride_h = stride[dims - 2];
  s.stride_w = stride[dims - 1];
  s.pad_h = padding[dims - 2];
  s.pad_w = padding[dims - 1];
  s.dilation_h = dilation[dims - 2];
  s.dilation_w = dilation[dims - 1];
  s.groups = groups;
  s.spatial_dims = dims;
  if (volumes) {
    s.depth = input_size[2];
    s.kernel_d = weight_size[2];
    s.stride_d = stride[0];
    s.pad_d = padding[0];
    s.dilation_d = dilation[0];
  }

  TORCH_CHECK(s.out_channels > 0 && s.kernel_d > 0 && s.kernel_h > 0 && s.kernel_w > 0 &&
                  weight_size[1] > 0,
              op, ": weight must have non-zero sizes, got ", sizes_str(weight_size));
  TORCH_CHECK(s.out_channels % groups == 0, op, ": given groups=", groups,
              ", out_channels (weight size ", sizes_str(weight_size),
              ", dimension 0) must be divisible by groups");
  TORCH_CHECK(s.in_channels == weight_size[1] * groups, op, ": given groups=", groups,
              " and weight of size ", sizes_str(weight_size), ", expected input of size ",
              sizes_str(input_size), " to have ", weight_size[1] * groups, " channels, but got ",
              s.in_channels, " channels instead");
  TORCH_CHECK(s.depth > 0 && s.height > 0 && s.width > 0, op,
              volumes ? ": input depth, height and width must be non-zero, got "
                      : ": input height and width must be non-zero, got ",
              sizes_str(input_size));

  const int64_t padded_d = s.depth + 2 * s.pad_d, padded_h = s.height + 2 * s.pad_h;
  const int64_t padded_w = s.width + 2 * s.pad_w;
  const int64_t reach_d = s.dilation_d * (s.kernel_d - 1) + 1;  // kernel extent with dilation
  const int64_t reach_h = s.dilation_h * (s.kernel_h - 1) + 1;
  const int64_t reach_w = s.dilation_w * (s.kernel_w - 1) + 1;
  // "D x H x W" (or "H x W"), built only for the message
  const auto extent = [volumes](int64_t d, int64_t h, int64_t w) {
    return (volumes ? std::to_string(d) + " x " : std::string()) + std::to_string(h) + " x " +
           std::to_string(w);
  };
  TORCH_CHECK(padded_d >= reach_d && padded_h >= reach_h && padded_w >= reach_w, op,
              ": padded input size per channel (", extent(padded_d, padded_h, padded_w),
              ") is smaller than the dilated kernel (", extent(reach_d, reach_h, reach_w),
              "); the kernel can't be larger than the padded input");
  s.out_depth = (padded_d - reach_d) / s.stride_d + 1;
  s.out_height = (padded_h - reach_h) / s.stride_h + 1;
  s.out_width = (padded_w - reach_w) / s.stride_w + 1;
  return s;
}

ColumnGeometry check_columns(const char* op, Layout layout, const Tensor& images,
                             const Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, int64_t row_start,
                             int64_t rows) {
  check_operands(op, {{"images", &images}});  // a floating dtype, dense
  TORCH_CHECK(columns.layout() == at::kStrided, op,
              ": columns must be a dense (strided) tensor, got layout ", columns.layout());
  const bool nhwc = layout == Layout::nhwc;
  const bool volumes = images.dim() == 5;
  const auto format =
      nhwc ? (volumes ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast)
           : at::MemoryFormat::Contiguous;
  TORCH_CHECK((images.dim() == 4 || volumes) && images.is_contiguous(format), op,
              nhwc ? ": expected dense channels_last images [N, C, H, W] or [N, C, D, H, W], got "
                     "size "
                   : ": expected contiguous images [N, C, H, W] or [N, C, D, H, W], got size ",
              sizes_str(images.sizes()), " and strides ", images.strides());
  TORCH_CHECK(columns.is_contiguous(), op, ": expected a contiguous column matrix");
  const auto image_dtype = images.scalar_type(), column_dtype = columns.scalar_type();
  const bool half_images = image_dtype == at::kHalf || image_dtype == at::kBFloat16;
  TORCH_CHECK(column_dtype == image_dtype || (half_images && column_dtype == at::kFloat), op,
              ": columns must have the images' dtype, or float32 for float16 and bfloat16 "
              "images; got images ",
              dtype_name(image_dtype), " and columns ", dtype_name(column_dtype));
  TORCH_CHECK(images.device() == columns.device(), op,
              ": images and columns must be on the same device, got ", images.device(), " and ",
              columns.device());
  const int64_t dims = images.dim() - 2;
  TORCH_CHECK(kernel_size.size() == static_cast<size_t>(dims), op,
              ": expected kernel_size to have ", dims,
              " values, one per spatial dimension of the images, got ", sizes_str(kernel_size));
  const int64_t channels = images.size(1);
  std::vector<int64_t> kernel_weight{1, channels};
  kernel_weight.insert(kernel_weight.end(), kernel_size.begin(), kernel_size.end());
  const ConvShape s =
      check_convolution(op, dims, images.sizes(), kernel_weight, stride, padding, dilation, 1);
  TORCH_CHECK(row_start >= 0 && rows >= 0 && row_start + rows <= s.output_rows(), op,
              ": output rows [", row_start, ", ", row_start + rows, ") are outside the output ",
              volumes ? "rows (depth slices times rows) " : "height ", s.output_rows());
  const int64_t pixels = s.batch * rows * s.out_width;
  int64_t groups = 1;
  if (nhwc) {
    groups = columns.dim() == 3 ? columns.size(0) : 0;
    TORCH_CHECK(groups > 0 && channels % groups == 0, op,
                ": expected a column matrix [groups, pixels, kh*kw*channels/groups] whose groups "
                "divide the images' ",
                channels, " channels, got size ", sizes_str(columns.sizes()));
    const std::vector<int64_t> expected{groups, pixels, s.column_rows() / groups};
    TORCH_CHECK(columns.sizes() == IntArrayRef(expected), op, ": expected a column matrix of size ",
                sizes_str(expected), " ([groups, pixels, kh*kw*channels/groups]), got ",
                sizes_str(columns.sizes()));
  } else {
    const int64_t expected = s.column_rows() * pixels;
    TORCH_CHECK(columns.numel() == expected, op, ": expected a column matrix of ", expected,
                " elements ([", s.column_rows(), ", ", pixels, "]), got ", columns.numel());
  }
  return column_geometry(s, channels, groups, row_start, rows);
}

namespace {

// The memory layouts a direct kernel takes its weight in: contiguous, or either contiguous or
// dense channels_last (the implicit route's kernels).
enum class WeightLayouts { contiguous, contiguous_or_channels_last };

// The channels-last format of tensors of `dims` spatial dimensions, and its name in messages:
// channels_last, or channels_last_3d for volumes.
struct ChannelsLast {
  at::MemoryFormat format;
  const char* name;
};
ChannelsLast channels_last_of(int64_t dims) {
  return {memory_format(Layout::nhwc, dims + 2), dims == 3 ? "channels_last_3d" : "channels_last"};
}

// What the direct kernels' checks share: input [N, C, H, W], weight [Cout, C/G, kh, kw] contiguous
// and output [N, Cout, OH, OW] (volumes, dims 3: [N, C, D, H, W], [Cout, C/G, kd, kh, kw] and
// [N, Cout, OD, OH, OW]), of one dtype and device, with sizes F.conv2d (F.conv3d) accepts.
// `groups`: G, or none for one group per input channel (depthwise).
ConvShape check_direct_kernel_call(const char* op, const Tensor& input, const Tensor& weight,
                                   const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                                   IntArrayRef dilation, std::optional<int64_t> groups,
                                   WeightLayouts weight_layouts = WeightLayouts::contiguous,
                                   int64_t dims = 2) {
  check_operands(op, {{"input", &input}, {"weight", &weight}, {"output", &output}});
  TORCH_CHECK(input.dim() == dims + 2, op, ": expected a ", dims + 2, "-D input [N, C, ",
              dims == 3 ? "D, " : "", "H, W], got size ", sizes_str(input.sizes()));
  const ConvShape s = check_convolution(op, dims, input.sizes(), weight.sizes(), stride, padding,
                                        dilation, groups.value_or(input.size(1)));
  std::vector<int64_t> expected{s.batch, s.out_channels, s.out_height, s.out_width};
  if (dims == 3) expected.insert(expected.begin() + 2, s.out_depth);
  TORCH_CHECK(output.sizes() == IntArrayRef(expected), op, ": expected output of size ",
              IntArrayRef(expected), ", got ", output.sizes());
  if (weight_layouts == WeightLayouts::contiguous_or_channels_last) {
    const ChannelsLast last = channels_last_of(dims);
    TORCH_CHECK(weight.is_contiguous() || weight.is_contiguous(last.format), op,
                ": expected a contiguous or ", last.name, " (dense) weight, got strides ",
                weight.strides());
  } else {
    TORCH_CHECK(weight.is_contiguous(), op, ": expected a contiguous weight");
  }
  return s;
}

// Whether the input and output are both dense channels_last (true) or both contiguous (false: NCHW,
// also where both layouts are one, as for 1x1 images); any other pair is refused. Volumes: the
// same with channels_last_3d.
bool both_channels_last(const char* op, const Tensor& input, const Tensor& output) {
  if (input.is_contiguous() && output.is_contiguous()) return false;
  const ChannelsLast last = channels_last_of(input.dim() - 2);
  TORCH_CHECK(input.is_contiguous(last.format) && output.is_contiguous(last.format), op,
              ": expected input and output both contiguous or both ", last.name,
              " (dense), got strides ", input.strides(), " and ", output.strides());
  return true;
}

}  // namespace

LayoutCall check_depthwise(const char* op, const Tensor& input, const Tensor& weight,
                           const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                           IntArrayRef dilation) {
  const ConvShape s = check_direct_kernel_call(op, input, weight, output, stride, padding, dilation,
                                               /*groups=*/std::nullopt);
  return {s, both_channels_last(op, input, output)};
}

LayoutCall check_depthwise_volumes(const char* op, const Tensor& input, const Tensor& weight,
                                   const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                                   IntArrayRef dilation) {
  const ConvShape s = check_direct_kernel_call(op, input, weight, output, stride, padding, dilation,
                                               /*groups=*/std::nullopt, WeightLayouts::contiguous,
                                               /*dims=*/3);
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble, op,
              ": computes float32 and float64 only, got ", dtype_name(input.scalar_type()));
  return {s, both_channels_last(op, input, output)};
}

ConvShape check_grouped(const char* op, const Tensor& input, const Tensor& weight,
                        const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
  const ConvShape s =
      check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, groups);
  const auto last = at::MemoryFormat::ChannelsLast;
  TORCH_CHECK(input.is_contiguous(last) && output.is_contiguous(last), op,
              ": expected input and output both channels_last (dense), got strides ",
              input.strides(), " and ", output.strides());
  return s;
}

LayoutCall check_implicit_call(const char* op, const Tensor& input, const Tensor& weight,
                               const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                               IntArrayRef dilation, int64_t groups, Written written,
                               int64_t dims) {
  const ConvShape s =
      check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, groups,
                               WeightLayouts::contiguous_or_channels_last, dims);
  const bool writes_output = written == Written::output;
  const Tensor& read = writes_output ? input : output;
  const Tensor& result = writes_output ? output : input;
  const char* read_name = writes_output ? "input" : "output";
  const char* result_name = writes_output ? "output" : "input";
  const ChannelsLast nhwc = channels_last_of(dims);
  TORCH_CHECK(read.is_contiguous(nhwc.format), op, ": expected a ", nhwc.name, " (dense) ",
              read_name, ", got strides ", read.strides());
  TORCH_CHECK(result.is_contiguous(nhwc.format) || result.is_contiguous(), op, ": expected a ",
              nhwc.name, " or contiguous (dense) ", result_name, ", got strides ",
              result.strides());
  return {s, result.is_contiguous(nhwc.format)};
}

LayoutCall check_implicit_weight_grad_call(const char* op, const Tensor& input,
                                           const Tensor& weight, const Tensor& output,
                                           IntArrayRef stride, IntArrayRef padding,
                                           IntArrayRef dilation, int64_t groups, int64_t dims) {
  const ConvShape s =
      check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, groups,
                               WeightLayouts::contiguous_or_channels_last, dims);
  return {s, both_channels_last(op, input, output)};
}

namespace {

// What both copies ask of their elements: the same kind of tensor, and elements the copies move
// whole (at most 8 bytes).
void check_copy_elements(const char* op, const Tensor& source, const Tensor& target) {
  check_same_kind(op, {{"source", &source}, {"target", &target}});
  TORCH_CHECK(source.element_size() <= 8, op, ": elements of ", source.element_size(),
              " bytes are not supported (at most 8)");
}

// A copy's target: each element written once, by one thread, so no two may share memory, and
// not in the source's storage (a transposition in place would read what it already wrote;
// whether two views with gaps overlap is not cheap to tell, so none is taken).
void check_separate_target(const char* op, const Tensor& source, const Tensor& target) {
  TORCH_CHECK(at::has_internal_overlap(target) != at::MemOverlap::Yes, op,
              ": the target has elements that share memory (an expanded tensor?); expected each "
              "to have its own");
  TORCH_CHECK(!source.is_alias_of(target), op,
              ": the source and the target share memory (views of one storage); expected separate "
              "tensors");
}

}  // namespace

void check_transpose_copy(const char* op, const Tensor& source, const Tensor& target) {
  check_copy_elements(op, source, target);
  TORCH_CHECK(source.dim() == 3, op, ": expected a 3-D source [B, R, C], got ", source.sizes());
  const std::vector<int64_t> transposed{source.size(0), source.size(2), source.size(1)};
  TORCH_CHECK(target.sizes() == IntArrayRef(transposed), op, ": expected a target of size ",
              IntArrayRef(transposed), " (the source's matrices transposed), got ", target.sizes());
  for (const auto& [name, t] : {std::pair{"source", &source}, std::pair{"target", &target}}) {
    TORCH_CHECK(t->size(2) <= 1 || t->stride(2) == 1, op, ": expected the ", name,
                "'s rows contiguous (unit last stride), got strides ", t->strides());
  }
  check_separate_target(op, source, target);
}

void check_transpose_taps(const char* op, const Tensor& source, const Tensor& target) {
  check_copy_elements(op, source, target);
  TORCH_CHECK(source.dim() == 4 && source.is_contiguous(), op,
              ": expected a contiguous 4-D source [G, A, B, taps], got size ", source.sizes(),
              " and strides ", source.strides());
  const std::vector<int64_t> transposed{source.size(0), source.size(2), source.size(1),
                                        source.size(3)};
  TORCH_CHECK(target.sizes() == IntArrayRef(transposed), op, ": expected a target of size ",
              IntArrayRef(transposed), " (each group's A and B swapped), got ", target.sizes());
  check_separate_target(op, source, target);
}

}  // namespace torch_convbp
