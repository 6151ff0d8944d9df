// The orchestration of torch_convbp, written once for every device.
//
// For one group g of G, with col = im2col(x) the [Cin/G*kh*kw, P] column matrix of P output
// pixels (a chunk of images side by side), W_g the [Cout/G, Cin/G*kh*kw] weight matrix and
// dY_g the [Cout/G, P] output gradient:
//   forward       Y_g   = W_g  @ col                  [Cout/G, P]
//   grad-weight   dW_g += dY_g @ col^T                [Cout/G, Cin/G*kh*kw], summed over chunks
//   grad-input    dcol  = W_g^T @ dY_g,  dx = col2im(dcol)
//                 or, for stride 1, dx = the forward convolution of dY with W rotated by 180°
//                 and transposed (im2col of dY, a GEMM straight into dx; no col2im)
// The G groups are the batch dimension of one bmm. The batch is processed in chunks whose
// buffers fit the workspace limit; the device is reached only through the im2col and col2im
// operators (cpu/ and cuda/), and the GEMMs go through ATen (MKL, cuBLAS).
// Each operator computes in one memory layout, NCHW or NHWC, chosen from its operands' strides
// (layout.h). The GEMMs above are written once for both: matrices.h sees each layout's tensors as
// these matrices (in NHWC, transposed views), and each layout has its own im2col and col2im.
// Special cases skip parts of this: a 1x1 convolution's input is its own column matrix (no
// im2col; and with one group, in NHWC one GEMM over the batch: pointwise_nhwc.h); a depthwise one
// (one input channel per group, whose GEMMs would be a few rows thin) goes to direct device
// kernels (no im2col, no GEMM, no workspace), in either layout; and so do, in NHWC, the forward
// and the grad-weight of a convolution whose groups are narrow (layout.h,
// has_direct_grouped_kernel), and its stride-1 grad-input, itself such a convolution.
// The GEMMs run in gemm_dtype(): the operands' dtype, or float32 for float16 and bfloat16 on a CPU
// that would emulate half-precision GEMMs; the column matrices and staging are then float32.
// How the work is cut (chunks, lanes, partial sums, the workspace) is in plan.h, and how each GEMM
// is run so that its bits do not depend on the thread count is in gemm.h.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "conv2d.h"
#include "gemm.h"
#include "layout.h"
#include "matrices.h"
#include "plan.h"
#include "pointwise_nhwc.h"

