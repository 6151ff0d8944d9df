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
// Two special cases skip parts of this: a 1x1 convolution's input is its own column matrix (no
// im2col), and a depthwise one (one input channel per group, whose GEMMs would be a few rows
// thin) goes to direct device kernels (no im2col, no GEMM, no workspace).
// The GEMMs run in gemm_dtype(): the operands' dtype, or float32 for float16 and bfloat16 on a CPU
// that would emulate half-precision GEMMs; the column matrices and staging are then float32.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorUtils.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "conv2d.h"

namespace torch_convbp {
namespace {

std::atomic<int64_t> g_workspace_limit{int64_t{1} << 30};  // 1 GiB; see set_workspace_limit
std::atomic<int64_t> g_workspace_in_use{0};  // bytes held by live Workspaces, all threads
std::atomic<int64_t> g_workspace_peak{0};    // the most held at once since the last reset

// How many output pixels a chunk aims at. Two pulls: a GEMM narrower than about 512 columns is
// thin (MKL and cuBLAS lose speed), and a column matrix much larger than a cache-sized tile
// (2.5 MiB: it fits the L2/L3 share of a core) is written by im2col to memory and read back by
// the GEMM, instead of staying in cache between the two. So small images are batched side by
// side up to the target, and large ones are cut into row bands of about the target (see
// benchmarks/NOTES.md for the measurements). On a GPU, whose GEMMs want to be far wider and
// whose caches are not the point, a chunk aims at 64Ki pixels (a first choice, not yet tuned on
// a GPU). TORCH_CONVBP_CHUNK_PIXELS fixes the target, for tuning.
constexpr int64_t kMinGemmWidth = 512;
constexpr int64_t kColumnTileBytes = int64_t{5} << 19;  // 2.5 MiB
int64_t target_chunk_pixels(int64_t column_bytes_per_pixel, bool cpu) {
  static const int64_t fixed = [] {
    const char* text = std::getenv("TORCH_CONVBP_CHUNK_PIXELS");
    return text ? std::max<int64_t>(0, std::atoll(text)) : int64_t{0};
  }();
  if (fixed > 0) return fixed;
  if (!cpu) return int64_t{1} << 16;
  return std::max(kMinGemmWidth, kColumnTileBytes / std::max<int64_t>(column_bytes_per_pixel, 1));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A chunk of the work: `images` whole images from `image` on and, of each, output rows
// [row, row + rows). Several images are taken only with all their rows.
struct Chunk {
  int64_t image, images, row, rows;
};

// How a call splits its batch. Chunks of whole images are dealt to `lanes` lanes, which run in
// parallel on the CPU threads (one lane elsewhere: a GPU is parallel inside each GEMM), each
// with its own workspace and single-threaded GEMMs. Lane l takes image-chunks l, l+lanes, ...:
// the split depends on the sizes and the thread count only, never on timing, so every sum
// (grad-weight's over lanes included) is taken in the same order on every run.
struct Plan {
  int64_t images, rows;  // per chunk; rows < out_height only when images == 1
  int64_t image_chunks, lanes;
};

// Chooses the chunks: about target_chunk_pixels() output pixels each (whole images side by side,
// or row bands of one image), as long as their column matrix plus staging (a column of each per
// output pixel, in the workspace's dtype) fit each lane's share of the workspace limit; one
// output row at the least, whatever the limit.
// `pixels_contracted`: the pixels are the GEMM's inner dimension (grad-weight), not its output
// width (forward, grad-input).
Plan plan_chunks(const ConvShape& s, at::TensorOptions workspace, bool pixels_contracted = false) {
  const bool cpu = workspace.device().is_cpu();
  const int64_t element_size = static_cast<int64_t>(workspace.dtype().itemsize());
  const int64_t bytes_per_pixel = (s.column_rows() + s.out_channels) * element_size;
  const int64_t max_lanes = cpu ? std::max(1, at::get_num_threads()) : 1;
  const int64_t image_pixels = s.out_height * s.out_width;
  const int64_t lane_budget =
      std::max(s.out_width, g_workspace_limit.load() / max_lanes / bytes_per_pixel);
  const int64_t batch = std::max<int64_t>(s.batch, 1);
  // A pointwise convolution takes one whole image at a time when that makes a good GEMM: then
  // its input is its column matrix and its output the GEMM's destination, with no copy at all
  // (the lanes keep the threads busy). That is when an image is wide enough, or when the pixels
  // are the GEMM's inner dimension, whose length matters little (measured: 1x1 1024>256@14,
  // grad-weight 5.5 -> 5.1 ms; its grad-input goes the other way, 5.4 -> 6.2 ms). Other
  // images are batched like any other layer's.
  const bool whole_images =
      s.is_pointwise() && (pixels_contracted || image_pixels >= kMinGemmWidth);
  const int64_t target = std::min(
      lane_budget, whole_images ? image_pixels
                                : target_chunk_pixels(s.column_rows() * element_size, cpu));
  // Row bands of one image, of about the target's width, when a whole image is over the memory
  // budget or over twice the target.
  if (image_pixels > lane_budget || image_pixels > 2 * target) {
    const int64_t bands = ceil_div(image_pixels, target);
    const int64_t rows = std::max<int64_t>(
        1, std::min(lane_budget / s.out_width, ceil_div(s.out_height, bands)));
    return Plan{1, rows, batch, std::min(max_lanes, batch)};
  }
  const int64_t wanted = ceil_div(target, image_pixels);
  int64_t images = std::clamp<int64_t>(std::min(wanted, lane_budget / image_pixels), 1, batch);
  int64_t chunks = ceil_div(batch, images);
  const int64_t lanes = std::min(max_lanes, chunks);
  if (lanes > 1) {  // as many chunks in every lane, of equal size
    chunks = ceil_div(chunks, lanes) * lanes;
    images = ceil_div(batch, chunks);
    chunks = ceil_div(batch, images);
  }
  return Plan{images, s.out_height, chunks, lanes};
}

// The part of an [N, C, H', W'] tensor that a chunk covers: [images, C, rows, W'].
Tensor chunk_of(const Tensor& t, const Chunk& c) {
  return t.narrow(0, c.image, c.images).narrow(2, c.row, c.rows);
}

// Sees a chunk [n, C, h, w] as the GEMM operand [G, C/G, n*h*w] (per group: channels by
// pixels) without copying, when its memory allows it (one image at a time) and it has the
// GEMMs' dtype.
std::optional<Tensor> group_matrix_view(const Tensor& chunk, int64_t groups,
                                        at::ScalarType dtype) {
  if (chunk.scalar_type() != dtype) return std::nullopt;
  const Tensor by_channel = chunk.transpose(0, 1);  // [C, n, h, w]
  const int64_t channels = by_channel.size(0);
  const std::vector<int64_t> shape{groups, channels / groups, by_channel.numel() / channels};
  if (!at::detail::computeStride(by_channel.sizes(), by_channel.strides(), shape)) {
    return std::nullopt;
  }
  return by_channel.view(shape);
}

// One chunk's worth of scratch memory, allocated once per call and reused by every chunk:
// the column matrix and a staging area for GEMM operands that are not views.
class Workspace {
 public:
  Workspace(const ConvShape& s, int64_t max_pixels, at::TensorOptions options)
      : shape_(s), max_pixels_(max_pixels), options_(options) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { g_workspace_in_use -= held_bytes_; }

  at::ScalarType dtype() const { return options_.dtype().toScalarType(); }

  // [G, Cin/G*kh*kw, pixels] column matrix.
  Tensor columns(int64_t pixels) {
    return take(columns_, shape_.column_rows())
        .narrow(0, 0, shape_.column_rows() * pixels)
        .view({shape_.groups, shape_.column_rows() / shape_.groups, pixels});
  }

  // A [G, channels/G, pixels] staging matrix, for GEMM operands that are not views.
  Tensor staging(int64_t channels, int64_t pixels) {
    return take(staging_, channels)
        .narrow(0, 0, channels * pixels)
        .view({shape_.groups, channels / shape_.groups, pixels});
  }

  // `chunk` [n, C, h, w] as the GEMM operand [G, C/G, n*h*w]: a view, or a copy (converted to
  // the GEMMs' dtype) in staging.
  Tensor group_matrix(const Tensor& chunk) {
    if (auto view = group_matrix_view(chunk, shape_.groups, dtype())) return *view;
    const int64_t channels = chunk.size(1);
    Tensor staged = staging(channels, chunk.numel() / channels);
    staged.view({channels, chunk.size(0), chunk.size(2), chunk.size(3)})
        .copy_(chunk.transpose(0, 1));
    return staged;
  }

 private:
  Tensor& take(Tensor& buffer, int64_t rows) {
    if (!buffer.defined()) {
      buffer = at::empty({rows * max_pixels_}, options_);
      held_bytes_ += buffer.nbytes();
      const int64_t in_use = g_workspace_in_use += buffer.nbytes();
      int64_t peak = g_workspace_peak.load();
      while (in_use > peak && !g_workspace_peak.compare_exchange_weak(peak, in_use)) {
      }
    }
    return buffer;
  }
  const ConvShape& shape_;
  int64_t max_pixels_;
  at::TensorOptions options_;
  Tensor columns_, staging_;
  int64_t held_bytes_ = 0;
};

// Runs body(chunk, workspace, lane) over the whole output, as the plan deals it.
template <class Body>
void run_chunks(const ConvShape& s, const Plan& plan, at::TensorOptions workspace, Body&& body) {
  auto run_lane = [&](int64_t lane) {
    Workspace ws(s, plan.images * plan.rows * s.out_width, workspace);
    for (int64_t chunk = lane; chunk < plan.image_chunks; chunk += plan.lanes) {
      const int64_t image = chunk * plan.images;
      if (image >= s.batch) break;
      const int64_t images = std::min(plan.images, s.batch - image);
      for (int64_t row = 0; row < s.out_height; row += plan.rows) {
        body(Chunk{image, images, row, std::min(plan.rows, s.out_height - row)}, ws, lane);
      }
    }
  };
  if (plan.lanes == 1) {  // no parallel region: the GEMMs use all threads themselves
    run_lane(0);
    return;
  }
  // The worker threads run the ATen ops as the caller would (below autograd, same modes).
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, plan.lanes, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(caller_state);
    for (int64_t lane = begin; lane < end; ++lane) run_lane(lane);
  });
}

// The device kernels im2col and col2im share one signature: (source, geometry, chunk, target).
using ColumnKernel = void(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef,
                          int64_t, int64_t, const Tensor&);

// A device kernel's operator handle (looked up once by each caller's static, not per chunk).
template <class Signature>
c10::TypedOperatorHandle<Signature> kernel_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

enum class ColumnOp { im2col, col2im };

void call_column_kernel(ColumnOp which, const Tensor& source, const ConvShape& s, const Chunk& c,
                        const Tensor& target) {
  static const auto im2col = kernel_handle<ColumnKernel>("torch_convbp::im2col");
  static const auto col2im = kernel_handle<ColumnKernel>("torch_convbp::col2im");
  (which == ColumnOp::im2col ? im2col : col2im)
      .call(source, {s.kernel_h, s.kernel_w}, {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w},
            {s.dilation_h, s.dilation_w}, c.row, c.rows, target);
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

// The [G, Cin/G*kh*kw, P] column matrix of a chunk of x. A 1x1, stride-1, unpadded
// convolution's input is its own column matrix: a view, no im2col, when memory allows.
Tensor columns_of(const Tensor& x, const ConvShape& s, const Chunk& c, Workspace& ws) {
  if (s.is_pointwise()) {
    if (auto view = group_matrix_view(chunk_of(x, c), s.groups, ws.dtype())) return *view;
  }
  Tensor columns = ws.columns(c.images * c.rows * s.out_width);
  call_column_kernel(ColumnOp::im2col, x.narrow(0, c.image, c.images), s, c, columns);
  return columns;
}

// out = a @ b for [G, M, K] @ [G, K, N]; a plain mm when there is one group.
void gemm_out(Tensor out, const Tensor& a, const Tensor& b) {
  if (a.size(0) == 1) {
    Tensor out_matrix = out.select(0, 0);
    at::mm_out(out_matrix, a.select(0, 0), b.select(0, 0));
  } else {
    at::bmm_out(out, a, b);
  }
}

// acc += a @ b, with acc in the accumulation dtype (float32 for float16 and bfloat16).
void gemm_accumulate(Tensor& acc, const Tensor& a, const Tensor& b) {
  if (acc.scalar_type() != a.scalar_type()) {
    acc.add_(at::bmm(a, b));
  } else if (a.size(0) == 1) {
    acc.select(0, 0).addmm_(a.select(0, 0), b.select(0, 0));
  } else {
    acc.baddbmm_(a, b);
  }
}

// The weight [Cout, Cin/G, kh, kw] as G matrices [Cout/G, Cin/G*kh*kw].
Tensor weight_matrices(const Tensor& weight, const ConvShape& s) {
  return weight.contiguous().view({s.groups, s.out_channels / s.groups, -1});
}

void check_grad_output(const char* op, const Tensor& grad_output, const ConvShape& s) {
  const std::vector<int64_t> expected{s.batch, s.out_channels, s.out_height, s.out_width};
  TORCH_CHECK(grad_output.sizes() == IntArrayRef(expected), op, ": expected grad_output of size ",
              IntArrayRef(expected), " (the convolution's output), got ", grad_output.sizes());
}

// output = W @ im2col(x), chunk by chunk, for the G weight matrices w [G, Cout/G, Cin/G*kh*kw]
// (in the GEMMs' dtype).
void forward_by_chunks(const Tensor& x, const Tensor& w, const ConvShape& s, const Tensor& output) {
  const auto workspace = w.options();
  const Plan plan = plan_chunks(s, workspace);
  run_chunks(s, plan, workspace, [&](const Chunk& c, Workspace& ws, int64_t) {
    const Tensor columns = columns_of(x, s, c, ws);  // [G, Cin/G*kh*kw, P]
    const Tensor out = chunk_of(output, c);          // [n, Cout, h, OW]
    if (auto out_view = group_matrix_view(out, s.groups, ws.dtype())) {
      gemm_out(*out_view, w, columns);  // [G, Cout/G, P] = [G, Cout/G, Cin/G*kh*kw] @ columns
    } else {
      const Tensor staged = ws.staging(s.out_channels, c.images * c.rows * s.out_width);
      gemm_out(staged, w, columns);
      out.transpose(0, 1).copy_(staged.view({s.out_channels, c.images, c.rows, s.out_width}));
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
// channels swapped and each kernel rotated by 180°.
Tensor flipped_transposed_weight(const Tensor& weight, const ConvShape& s) {
  const int64_t g = s.groups;
  return weight.contiguous()
      .view({g, s.out_channels / g, s.in_channels / g, s.kernel_h, s.kernel_w})
      .transpose(1, 2)
      .flip({3, 4})
      .reshape({s.in_channels, s.out_channels / g, s.kernel_h, s.kernel_w});
}

}  // namespace

void set_workspace_limit(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "torch_convbp: the workspace limit must be positive, got ", bytes);
  g_workspace_limit.store(bytes);
}

int64_t workspace_limit() { return g_workspace_limit.load(); }

int64_t workspace_peak(bool reset) {
  return reset ? g_workspace_peak.exchange(g_workspace_in_use.load()) : g_workspace_peak.load();
}

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
              "torch_convbp: TORCH_CONVBP_HALF_GEMM must be auto, native or float32, got '",
              choice, "'");
  if (choice == "auto") {
    return device.is_cpu() && !cpu_has_native_half_gemm(dtype) ? at::kFloat : dtype;
  }
  return choice == "float32" ? at::kFloat : dtype;
}

Tensor conv2d_forward(const Tensor& input, const Tensor& weight,
                      const std::optional<Tensor>& bias, IntArrayRef stride,
                      IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
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

  const Tensor x = input.contiguous();
  Tensor output = at::empty({s.batch, s.out_channels, s.out_height, s.out_width}, x.options());
  if (s.is_depthwise()) {
    call_depthwise_kernel(DepthwiseOp::forward, x, weight.contiguous(), s, output);
  } else {
    const auto compute = gemm_dtype(x.scalar_type(), x.device());
    forward_by_chunks(x, weight_matrices(weight, s).to(compute), s, output);
  }
  if (bias) output.add_(bias->view({1, s.out_channels, 1, 1}));
  return output;
}

Tensor conv2d_weight_grad(const Tensor& input, const Tensor& grad_output,
                          IntArrayRef weight_size, IntArrayRef stride, IntArrayRef padding,
                          IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "torch_convbp.conv2d_weight_grad";
  check_operands(op, {{"input", &input}, {"grad_output", &grad_output}});
  const ConvShape s =
      check_conv2d(op, input.sizes(), weight_size, stride, padding, dilation, groups);
  check_grad_output(op, grad_output, s);

  const Tensor x = input.contiguous();
  const Tensor dy = grad_output.contiguous();
  if (s.is_depthwise()) {
    Tensor grad_weight = at::empty(weight_size, x.options());
    call_depthwise_kernel(DepthwiseOp::weight_grad, x, dy, s, grad_weight);
    return grad_weight;
  }
  // Accumulate over chunks in float32 for float16 and bfloat16, in place otherwise.
  const auto acc_dtype = at::toOpMathType(x.scalar_type());
  const auto workspace = x.options().dtype(gemm_dtype(x.scalar_type(), x.device()));
  const Plan plan = plan_chunks(s, workspace, /*pixels_contracted=*/true);
  // One accumulator per lane, summed in lane order at the end.
  std::vector<Tensor> grad_w(plan.lanes);
  run_chunks(s, plan, workspace, [&](const Chunk& c, Workspace& ws, int64_t lane) {
    const Tensor columns = columns_of(x, s, c, ws);         // [G, Cin/G*kh*kw, P]
    const Tensor dy_g = ws.group_matrix(chunk_of(dy, c));  // [G, Cout/G, P]
    if (!grad_w[lane].defined()) {
      grad_w[lane] = at::zeros({s.groups, s.out_channels / s.groups, s.column_rows() / s.groups},
                               x.options().dtype(acc_dtype));
    }
    // [G, Cout/G, Cin/G*kh*kw] += [G, Cout/G, P] @ [G, P, Cin/G*kh*kw] (a GEMM flag, no copy)
    gemm_accumulate(grad_w[lane], dy_g, columns.transpose(1, 2));
  });
  Tensor total = grad_w[0].defined() ? grad_w[0] : at::zeros(weight_size, x.options().dtype(acc_dtype));
  for (int64_t lane = 1; lane < plan.lanes; ++lane) {
    if (grad_w[lane].defined()) total.add_(grad_w[lane]);
  }
  return total.view(weight_size).to(x.scalar_type());
}

Tensor conv2d_input_grad(const Tensor& grad_output, const Tensor& weight,
                         IntArrayRef input_size, IntArrayRef stride, IntArrayRef padding,
                         IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "torch_convbp.conv2d_input_grad";
  check_operands(op, {{"grad_output", &grad_output}, {"weight", &weight}});
  const ConvShape s =
      check_conv2d(op, input_size, weight.sizes(), stride, padding, dilation, groups);
  check_grad_output(op, grad_output, s);

  const Tensor dy = grad_output.contiguous();
  if (s.is_depthwise()) {
    Tensor grad_input = at::empty(input_size, dy.options());
    call_depthwise_kernel(DepthwiseOp::input_grad, dy, weight.contiguous(), s, grad_input);
    return grad_input;
  }
  const auto compute = gemm_dtype(dy.scalar_type(), dy.device());
  if (auto transposed = input_grad_convolution(s)) {
    Tensor grad_input = at::empty(input_size, dy.options());
    const Tensor w_flipped = flipped_transposed_weight(weight, s);  // [Cin, Cout/G, kh, kw]
    forward_by_chunks(dy, weight_matrices(w_flipped, *transposed).to(compute), *transposed,
                      grad_input);
    return grad_input;
  }
  // [G, Cin/G*kh*kw, Cout/G], in the GEMMs' dtype
  const Tensor w_t = weight_matrices(weight, s).to(compute).transpose(1, 2);
  Tensor grad_input = at::zeros(input_size, dy.options());
  const auto workspace = w_t.options();
  const Plan plan = plan_chunks(s, workspace);
  run_chunks(s, plan, workspace, [&](const Chunk& c, Workspace& ws, int64_t) {
    const Tensor dy_g = ws.group_matrix(chunk_of(dy, c));  // [G, Cout/G, P]
    // [G, Cin/G*kh*kw, P] = [G, Cin/G*kh*kw, Cout/G] @ [G, Cout/G, P], then summed into dx.
    const Tensor grad_columns = ws.columns(c.images * c.rows * s.out_width);
    gemm_out(grad_columns, w_t, dy_g);
    call_column_kernel(ColumnOp::col2im, grad_columns, s, c,
                       grad_input.narrow(0, c.image, c.images));
  });
  return grad_input;
}

}  // namespace torch_convbp
