// The orchestration of torch_convbp, written once for every device and layout: each operator
// checks its arguments, asks route.h how to compute the call, and runs that route.
//
// For one group g of G, with col = im2col(x) the [Cin/G*kh*kw, P] column matrix of P output
// pixels (a chunk of images side by side), W_g the [Cout/G, Cin/G*kh*kw] weight matrix and
// dY_g the [Cout/G, P] output gradient, the column routes compute
//   forward       Y_g   = W_g  @ col                  [Cout/G, P]
//   grad-weight   dW_g += dY_g @ col^T                [Cout/G, Cin/G*kh*kw], summed over chunks
//   grad-input    dcol  = W_g^T @ dY_g,  dx = col2im(dcol)
//                 or, for stride 1, dx = the forward convolution of dY with W rotated by 180°
//                 and transposed (im2col of dY, a GEMM straight into dx; no col2im)
// The G groups are the batch dimension of one bmm. The batch is processed in chunks whose
// buffers fit the workspace limit (plan.h); the device is reached only through the kernels of
// device_kernels.h, and the GEMMs go through gemm.h. matrices.h sees each layout's tensors as
// these matrices (in NHWC, transposed views), so each GEMM is written once for both layouts.
// The other routes (route.h) skip parts of this: the pointwise ones im2col, the direct ones
// (depthwise, narrow groups) the GEMMs too.
//
// Every operator returns its activation result in result_format() (route.h), and the weight
// gradient in weight_grad_format(), whatever layout its route computed in.
#include "conv2d.h"

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "checks.h"
#include "device_kernels.h"
#include "gemm.h"
#include "gemm_choice.h"
#include "layout.h"
#include "matrices.h"
#include "plan.h"
#include "pointwise_nhwc.h"
#include "route.h"
#include "volume_planes.h"