namespace torch_convbp {
namespace {

// The part of an [N, C, H', W'] tensor that a chunk covers: [images, C, rows, W'].
Tensor chunk_of(const Tensor& t, const Chunk& c) {
  return t.narrow(0, c.image, c.images).narrow(2, c.row, c.rows);
}

// The device kernels im2col and col2im share one signature: (source, geometry, chunk, target).
using ColumnKernel = void(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef,
                          int64_t, int64_t, const Tensor&);

// A device kernel's operator handle (looked up once by each caller's static, not per chunk).
template <class Signature>
c10::TypedOperatorHandle<Signature> kernel_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// im2col(images -> columns) of a chunk, or col2im(columns -> images), in `layout`: the
// operators of that layout, given the column matrix in the form they take.
void im2col(Layout layout, const Tensor& images, const ConvShape& s, const Chunk& c,
            const Tensor& column_matrix) {
  static const auto nchw = kernel_handle<ColumnKernel>("torch_convbp::im2col");
  static const auto nhwc = kernel_handle<ColumnKernel>("torch_convbp::im2col_nhwc");
  (layout == Layout::nhwc ? nhwc : nchw)
      .call(images, {s.kernel_h, s.kernel_w}, {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w},
            {s.dilation_h, s.dilation_w}, c.row, c.rows,
            column_kernel_operand(column_matrix, layout));
}

void col2im(Layout layout, const Tensor& column_matrix, const ConvShape& s, const Chunk& c,
            const Tensor& images) {
  static const auto nchw = kernel_handle<ColumnKernel>("torch_convbp::col2im");
  static const auto nhwc = kernel_handle<ColumnKernel>("torch_convbp::col2im_nhwc");
  (layout == Layout::nhwc ? nhwc : nchw)
      .call(column_kernel_operand(column_matrix, layout), {s.kernel_h, s.kernel_w},
            {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w}, {s.dilation_h, s.dilation_w}, c.row,
            c.rows, images);
}

// The depthwise kernels share one signature too: (operand, operand, geometry, result), and
// write their result whole.
using DepthwiseKernel = void(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef,
                             const Tensor&);

enum class DepthwiseOp { forward, input_grad, weight_grad };

void call_depthwise_kernel(DepthwiseOp which, const Tensor& a, const Tensor& b, const ConvShape& s,
                           const Tensor& result) {
  static const auto forward = kernel_handle<DepthwiseKernel>("torch_convbp::depthwise_conv2d");
  static const auto input_grad =
      kernel_handle<DepthwiseKernel>("torch_convbp::depthwise_input_grad");
  static const auto weight_grad =
      kernel_handle<DepthwiseKernel>("torch_convbp::depthwise_weight_grad");
  const auto& kernel = which == DepthwiseOp::forward      ? forward
                       : which == DepthwiseOp::input_grad ? input_grad
                                                          : weight_grad;
  kernel.call(a, b, {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w}, {s.dilation_h, s.dilation_w},
              result);
}

// The direct grouped kernels (narrow groups, NHWC activations), which write their result whole:
// the forward, output = the convolution of x with the contiguous weight [Cout, Cin/G, kh, kw];
// and the weight gradient, grad_weight (contiguous) from x and dy.
enum class GroupedOp { forward, weight_grad };

void call_grouped_kernel(GroupedOp which, const Tensor& a, const Tensor& b, const ConvShape& s,
                         const Tensor& result) {
  using GroupedKernel = void(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef,
                             int64_t, const Tensor&);
  static const auto forward = kernel_handle<GroupedKernel>("torch_convbp::grouped_conv2d");
  static const auto weight_grad = kernel_handle<GroupedKernel>("torch_convbp::grouped_weight_grad");
  (which == GroupedOp::forward ? forward : weight_grad)
      .call(a, b, {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w}, {s.dilation_h, s.dilation_w},
            s.groups, result);
}

// The [G, Cin/G*kh*kw, P] column matrix of a chunk of x. A 1x1, stride-1, unpadded
// convolution's input is its own column matrix: a view, no im2col, when memory allows.
Tensor columns_of(const Tensor& x, const ConvShape& s, const Chunk& c, Layout layout,
                  Workspace& ws) {
  if (s.is_pointwise()) {
    if (auto view = group_matrix_view(chunk_of(x, c), s.groups, ws.dtype(), layout)) return *view;
  }
  Tensor columns = ws.columns(c.images * c.rows * s.out_width);
  im2col(layout, x.narrow(0, c.image, c.images), s, c, columns);
  return columns;
}

void check_grad_output(const char* op, const Tensor& grad_output, const ConvShape& s) {
  const std::vector<int64_t> expected{s.batch, s.out_channels, s.out_height, s.out_width};
  TORCH_CHECK(grad_output.sizes() == IntArrayRef(expected), op, ": expected grad_output of size ",
              IntArrayRef(expected), " (the convolution's output), got ", grad_output.sizes());
}

// A pointwise convolution with one group, computed in the GEMMs' dtype: every image is its own
// column matrix, so the whole batch is one batched GEMM, with the weight broadcast over the images
// (a batch stride of 0). No im2col, no staging copies, no workspace, where chunks of several images
// would be copied into a column matrix and their outputs copied back (benchmarks/NOTES.md §16).
// The blocks (gemm.h) are of whole images, each one GEMM, so the bits do not depend on the thread
// count either.
bool takes_pointwise_by_images(const Tensor& x, const Tensor& w, const ConvShape& s,
                               Layout layout) {
  return layout == Layout::nchw && s.is_pointwise() && s.groups == 1 &&
         x.scalar_type() == w.scalar_type();
}

// [N, Cout, H*W] = [N (broadcast), Cout, Cin] @ [N, Cin, H*W]
void forward_pointwise_by_images(const Tensor& x, const Tensor& w, const ConvShape& s,
                                 const Tensor& output) {
  if (s.batch == 0) return;
  const Tensor y = output.view({s.batch, s.out_channels, s.height * s.width});
  gemm_out(y, w.expand({s.batch, s.out_channels, s.in_channels}),
           x.view({s.batch, s.in_channels, s.height * s.width}),
           gemm_blocks(/*units=*/1, y.sizes(), x.device()));
}

// output = W @ im2col(x), chunk by chunk, for the G weight matrices w [G, Cout/G, Cin/G*kh*kw]
// (in the GEMMs' dtype, and K in the layout's order); x and output in `layout`. Every chunk
// writes its own part of the output: each is a unit.
void forward_by_chunks(const Tensor& x, const Tensor& w, const ConvShape& s, Layout layout,
                       const Tensor& output) {
  if (takes_pointwise_by_images(x, w, s, layout)) {
    return forward_pointwise_by_images(x, w, s, output);
  }
  const auto workspace = w.options();
  const Plan plan = plan_chunks(s, workspace);
  const int64_t blocks = gemm_blocks(
      plan.chunks(), {s.groups, s.out_channels / s.groups, plan.images * plan.rows * s.out_width},
      x.device());
  run_units(s, plan, plan.chunks(), workspace, layout, [&](int64_t index, Workspace& ws) {
    const Chunk c = plan.chunk(s, index);
    const Tensor columns = columns_of(x, s, c, layout, ws);  // [G, Cin/G*kh*kw, P]
    const Tensor out = chunk_of(output, c);                  // [n, Cout, h, OW]
    if (auto out_view = group_matrix_view(out, s.groups, ws.dtype(), layout)) {
      // [G, Cout/G, P] = [G, Cout/G, Cin/G*kh*kw] @ columns
      gemm_out(*out_view, w, columns, blocks);
    } else {
      const Tensor staged = ws.staging(out.sizes());
      gemm_out(*group_matrix_view(staged, s.groups, ws.dtype(), layout), w, columns, blocks);
      out.copy_(staged);
    }
  });
}

// The grad-input of a stride-1 convolution is itself a stride-1 convolution: of dY, padded by
// dilation*(k-1) - padding on each side, with the weight rotated by 180° and the input and
// output channels of each group swapped (docs/backprop.md). Computed that way, it is im2col and
// a GEMM that writes dx directly, in place of a GEMM and col2im's sum into a zeroed dx: 0.88-1.0x
// the time on the 3x3 layers (benchmarks/NOTES.md). Returns that convolution's shape, or nothing
// where the padding is wider than the kernel's reach (it would need a negative padding) or the
// stride is not 1 (it would need dY dilated with zeros).
std::optional<ConvShape> input_grad_convolution(const ConvShape& s) {
  const int64_t pad_h = s.dilation_h * (s.kernel_h - 1) - s.pad_h;
  const int64_t pad_w = s.dilation_w * (s.kernel_w - 1) - s.pad_w;
  if (s.stride_h != 1 || s.stride_w != 1 || pad_h < 0 || pad_w < 0) return std::nullopt;
  ConvShape t = s;
  std::swap(t.in_channels, t.out_channels);
  std::swap(t.height, t.out_height);
  std::swap(t.width, t.out_width);
  t.pad_h = pad_h;
  t.pad_w = pad_w;
  return t;
}

// The weight [Cout, Cin/G, kh, kw] of that convolution: [Cin, Cout/G, kh, kw], each group's
// channels swapped and each kernel rotated by 180°, written once in `layout`'s memory order so
// that weight_matrices takes it without another copy (flip itself always copies).
Tensor flipped_transposed_weight(const Tensor& weight, const ConvShape& s, Layout layout) {
  const int64_t g = s.groups, in = s.in_channels / g, out = s.out_channels / g;
  Tensor flipped = at::empty({s.in_channels, out, s.kernel_h, s.kernel_w},
                             weight.options().memory_format(memory_format(layout)));
  flipped.view({g, in, out, s.kernel_h, s.kernel_w})
      .copy_(weight.view({g, out, in, s.kernel_h, s.kernel_w}).transpose(1, 2).flip({3, 4}));
  return flipped;
}

}  // namespace

// The dtype the GEMMs run in: the operands' own, except for float16 and bfloat16 on a CPU
// without instructions for them, where ATen emulates those GEMMs at a few percent of float32's
// speed (benchmarks/NOTES.md, section 6). There im2col builds the column matrices in float32
// (converting as it copies), the GEMMs run in float32, and each result is rounded once, as it is
// written out: as accurate as a native GEMM that accumulates in float32, and tens of times
// faster. TORCH_CONVBP_HALF_GEMM=native or =float32 forces one or the other (auto: this rule).
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device) {
  if (dtype != at::kHalf && dtype != at::kBFloat16) return dtype;
  const char* forced = std::getenv("TORCH_CONVBP_HALF_GEMM");
  const std::string_view choice = forced ? forced : "auto";
  TORCH_CHECK(choice == "auto" || choice == "native" || choice == "float32",
              "torch_convbp: TORCH_CONVBP_HALF_GEMM must be auto, native or float32, got '", choice,
              "'");
  if (choice == "auto") {
    return device.is_cpu() && !cpu_has_native_half_gemm(dtype) ? at::kFloat : dtype;
  }
  return choice == "float32" ? at::kFloat : dtype;
}

Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                      int64_t groups) {
  constexpr const char* op = "torch_convbp.conv2d";
  if (bias) {
    check_operands(op, {{"input", &input}, {"weight", &weight}, {"bias", &*bias}});
  } else {
    check_operands(op, {{"input", &input}, {"weight", &weight}});
  }
  const ConvShape s =
      check_conv2d(op, input.sizes(), weight.sizes(), stride, padding, dilation, groups);
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == s.out_channels), op,
              ": expected bias of size [", s.out_channels, "] (one per output channel), got ",
              bias->sizes());

  Tensor output;
  if (takes_pointwise_nhwc(s, {&input})) {
    output = pointwise_nhwc_forward(input, weight, s);
  } else {
    const bool grouped = has_direct_grouped_kernel(s);
    const Layout layout = operator_layout(s, {&input}, s.is_depthwise() || grouped);
    const Tensor x = in_layout(input, layout);
    output = empty_in_layout({s.batch, s.out_channels, s.out_height, s.out_width}, x, layout);
    if (s.is_depthwise()) {
      call_depthwise_kernel(DepthwiseOp::forward, x, weight.contiguous(), s, output);
    } else if (grouped && layout == Layout::nhwc) {
      call_grouped_kernel(GroupedOp::forward, x, weight.contiguous(), s, output);
    } else {
      const auto compute = gemm_dtype(x.scalar_type(), x.device());
      forward_by_chunks(x, weight_matrices(weight, s, layout).to(compute), s, layout, output);
    }
  }
  if (bias) output.add_(bias->view({1, s.out_channels, 1, 1}));
  return output;
}

Tensor conv2d_weight_grad(const Tensor& input, const Tensor& grad_output, IntArrayRef weight_size,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t groups) {
  constexpr const char* op = "torch_convbp.conv2d_weight_grad";
  check_operands(op, {{"input", &input}, {"grad_output", &grad_output}});
  const ConvShape s =
      check_conv2d(op, input.sizes(), weight_size, stride, padding, dilation, groups);
  check_grad_output(op, grad_output, s);
  if (takes_pointwise_nhwc(s, {&input, &grad_output})) {
    return pointwise_nhwc_weight_grad(input, grad_output, weight_size, s);
  }
  const bool grouped = has_direct_grouped_kernel(s);
  const Layout layout = operator_layout(s, {&input, &grad_output}, s.is_depthwise() || grouped);
  const Tensor x = in_layout(input, layout);
  const Tensor dy = in_layout(grad_output, layout);
  if (s.is_depthwise()) {
    Tensor grad_weight = at::empty(weight_size, x.options());
    call_depthwise_kernel(DepthwiseOp::weight_grad, x, dy, s, grad_weight);
    return grad_weight;
  }
  if (grouped && layout == Layout::nhwc) {
    Tensor grad_weight = at::empty(weight_size, x.options());
    call_grouped_kernel(GroupedOp::weight_grad, x, dy, s, grad_weight);
    return grad_weight;
  }
  if (s.batch == 0) return at::zeros(weight_size, x.options());
  // The chunks are dealt in contiguous runs to a fixed number of partial sums (a unit each),
  // which sum their chunks in order, in float32 for float16 and bfloat16; the partial sums are
  // then added in order. Nothing here depends on the thread count.
  const auto acc_dtype = at::toOpMathType(x.scalar_type());
  const auto workspace = x.options().dtype(gemm_dtype(x.scalar_type(), x.device()));
  const Plan plan = plan_chunks(s, workspace, /*pixels_contracted=*/true);
  const int64_t sums = partial_sums(plan, workspace);
  const int64_t blocks = gemm_blocks(
      sums, {s.groups, s.out_channels / s.groups, s.column_rows() / s.groups}, x.device());
  std::vector<Tensor> partial(sums);
  run_units(s, plan, sums, workspace, layout, [&](int64_t sum, Workspace& ws) {
    partial[sum] = at::empty({s.groups, s.out_channels / s.groups, s.column_rows() / s.groups},
                             x.options().dtype(acc_dtype));
    const int64_t first = sum * plan.chunks() / sums, end = (sum + 1) * plan.chunks() / sums;
    for (int64_t index = first; index < end; ++index) {
      const Chunk c = plan.chunk(s, index);
      const Tensor columns = columns_of(x, s, c, layout, ws);  // [G, Cin/G*kh*kw, P]
      const Tensor dy_g = ws.group_matrix(chunk_of(dy, c));    // [G, Cout/G, P]
      // [G, Cout/G, Cin/G*kh*kw] (+)= [G, Cout/G, P] @ [G, P, Cin/G*kh*kw] (a GEMM flag, no copy)
      const Tensor columns_t = columns.transpose(1, 2);
      if (index != first) {
        gemm_accumulate(partial[sum], dy_g, columns_t, blocks);
      } else if (sums == 1) {  // on the CPU, the only chunk: its GEMM is cut along P if narrow
        gemm_out_contracting(partial[sum], dy_g, columns_t);
      } else {
        gemm_out(partial[sum], dy_g, columns_t, blocks);
      }
    }
  });
  for (int64_t sum = 1; sum < sums; ++sum) partial[0].add_(partial[sum]);
  return weight_of_matrices(partial[0], weight_size, x.scalar_type(), layout);
}