namespace torch_convbp {
namespace {

// An activation [N, C, H, W], or [N, C, D, H, W] seen as [N, C, D*H, W]: its depth slices and rows
// counted together as rows, a view in either layout (shape.h).
Tensor rows_view(const Tensor& t) { return t.dim() == 5 ? t.flatten(2, 3) : t; }

// The part of an activation that a chunk covers: [images, C, rows, W'] of its rows_view.
Tensor chunk_of(const Tensor& t, const Chunk& c) {
  return part_of(part_of(rows_view(t), 0, c.image, c.images), 2, c.row, c.rows);
}

// im2col of a chunk of `images` into its column matrix, or col2im of a column matrix back into
// the chunk's images.
void im2col(Layout layout, const Tensor& images, const ConvShape& s, const Chunk& c,
            const Tensor& column_matrix) {
  call_im2col(layout, part_of(images, 0, c.image, c.images), s, c.row, c.rows,
              column_kernel_operand(column_matrix, layout));
}

void col2im(Layout layout, const Tensor& column_matrix, const ConvShape& s, const Chunk& c,
            const Tensor& images) {
  call_col2im(layout, column_kernel_operand(column_matrix, layout), s, c.row, c.rows,
              part_of(images, 0, c.image, c.images));
}

// The [G, Cin/G*kd*kh*kw, P] column matrix of a chunk of x. A 1x1, stride-1, unpadded
// convolution's input is its own column matrix: a view, no im2col, when memory allows.
Tensor columns_of(const Tensor& x, const ConvShape& s, const Chunk& c, Layout layout,
                  Workspace& ws) {
  if (s.is_pointwise()) {
    if (auto view = group_matrix_view(chunk_of(x, c), s.groups, ws.dtype(), layout)) return *view;
  }
  Tensor columns = ws.columns(c.images * c.rows * s.out_width);
  im2col(layout, x, s, c, columns);
  return columns;
}

// Route pointwise_by_images: every image is its own column matrix, so the whole batch is one
// batched GEMM, with the weight broadcast over the images (a batch stride of 0). No im2col, no
// staging, no workspace (benchmarks/NOTES.md, section 16). The blocks (gemm.h) are of whole
// images, each one GEMM, so the bits do not depend on the thread count. `float32`: the engine of
// float32 GEMMs (gemm_choice.h).
// [N, Cout, (D*)H*W] = [N (broadcast), Cout, Cin] @ [N, Cin, (D*)H*W]
void forward_pointwise_by_images(const Tensor& x, const Tensor& w, const ConvShape& s,
                                 const Tensor& output, Float32Gemms float32) {
  if (s.batch == 0) return;
  const int64_t pixels = s.input_rows() * s.width;
  const Tensor y = output.view({s.batch, s.out_channels, pixels});
  gemm_out(y, w.expand({s.batch, s.out_channels, s.in_channels}),
           x.view({s.batch, s.in_channels, pixels}),
           gemm_blocks(/*units=*/1, y.sizes(), x.device()), float32);
}

// The engine of the pointwise input gradient's GEMMs fed NCHW, dX [Cin, P] = W^T [Cin, Cout] @
// dY [Cout, P] per image. On planes of at most kMaxMicrokernelPointwisePlane pixels (7x7, 8x8)
// MKL ran that product of a transposed weight at 1.3-1.5x ATen's time, and the micro-kernel
// driver, which computes it as dX^T [P, Cin] = dY^T @ W (Cin the wide side), at 0.76-0.85x MKL's;
// on 14x14 planes 0.9-1.08x, and on larger ones 1.0-1.2x (benchmarks/NOTES.md, section 122). The
// forward's product, W [Cout, Cin] @ X [Cin, P], it did not run faster (1.0-1.25x). On an AVX2
// Zen 3 both products of planes of 196 pixels ran at 1.1-1.66x MKL's time on the micro-kernel,
// narrow as their results are (section 124): larger planes keep MKL there too.
constexpr int64_t kMaxMicrokernelPointwisePlane = 64;
Float32Gemms pointwise_input_grad_gemms(const ConvShape& s) {
  return s.input_rows() * s.width <= kMaxMicrokernelPointwisePlane
             ? Float32Gemms::microkernel_on_avx512
             : Float32Gemms::cpu_rule_not_by_width;
}

// The sum over the first dimension of t [n, ...], in a fixed order: the last half added into the
// first until two slices are left (the slice between the halves of an odd count waits for the
// next round), then those two into a new tensor; ceil(log2 n) additions, each one launch on a
// GPU. Overwrites t; the result is t's only slice where n is 1, else memory of its own.
Tensor sum_in_halves(const Tensor& t) {
  int64_t n = t.size(0);
  for (; n > 2; n -= n / 2) {
    t.narrow(0, 0, n / 2).add_(t.narrow(0, n - n / 2, n / 2));
  }
  return n == 1 ? t.select(0, 0) : at::add(t.select(0, 0), t.select(0, 1));
}

// Route pointwise_by_images (weight grad): every image's product in one batched GEMM whose
// operands are views of the tensors (no im2col, no staging copies), then the products summed in
// halves, in an order fixed by the batch size (benchmarks/NOTES.md, section 33). The products
// take N weights' memory, which the route's rule bounds (route.cpp).
// [N, Cout, Cin] = [N, Cout, (D*)H*W] @ [N, (D*)H*W, Cin], then summed over N
Tensor weight_grad_pointwise_by_images(const Tensor& x, const Tensor& dy, IntArrayRef weight_size,
                                       const ConvShape& s) {
  if (s.batch == 0) return at::zeros(weight_size, x.options());
  const int64_t pixels = s.input_rows() * s.width;
  const Tensor products = at::empty({s.batch, s.out_channels, s.in_channels}, x.options());
  const CountedScratch counted(products);
  gemm_out(products, dy.view({s.batch, s.out_channels, pixels}),
           x.view({s.batch, s.in_channels, pixels}).transpose(1, 2),
           gemm_blocks(/*units=*/1, products.sizes(), x.device()));
  return sum_in_halves(products).view(weight_size);
}

// Route columns (forward) and transposed_columns: output = W @ im2col(x), chunk by chunk, for the
// G weight matrices w [G, Cout/G, Cin/G*kh*kw] (in the GEMMs' dtype, and K in the layout's
// order); x and output in `layout`. Every chunk writes its own part of the output: each is a unit.
void forward_by_chunks(const Tensor& x, const Tensor& w, const ConvShape& s, Layout layout,
                       const Tensor& output) {
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

// The engine of the column route's weight-gradient GEMMs, dW [Cout/G, K] = dY [Cout/G, P] @
// columns^T. Fed NCHW both operands are read along P, and where dW has few rows MKL's
// single-threaded kernels ran that form slowly: one chunk of an RGB stem (64 x 147 of 4458
// pixels) at 0.42x the rate of the same product with NHWC columns [P, K], 64 x 576 at 0.66x, 128 x
// 576 at 0.78x, level from 256 rows. The micro-kernel driver, which packs the columns' tiles as it
// goes, took the stem's weight gradient in 0.6x MKL's time and the strided 3x3 layers of up to
// 128 output channels in 0.85-0.95x; with 256 or more 1.03-1.08x, and fed channels_last (rows of
// dY and of the columns along K) 1.0-1.2x. So NCHW layers of at most kMaxMicrokernelWeightGradRows
// output channels per group take it, on a CPU that runs AVX-512 kernels (benchmarks/NOTES.md,
// section 100).
constexpr int64_t kMaxMicrokernelWeightGradRows = 128;
Float32Gemms weight_grad_gemms(const ConvShape& s, Layout layout) {
  return layout == Layout::nchw && s.out_channels / s.groups <= kMaxMicrokernelWeightGradRows
             ? Float32Gemms::microkernel_on_avx512
             : Float32Gemms::cpu_rule;
}

// Route columns (weight grad): the chunks are dealt in contiguous runs to a fixed number of
// partial sums (a unit each), which sum their chunks in order, in float32 for float16 and
// bfloat16; the partial sums are then added in order. Nothing here depends on the thread count.
Tensor weight_grad_by_chunks(const Tensor& x, const Tensor& dy, IntArrayRef weight_size,
                             const ConvShape& s, Layout layout) {
  if (s.batch == 0) return at::zeros(weight_size, x.options());
  const auto acc_dtype = at::toOpMathType(x.scalar_type());
  const auto workspace = x.options().dtype(gemm_dtype(x.scalar_type(), x.device()));
  const Plan plan = plan_chunks(s, workspace, /*pixels_contracted=*/true);
  const int64_t sums = partial_sums(plan, workspace);
  const int64_t blocks = gemm_blocks(
      sums, {s.groups, s.out_channels / s.groups, s.column_rows() / s.groups}, x.device());
  std::vector<Tensor> partial(sums);
  const Float32Gemms float32 = weight_grad_gemms(s, layout);
  run_units(s, plan, sums, workspace, layout, [&](int64_t sum, Workspace& ws) {
    const int64_t first = sum * plan.chunks() / sums, end = (sum + 1) * plan.chunks() / sums;
    for (int64_t index = first; index < end; ++index) {
      const Chunk c = plan.chunk(s, index);
      const Tensor columns = columns_of(x, s, c, layout, ws);  // [G, Cin/G*kh*kw, P]
      const Tensor dy_g = ws.group_matrix(chunk_of(dy, c));    // [G, Cout/G, P]
      // [G, Cout/G, Cin/G*kh*kw] (+)= [G, Cout/G, P] @ [G, P, Cin/G*kh*kw] (a GEMM flag, no copy)
      const Tensor columns_t = columns.transpose(1, 2);
      if (index == first) {  // the first is the result; the others are scratch, summed into it
        const Memory memory = sum == 0 ? Memory::result : Memory::scratch;
        partial[sum] = empty_gemm_result(dy_g, columns_t, acc_dtype, end - first, memory, float32);
      }
      if (index != first) {
        gemm_accumulate(partial[sum], dy_g, columns_t, blocks, float32);
      } else if (sums == 1) {  // on the CPU, the only chunk: its GEMM is cut along P if narrow
        gemm_out_contracting(partial[sum], dy_g, columns_t, float32);
      } else {
        gemm_out(partial[sum], dy_g, columns_t, blocks, float32);
      }
    }
  });
  for (int64_t sum = 1; sum < sums; ++sum) partial[0].add_(partial[sum]);
  return weight_of_matrices(partial[0], weight_size, x.scalar_type(), layout);
}

// Route columns (input grad): dcol = W^T @ dY chunk by chunk, then col2im adds dcol into a
// zeroed dx. The row bands of one image overlap in dx, so a unit is an image chunk with all its
// bands, in order. The columns are summed again, so in half precision they are float32; where
// the micro-kernel computes bfloat16, the GEMM's operands stay bfloat16 (products exact in
// float32, summed in float32 into the columns: benchmarks/NOTES.md, section 55).
void input_grad_by_col2im(const Tensor& dy, const Tensor& weight, const ConvShape& s, Layout layout,
                          const Tensor& grad_input) {
  const auto columns = gemm_dtype(dy.scalar_type(), dy.device(), GemmResult::summed_again);
  const auto operands = gemm_dtype(dy.scalar_type(), dy.device());
  // [G, Cin/G*kh*kw, Cout/G], in the GEMMs' operands' dtype
  const Tensor w_t = in_dtype(weight_matrices(weight, s, layout), operands).transpose(1, 2);
  grad_input.zero_();
  const auto workspace = w_t.options().dtype(columns);
  const Plan plan = plan_chunks(s, workspace);
  const int64_t blocks = gemm_blocks(
      plan.image_chunks,
      {s.groups, s.column_rows() / s.groups, plan.images * plan.rows * s.out_width}, dy.device());
  run_units(s, plan, plan.image_chunks, workspace, layout, [&](int64_t image_chunk, Workspace& ws) {
    for (int64_t band = 0; band < plan.bands; ++band) {
      const Chunk c = plan.chunk(s, image_chunk * plan.bands + band);
      const Tensor dy_g = ws.group_matrix(chunk_of(dy, c), operands);  // [G, Cout/G, P]
      // [G, Cin/G*kh*kw, P] = [G, Cin/G*kh*kw, Cout/G] @ [G, Cout/G, P], then summed into dx.
      const Tensor grad_columns = ws.columns(c.images * c.rows * s.out_width);
      gemm_out(grad_columns, w_t, dy_g, blocks);
      col2im(layout, grad_columns, s, c, grad_input);
    }
  });
}

// The weight [Cout, Cin/G, (kd,) kh, kw] of the input gradient's convolution
// (input_grad_convolution): [Cin, Cout/G, (kd,) kh, kw], each group's channels swapped and each
// kernel rotated by 180°, written once in `layout`'s memory order so that weight_matrices takes
// it without another copy. From a contiguous weight, one pass of the weight's transposing copy
// into that order (ATen's flip and copy were two passes, a fifth of 512@7's input gradient:
// benchmarks/NOTES.md, section 63); from a channels_last one, tap by tap, each a transposed copy
// of one tap's [Cout/G, Cin/G] matrices (the transposing copy kernel where the target's rows are
// contiguous), since ATen's flip ran at a few percent of a copy's speed on a channels_last weight
// (sections 28 and 30).
Tensor flipped_transposed_weight(const Tensor& weight, const ConvShape& s, Layout layout) {
  const int64_t g = s.groups, in = s.in_channels / g, out = s.out_channels / g;
  const std::vector<int64_t> kernel(weight.sizes().begin() + 2, weight.sizes().end());
  const auto grouped = [&](int64_t first, int64_t second) {  // [g, first, second, kernel...]
    std::vector<int64_t> size{g, first, second};
    size.insert(size.end(), kernel.begin(), kernel.end());
    return size;
  };
  std::vector<int64_t> size{s.in_channels, out};
  size.insert(size.end(), kernel.begin(), kernel.end());
  Tensor flipped = empty_in_layout(size, weight, layout, Memory::scratch);
  const auto format = weight.suggest_memory_format();
  if (format != at::MemoryFormat::ChannelsLast && format != at::MemoryFormat::ChannelsLast3d) {
    // [G, Cout/G, Cin/G, taps] into [G, Cin/G, Cout/G, taps] with the taps reversed
    call_transpose_taps(weight.contiguous().view({g, out, in, s.taps()}),
                        flipped.view({g, in, out, s.taps()}), /*reverse_taps=*/true);
    return flipped;
  }
  const Tensor source = weight.view(grouped(out, in));
  const Tensor target = flipped.view(grouped(in, out));
  const int64_t spatial = static_cast<int64_t>(kernel.size());
  for (int64_t tap = 0; tap < s.taps(); ++tap) {
    Tensor to = target, from = source;
    int64_t rest = tap;
    for (int64_t dim = spatial - 1; dim >= 0; --dim) {  // the last dimension first: the others
      const int64_t k = rest % kernel[dim];             // keep their places
      rest /= kernel[dim];
      to = to.select(3 + dim, k);
      from = from.select(3 + dim, kernel[dim] - 1 - k);
    }
    // [G, Cout/G, Cin/G] into [G, Cin/G, Cout/G]: rows of both contiguous into an NHWC target
    if (to.stride(2) == 1 && from.stride(2) == 1) {
      call_transpose_copy(from, to);
    } else {
      to.copy_(from.transpose(1, 2));
    }
  }
  return flipped;
}

// The weight as the implicit route's forward and input gradient take it: a channels_last (or
// channels_last_3d) weight as it is (they transpose it into their tap matrices from either
// layout), any other contiguous.
Tensor implicit_weight(const Tensor& weight) {
  return weight.is_contiguous(memory_format(Layout::nhwc, weight.dim())) ? weight
                                                                         : weight.contiguous();
}

// The weight as the G matrices of `layout` in the GEMMs' dtype.
Tensor gemm_weight(const Tensor& weight, const ConvShape& s, Layout layout) {
  const auto compute = gemm_dtype(weight.scalar_type(), weight.device());
  return in_dtype(weight_matrices(weight, s, layout), compute);
}

[[noreturn]] void not_this_operators_route(const char* op, const RouteChoice& route) {
  TORCH_INTERNAL_ASSERT(false, op, ": route ", route_name(route.route),
                        " is not one of its routes");
}

// The layout a route writes its activation result in: the one it computes in, but the implicit
// route writes a float32 result NCHW itself where the result's format is NCHW (its tiles
// transposed in cache), where a layout copy of the result after it took one more pass in memory
// (NOTES section 111).
Layout result_layout(const RouteChoice& route, at::MemoryFormat result, const Tensor& activation) {
  const bool nchw_result = result == at::MemoryFormat::Contiguous;
  return route.route == Route::implicit_nhwc && nchw_result &&
                 activation.scalar_type() == at::kFloat
             ? Layout::nchw
             : route.layout;
}

// Where a route's activation result lives: it is the operator's result where the route writes it
// in the result's format, else scratch, copied into the result's format at the end.
Memory route_memory(Layout written, at::MemoryFormat result, int64_t rank) {
  return memory_format(written, rank) == result ? Memory::result : Memory::scratch;
}

// A route's activation result `t` as the operator's result, in `format`: itself, or a copy in
// ATen's memory (never the scratch pool's, whose memory a caller must not hold).
Tensor as_result(const Tensor& t, at::MemoryFormat format, Memory memory) {
  Tensor result = to_memory_format(t, format);
  if (memory == Memory::scratch && result.is_alias_of(t)) return result.clone(format);
  return result;
}

// The convolution's output size: [N, Cout, (OD,) OH, OW].
std::vector<int64_t> output_size(const ConvShape& s) {
  if (s.is_planar()) return {s.batch, s.out_channels, s.out_height, s.out_width};
  return {s.batch, s.out_channels, s.out_depth, s.out_height, s.out_width};
}

// output[:, co] += bias[co], where there is a bias.
void add_bias(const Tensor& output, const std::optional<Tensor>& bias, const ConvShape& s) {
  if (!bias) return;
  std::vector<int64_t> per_channel(output.dim(), 1);
  per_channel[1] = s.out_channels;
  output.add_(bias->view(per_channel));
}

// The operators of either dimension: `op` names them in messages, `dims` (2 or 3) is theirs.
Tensor convolution_forward(const char* op, int64_t dims, const Tensor& input, const Tensor& weight,
                           const std::optional<Tensor>& bias, IntArrayRef stride,
                           IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  if (bias) {
    check_operands(op, {{"input", &input}, {"weight", &weight}, {"bias", &*bias}});
  } else {
    check_operands(op, {{"input", &input}, {"weight", &weight}});
  }
  const ConvShape s =
      check_convolution(op, dims, input.sizes(), weight.sizes(), stride, padding, dilation, groups);
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == s.out_channels), op,
              ": expected bias of size [", s.out_channels, "] (one per output channel), got ",
              bias->sizes());
  if (const std::optional<PlanarForm> form = planar_form(s, {input})) {  // the 2-D one, on views
    const PlanarArguments a = planar_arguments(*form, s);
    const Tensor y = convolution_forward(op, 2, activation_as_planes(input, *form),
                                         weight_as_planes(weight, *form), bias, a.stride, a.padding,
                                         a.dilation, groups);
    return to_memory_format(activation_as_volume(y, *form, output_size(s)),
                            result_format(input, weight));
  }