Tensor conv2d_input_grad(const Tensor& grad_output, const Tensor& weight, IntArrayRef input_size,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t groups) {
  constexpr const char* op = "torch_convbp.conv2d_input_grad";
  check_operands(op, {{"grad_output", &grad_output}, {"weight", &weight}});
  const ConvShape s =
      check_conv2d(op, input_size, weight.sizes(), stride, padding, dilation, groups);
  check_grad_output(op, grad_output, s);
  if (takes_pointwise_nhwc(s, {&grad_output})) {
    return pointwise_nhwc_input_grad(grad_output, weight, s);
  }
  const std::optional<ConvShape> transposed = input_grad_convolution(s);
  const bool grouped = transposed && has_direct_grouped_kernel(*transposed);
  const Layout layout = operator_layout(s, {&grad_output}, s.is_depthwise() || grouped);
  const Tensor dy = in_layout(grad_output, layout);
  if (s.is_depthwise()) {
    Tensor grad_input = empty_in_layout(input_size, dy, layout);
    call_depthwise_kernel(DepthwiseOp::input_grad, dy, weight.contiguous(), s, grad_input);
    return grad_input;
  }

  if (grouped && layout == Layout::nhwc) {
    Tensor grad_input = empty_in_layout(input_size, dy, layout);
    call_grouped_kernel(GroupedOp::forward, dy, flipped_transposed_weight(weight, s, Layout::nchw),
                        *transposed, grad_input);
    return grad_input;
  }
  const auto compute = gemm_dtype(dy.scalar_type(), dy.device());
  if (transposed) {
    Tensor grad_input = empty_in_layout(input_size, dy, layout);
    const Tensor w_flipped = flipped_transposed_weight(weight, s, layout);  // [Cin, Cout/G, kh, kw]
    forward_by_chunks(dy, weight_matrices(w_flipped, *transposed, layout).to(compute), *transposed,
                      layout, grad_input);
    return grad_input;
  }
  // [G, Cin/G*kh*kw, Cout/G], in the GEMMs' dtype
  const Tensor w_t = weight_matrices(weight, s, layout).to(compute).transpose(1, 2);
  Tensor grad_input = empty_in_layout(input_size, dy, layout).zero_();
  const auto workspace = w_t.options();
  const Plan plan = plan_chunks(s, workspace);
  // The row bands of one image overlap in dx (col2im adds into it), so a unit is an image
  // chunk with all its bands, in order.
  const int64_t blocks = gemm_blocks(
      plan.image_chunks,
      {s.groups, s.column_rows() / s.groups, plan.images * plan.rows * s.out_width}, dy.device());
  run_units(s, plan, plan.image_chunks, workspace, layout, [&](int64_t image_chunk, Workspace& ws) {
    for (int64_t band = 0; band < plan.bands; ++band) {
      const Chunk c = plan.chunk(s, image_chunk * plan.bands + band);
      const Tensor dy_g = ws.group_matrix(chunk_of(dy, c));  // [G, Cout/G, P]
      // [G, Cin/G*kh*kw, P] = [G, Cin/G*kh*kw, Cout/G] @ [G, Cout/G, P], then summed into dx.
      const Tensor grad_columns = ws.columns(c.images * c.rows * s.out_width);
      gemm_out(grad_columns, w_t, dy_g, blocks);
      col2im(layout, grad_columns, s, c, grad_input.narrow(0, c.image, c.images));
    }
  });
  return grad_input;
}

}  // namespace torch_convbp