  const RouteChoice route = choose_route(Operator::forward, s, {input});
  const Tensor x = in_layout(input, route.layout);
  const at::MemoryFormat format = result_format(input, weight);  // the operands' format
  const Layout written = result_layout(route, format, input);
  const Memory memory = route_memory(written, format, input.dim());
  Tensor output = empty_in_layout(output_size(s), x, written, memory);
  switch (route.route) {
    case Route::depthwise:
      call_depthwise(DepthwiseKernel::forward, x, weight.contiguous(), s, output);
      break;
    case Route::grouped:
      call_grouped(GroupedKernel::forward, x, weight.contiguous(), s, output);
      break;
    case Route::pointwise_nhwc:
      pointwise_nhwc_forward(rows_view(x), weight, s, rows_view(output));
      break;
    case Route::implicit_nhwc:
      call_implicit(ImplicitKernel::forward, x, implicit_weight(weight), s, output);
      break;
    case Route::pointwise_by_images:
      forward_pointwise_by_images(x, gemm_weight(weight, s, route.layout), s, output,
                                  Float32Gemms::cpu_rule_not_by_width);
      break;
    case Route::columns:
      forward_by_chunks(x, gemm_weight(weight, s, route.layout), s, route.layout, output);
      break;
    case Route::transposed_columns: not_this_operators_route(op, route);
  }
  add_bias(output, bias, s);
  return as_result(output, format, memory);
}

// The weight gradient on `route`, in the memory format its route writes: the implicit route's
// kernel writes `format`, the NHWC column route channels_last, the others contiguous.
Tensor weight_grad_on_route(const char* op, const RouteChoice& route, const Tensor& input,
                            const Tensor& grad_output, IntArrayRef weight_size, const ConvShape& s,
                            at::MemoryFormat format) {
  const Tensor x = in_layout(input, route.layout);
  const Tensor dy = in_layout(grad_output, route.layout);
  switch (route.route) {
    case Route::depthwise: {
      Tensor grad_weight = at::empty(weight_size, x.options());
      call_depthwise(DepthwiseKernel::weight_grad, x, dy, s, grad_weight);
      return grad_weight;
    }
    case Route::grouped: {
      Tensor grad_weight = at::empty(weight_size, x.options());
      call_grouped(GroupedKernel::weight_grad, x, dy, s, grad_weight);
      return grad_weight;
    }
    case Route::pointwise_nhwc:
      return pointwise_nhwc_weight_grad(rows_view(x), rows_view(dy), weight_size, s);
    case Route::implicit_nhwc: {
      Tensor grad_weight = at::empty(weight_size, x.options().memory_format(format));
      call_implicit(ImplicitKernel::weight_grad, x, dy, s, grad_weight);
      return grad_weight;
    }
    case Route::columns: return weight_grad_by_chunks(x, dy, weight_size, s, route.layout);
    case Route::pointwise_by_images: return weight_grad_pointwise_by_images(x, dy, weight_size, s);
    case Route::transposed_columns: not_this_operators_route(op, route);
  }
  return Tensor();  // not reached
}

Tensor convolution_weight_grad(const char* op, int64_t dims, const Tensor& input,
                               const Tensor& grad_output, IntArrayRef weight_size,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               int64_t groups) {
  check_operands(op, {{"input", &input}, {"grad_output", &grad_output}});
  const ConvShape s =
      check_convolution(op, dims, input.sizes(), weight_size, stride, padding, dilation, groups);
  check_grad_output(op, grad_output, s);
  if (const std::optional<PlanarForm> form =
          planar_form(s, {input, grad_output})) {  // the 2-D one, on views
    const PlanarArguments a = planar_arguments(*form, s);
    const Tensor grad_weight = convolution_weight_grad(
        op, 2, activation_as_planes(input, *form), activation_as_planes(grad_output, *form),
        weight_size_as_planes(weight_size, *form), a.stride, a.padding, a.dilation, groups);
    return to_memory_format(weight_as_volume(grad_weight, weight_size), weight_grad_format(input));
  }
  const RouteChoice route = choose_route(Operator::weight_grad, s, {input, grad_output});
  // The routes of NHWC operands write channels_last weights, the others contiguous ones: a copy
  // here only where that is not the input's format (weight_grad_format, route.h).
  const at::MemoryFormat format = weight_grad_format(input);
  return to_memory_format(
      weight_grad_on_route(op, route, input, grad_output, weight_size, s, format), format);
}

Tensor convolution_input_grad(const char* op, int64_t dims, const Tensor& grad_output,
                              const Tensor& weight, IntArrayRef input_size, IntArrayRef stride,
                              IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  check_operands(op, {{"grad_output", &grad_output}, {"weight", &weight}});
  const ConvShape s =
      check_convolution(op, dims, input_size, weight.sizes(), stride, padding, dilation, groups);
  check_grad_output(op, grad_output, s);
  if (const std::optional<PlanarForm> form =
          planar_form(s, {grad_output})) {  // the 2-D one, on views
    const PlanarArguments a = planar_arguments(*form, s);
    const Tensor grad_input = convolution_input_grad(
        op, 2, activation_as_planes(grad_output, *form), weight_as_planes(weight, *form),
        size_as_planes(input_size, *form), a.stride, a.padding, a.dilation, groups);
    return to_memory_format(activation_as_volume(grad_input, *form, input_size),
                            result_format(grad_output, weight));
  }

  const RouteChoice route = choose_route(Operator::input_grad, s, {grad_output});
  const Tensor dy = in_layout(grad_output, route.layout);
  const at::MemoryFormat format = result_format(grad_output, weight);  // the operands' format
  const Layout written = result_layout(route, format, grad_output);
  const Memory memory = route_memory(written, format, grad_output.dim());
  Tensor grad_input = empty_in_layout(input_size, dy, written, memory);
  switch (route.route) {
    case Route::depthwise:
      call_depthwise(DepthwiseKernel::input_grad, dy, weight.contiguous(), s, grad_input);
      break;
    case Route::grouped:  // the stride-1 convolution of dY, whose groups are narrow
      call_grouped(GroupedKernel::forward, dy, flipped_transposed_weight(weight, s, Layout::nchw),
                   *input_grad_convolution(s), grad_input);
      break;
    case Route::pointwise_nhwc:
      pointwise_nhwc_input_grad(rows_view(dy), weight, s, rows_view(grad_input));
      break;
    case Route::implicit_nhwc:  // the stride-1 convolution of dY
      call_implicit(ImplicitKernel::input_grad, dy, implicit_weight(weight), s, grad_input);
      break;
    case Route::pointwise_by_images: {
      // A 1x1 kernel's flipped, transposed weight is W^T: the GEMM reads the weight as it is,
      // [1, Cout, Cin] as the transposed view [1, Cin, Cout], where the copy of it took a fifth
      // of 2048>512@7's input gradient (benchmarks/NOTES.md, section 122).
      const Tensor w = gemm_weight(weight, s, route.layout).transpose(1, 2);
      forward_pointwise_by_images(dy, w, *input_grad_convolution(s), grad_input,
                                  pointwise_input_grad_gemms(s));
      break;
    }
    case Route::transposed_columns: {
      const ConvShape transposed = *input_grad_convolution(s);
      // [Cin, Cout/G, kh, kw] as the matrices [G, Cin/G, Cout/G*kh*kw]
      const Tensor w =
          gemm_weight(flipped_transposed_weight(weight, s, route.layout), transposed, route.layout);
      forward_by_chunks(dy, w, transposed, route.layout, grad_input);
      break;
    }
    case Route::columns: input_grad_by_col2im(dy, weight, s, route.layout, grad_input); break;
  }
  return as_result(grad_input, format, memory);
}

}  // namespace

Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                      int64_t groups) {
  return convolution_forward("torch_convbp.conv2d", 2, input, weight, bias, stride, padding,
                             dilation, groups);
}
Tensor conv2d_input_grad(const Tensor& grad_output, const Tensor& weight, IntArrayRef input_size,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t groups) {
  return convolution_input_grad("torch_convbp.conv2d_input_grad", 2, grad_output, weight,
                                input_size, stride, padding, dilation, groups);
}
Tensor conv2d_weight_grad(const Tensor& input, const Tensor& grad_output, IntArrayRef weight_size,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t groups) {
  return convolution_weight_grad("torch_convbp.conv2d_weight_grad", 2, input, grad_output,
                                 weight_size, stride, padding, dilation, groups);
}

Tensor conv3d_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                      int64_t groups) {
  return convolution_forward("torch_convbp.conv3d", 3, input, weight, bias, stride, padding,
                             dilation, groups);
}
Tensor conv3d_input_grad(const Tensor& grad_output, const Tensor& weight, IntArrayRef input_size,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t groups) {
  return convolution_input_grad("torch_convbp.conv3d_input_grad", 3, grad_output, weight,
                                input_size, stride, padding, dilation, groups);
}
Tensor conv3d_weight_grad(const Tensor& input, const Tensor& grad_output, IntArrayRef weight_size,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t groups) {
  return convolution_weight_grad("torch_convbp.conv3d_weight_grad", 3, input, grad_output,
                                 weight_size, stride, padding, dilation, groups);
}

}  // namespace torch_convbp
