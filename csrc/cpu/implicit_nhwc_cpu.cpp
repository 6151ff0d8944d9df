// Route implicit_nhwc (route.h): a float32 or bfloat16 convolution of channels_last operands as
// GEMMs on shifted views of the input, with no column matrix (an implicit GEMM), on oneDNN's
// micro-kernel (at::native::cpublas::brgemm). Two operators: the forward convolution, and the
// input gradient: of a stride-1 convolution itself such a convolution (input_grad_convolution,
// shape.h) of dY, of a strided one the same GEMMs scattered into dX's pixels (TileProducts).
// Each of images, and of volumes, whose depth slices' rows are an image's rows (TileProducts).
// (The weight gradient: implicit_weight_grad_cpu.cpp.)
//
// For one group, the output row (n, oh) of channels [co, co + nb) is
//   Y[n, oh, :, co..] = sum over the taps (ki, kj) in order of  X_tap [OW', C/G] @ W_tap [C/G, nb]
// where X_tap is the run of input pixels that tap reads along row ih = oh*s - p + ki*d: pixel
// ow*s - p + kj*d for the output columns ow whose tap lands inside the image (OW' of them). In NHWC
// that run is a matrix with rows stride*C apart: one micro-kernel call per tap, A = the run
// (lda = stride*C), B = the tap's weights (TapMatrices: one transposing copy of the weight per
// call), C = the output row (ldc = Cout), which its first call stores and the others add into.
// The column matrix of the columns route costs a write and a read of kh*kw*C values per output
// pixel; here each input pixel is read in place (benchmarks/NOTES.md, section 26).
//
// A task computes whole tiles (a band of output rows, one group, one block of output channels),
// tap by tap in (ki, kj) order, so every output entry is summed in the same order whichever thread
// runs its tile, and whichever rows share the tile: the bits depend neither on the thread count
// nor on the tiles. Inputs of fewer than 16 channels with one group, undilated along the width
// (implicit_merges_kernel_rows, route.h: an RGB stem), whose calls of one tap would have K = C,
// take a kernel row's kw taps in one call instead, K = kw*C, in the same order. bfloat16 of one
// group and up to 128 or 256 input channels (by the CPU), undilated along the width, takes padded
// rows instead (padded_rows_cpu.cpp): kernel rows of kw taps in one call, blocks of pixels across
// rows; and so does its input gradient of a strided layer, as phase convolutions of dY.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "../cpu_features.h"
#include "../plan.h"
#include "../route.h"
#include "../scratch.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "implicit_nhwc.h"
#include "microkernel.h"
#include "padded_planes.h"
#include "padded_rows_cpu.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

// A tile's output rows: consecutive rows of the output (of one image or of several), as many as
// make at least kTilePixels output pixels, so that a tap's B matrix, loaded into L2 by the tile's
// first row, serves the others from there. Taken row by row with every tap's B in turn, the
// deep layers' weights (2.4 MB at 256@14) streamed from L3 for every row: the micro-kernel ran
// at 0.7x its rate on one B in L2 (benchmarks/NOTES.md, section 61). Fewer rows where that
// leaves under kMinTiles tiles (a deep layer at batch 1), so that a many-core CPU has them.
constexpr int64_t kTilePixels = 128;

// The products of one tile, in either direction of convolution `s`:
// - gather, the forward: result row oh of Y takes, at tap (ki, kj), input row
//   ih = oh*s - p + ki*d; its output columns ow of tap_columns(s, kj) read input columns
//   ow*stride_w + offset (A's rows stride_w pixels apart, C's rows adjacent);
// - scatter, the input gradient of a strided `s`: result row ih of dX takes, at tap (ki, kj), the
//   row oh of dY with ih = oh*s - p + ki*d (none where ih + p - ki*d is off the stride); dY's
//   columns ow of the same tap_columns(s, kj) add into dX's columns ow*stride_w + offset (A's rows
//   adjacent, C's rows stride_w pixels apart). dX's pixels that no tap reaches stay zero. This is
//   the column route's GEMM and col2im in one: each dX pixel sums its taps in (ki, kj) order as
//   they come, with no column matrix (benchmarks/NOTES.md, section 111). B is then the weight's
//   tap itself, [Cout/G, C/G]: the input gradient's tap matrices, whose taps are reversed, read
//   from the end.
// A volume [N, C, D, H, W] is the same with its depth slices' rows as an image's rows (row
// d*H + h) and its kernel rows the (depth tap, kernel row) pairs (kernel row kd*kh + ki): result
// row (od, oh) takes, at kernel row (kd, ki), source row (id, ih) where the depth and the height
// each map as above, and the taps (kd, ki, kj) come in that order, a 5-D weight's memory order.
// So a volume's every output sums its kd*kh*kw taps in one pass of its tile, where sums over the
// depth taps of 2-D convolutions passed the result once per tap (benchmarks/NOTES.md, section 136).
// The source is NHWC; the result NHWC, or, in float32, NCHW (result_nchw): each tile's sums then
// transposed into the result's planes while in cache, where a layout copy after the call was one
// more pass over the result in memory (benchmarks/NOTES.md, section 111).
struct TileProducts {
  const ConvShape& s;
  bool scatter;
  bool result_nchw = false;

  // rows per image (depth slices times rows) and kernel rows (depth taps times kernel rows)
  int64_t result_height() const { return scatter ? s.input_rows() : s.output_rows(); }
  int64_t result_width() const { return scatter ? s.width : s.out_width; }
  int64_t result_channels() const { return scatter ? s.in_channels : s.out_channels; }
  int64_t source_height() const { return scatter ? s.output_rows() : s.input_rows(); }
  int64_t source_width() const { return scatter ? s.out_width : s.width; }
  int64_t source_channels() const { return scatter ? s.out_channels : s.in_channels; }
  int64_t kernel_rows() const { return s.kernel_d * s.kernel_h; }
  int64_t b_tap(int64_t kr, int64_t kj) const {
    const int64_t tap = kr * s.kernel_w + kj;
    return scatter ? s.taps() - 1 - tap : tap;
  }
  // The source row that result row `row` (of an image) takes at kernel row kr, or -1 (none).
  int64_t source_row(int64_t row, int64_t kr) const {
    const int64_t result_rows = scatter ? s.height : s.out_height;
    const int64_t slice = source_index(row / result_rows, kr / s.kernel_h, s.stride_d, s.pad_d,
                                       s.dilation_d, scatter ? s.out_depth : s.depth);
    const int64_t plane_row = source_index(row % result_rows, kr % s.kernel_h, s.stride_h, s.pad_h,
                                           s.dilation_h, scatter ? s.out_height : s.height);
    if (slice < 0 || plane_row < 0) return -1;
    return slice * (scatter ? s.out_height : s.height) + plane_row;
  }

 private:
  // Along one dimension: the source index that result index i takes at kernel index k, or -1.
  int64_t source_index(int64_t i, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                       int64_t size) const {
    if (!scatter) {
      const int64_t in = input_index(i, stride, pad, k, dilation);
      return in >= 0 && in < size ? in : -1;
    }
    const int64_t on_stride = i + pad - k * dilation;
    if (on_stride < 0 || on_stride % stride != 0) return -1;
    return on_stride / stride < size ? on_stride / stride : -1;
  }
};

// One call's pixels along a row: `pixels` of them, the first at source_column of the source row
// and result_column of the result row, and the steps between them in pixels.
struct TapRun {
  int64_t pixels, source_column, result_column, source_step, result_step;
};
TapRun tap_run(const TileProducts& p, int64_t kj) {
  const Tap tap = tap_columns(p.s, kj);
  const int64_t pixels = tap.columns.end - tap.columns.begin;
  const int64_t strided = tap.columns.begin * p.s.stride_w + tap.offset, step = p.s.stride_w;
  return p.scatter ? TapRun{pixels, tap.columns.begin, strided, 1, step}
                   : TapRun{pixels, strided, tap.columns.begin, step, 1};
}

// Whether a tile sums in the result itself: a float32 NHWC result (else in a float32 buffer).
template <class T>
bool sums_in_place(const TileProducts& p) {
  return std::is_same_v<T, float> && !p.result_nchw;
}

// The padded source row's pixels that the kernel-row calls of a result row of `width` pixels
// read: up to the last output column's last tap.
int64_t padded_row_width(const ConvShape& s, int64_t width) {
  return (width - 1) * s.stride_w + s.kernel_w;
}

// One tile: result rows [first_row, first_row + rows) of [N * result_height] (row r is image
// r / result_height, row r % result_height), group g, result channels [co, co + count) of the
// group. Tap by tap in (ki, kj) order, each tap over all the rows: every result entry sums its
// taps in that order, whatever the tile's rows, so the rows per tile do not change the bits. The
// sums are float32: in the NHWC result rows themselves (float32), or in `sums` [rows, width,
// count], after the last tap rounded once into the rows (bfloat16) or transposed into the NCHW
// planes (float32). Where a kernel row's taps take one call (implicit_merges_kernel_rows,
// route.h), the calls read the source rows padded into `padded` (padded_source_row); a kernel
// row's call then sums its taps in (kj, c) order, as their calls one by one would.
// A gathered row's first call stores its products (0 + t is t: the same bits), its row's other
// columns zeroed first; zeroing whole rows, then adding every call, wrote an NHWC float32 result
// once more in memory (benchmarks/NOTES.md, section 120). Scattered rows are zeroed, then added to:
// a call's stride_w-apart columns leave the others to the other taps.
// `sources` [rows, kernel rows] and `first_rows` [rows]: room for the tile's source rows.
template <class T>
void tile(const T* x, const TapMatrices<T>& w, T* y, float* sums, T* padded, const T** sources,
          int64_t* first_rows, const TileProducts& p, int64_t first_row, int64_t rows, int64_t g,
          int64_t co, int64_t count) {
  const ConvShape& s = p.s;
  const int64_t width = p.result_width(), channels = p.result_channels();
  const int64_t group_k = p.source_channels() / s.groups, group_n = channels / s.groups;
  const bool in_place = sums_in_place<T>(p);
  const int64_t ldc = in_place ? channels : count;
  const auto out_row = [&](int64_t r) {
    return y + (first_row + r) * width * channels + g * group_n + co;
  };
  const auto sum_row = [&](int64_t r) {
    return in_place ? reinterpret_cast<float*>(out_row(r)) : sums + r * width * count;
  };
  // Each row's source row at each kernel row (nullptr: none reads inside the image), and the first
  // kernel row whose call writes the row's sums (kernel_rows: none), once per tile rather than per
  // call.
  const bool merged_rows = !p.scatter && implicit_merges_kernel_rows(s);
  const int64_t kernel_rows = p.kernel_rows();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = (first_row + r) / p.result_height();
    first_rows[r] = kernel_rows;
    for (int64_t kr = kernel_rows - 1; kr >= 0; --kr) {
      const int64_t source_row = p.source_row((first_row + r) % p.result_height(), kr);
      sources[r * kernel_rows + kr] =
          source_row < 0
              ? nullptr
              : x + (n * p.source_height() + source_row) * p.source_width() * p.source_channels() +
                    g * group_k;
      if (source_row >= 0) first_rows[r] = kr;
    }
  }
  const auto source_row_of = [&](int64_t r, int64_t kr) { return sources[r * kernel_rows + kr]; };
  const auto first_kernel_row = [&](int64_t r) { return first_rows[r]; };
  // The first kernel column whose tap reads inside the image's width (kernel_w: none does).
  int64_t first_kernel_column = 0;
  while (first_kernel_column < s.kernel_w && tap_run(p, first_kernel_column).pixels <= 0) {
    ++first_kernel_column;
  }
  const auto gathers_row = [&](int64_t r) {  // whether row r's first call stores
    return !p.scatter && first_kernel_row(r) < kernel_rows && first_kernel_column < s.kernel_w;
  };
  const auto zero_columns = [&](int64_t r, int64_t begin, int64_t end) {
    for (int64_t ow = begin; ow < end; ++ow) std::fill_n(sum_row(r) + ow * ldc, count, 0.f);
  };
  for (int64_t r = 0; r < rows; ++r) {  // zeros, where the calls add to them
    if (!gathers_row(r)) zero_columns(r, 0, width);
  }
  for (int64_t kr = 0; kr < kernel_rows; ++kr) {
    if (merged_rows) {
      const T* b = w.of(g, kr * s.kernel_w) + TapMatrices<T>::column(co);  // kw taps' rows
      for (int64_t r = 0; r < rows; ++r) {
        const T* x_row = source_row_of(r, kr);
        if (x_row == nullptr) continue;
        padded_source_row(x_row, s.pad_w, s.width, group_k, padded_row_width(s, width), padded);
        // [OW, nb] (+)= [OW, kw*K] @ [kw*K, nb]: A's rows overlap, stride_w pixels apart
        micro_gemm(width, count, s.kernel_w * group_k, padded, s.stride_w * group_k, b, w.ldb,
                   sum_row(r), ldc, /*add=*/kr > first_kernel_row(r));
      }
      continue;
    }
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      const TapRun run = tap_run(p, kj);
      if (run.pixels <= 0) continue;
      const T* b = w.of(g, p.b_tap(kr, kj)) + TapMatrices<T>::column(co);
      for (int64_t r = 0; r < rows; ++r) {
        const T* x_row = source_row_of(r, kr);
        if (x_row == nullptr) continue;
        const bool stores =
            gathers_row(r) && kr == first_kernel_row(r) && kj == first_kernel_column;
        if (stores) {  // the columns this call does not write
          zero_columns(r, 0, run.result_column);
          zero_columns(r, run.result_column + run.pixels, width);
        }
        // [pixels, nb] (+)= [pixels, K] @ [K, nb]
        micro_gemm(run.pixels, count, group_k, x_row + run.source_column * p.source_channels(),
                   run.source_step * p.source_channels(), b, w.ldb,
                   sum_row(r) + run.result_column * ldc, run.result_step * ldc, /*add=*/!stores);
      }
    }
  }
  if (in_place) return;
  if constexpr (std::is_same_v<T, float>) {  // NCHW: [width, count] into count planes' rows
    const int64_t plane = p.result_height() * width;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = (first_row + r) / p.result_height(),
                    h = (first_row + r) % p.result_height();
      T* first_plane = y + (n * channels + g * group_n + co) * plane + h * width;
      transpose_matrix(sum_row(r), count, first_plane, plane, width, count, sizeof(float));
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t ow = 0; ow < width; ++ow) {
        round_to_bfloat16(sum_row(r) + ow * count, count, out_row(r) + ow * channels);
      }
    }
  }
}

// Every tile of the products `p`, from x (NHWC) into y (NHWC, or NCHW: TileProducts).
template <class T>
void implicit_convolution(const Tensor& x, const TapMatrices<T>& w, const TileProducts& p,
                          const Tensor& y) {
  const int64_t group_n = p.result_channels() / p.s.groups;
  const int64_t per_tile = std::min(group_n, kMaxTileChannels);
  const int64_t blocks = (group_n + per_tile - 1) / per_tile;
  const int64_t width = p.result_width();
  const int64_t rows = p.s.batch * p.result_height(), units = p.s.groups * blocks;
  const int64_t tile_rows =
      std::max<int64_t>(1, std::min((kTilePixels + width - 1) / width, rows * units / kMinTiles));
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows, tiles = row_tiles * units;
  const T* x_data = x.const_data_ptr<T>();
  T* y_data = y.mutable_data_ptr<T>();
  // Tiles in the order (group, block, rows): consecutive tasks share a block of weights.
  const bool kernel_rows = !p.scatter && implicit_merges_kernel_rows(p.s);
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(sums_in_place<T>(p) ? 0 : tile_rows * width * per_tile);
    std::vector<T> padded(kernel_rows ? padded_row_width(p.s, width) * p.source_channels() : 0);
    std::vector<const T*> sources(tile_rows * p.kernel_rows());
    std::vector<int64_t> first_rows(tile_rows);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first_row = t % row_tiles * tile_rows, unit = t / row_tiles;
      const int64_t g = unit / blocks, co = unit % blocks * per_tile;
      tile(x_data, w, y_data, sums.data(), padded.data(), sources.data(), first_rows.data(), p,
           first_row, std::min(tile_rows, rows - first_row), g, co,
           std::min(per_tile, group_n - co));
    }
    if constexpr (!std::is_same_v<T, float>) release_microkernel(/*vnni=*/true);
  });
}

// Convolution `s` of x (NHWC) into y (NHWC, or NCHW in float32): on padded rows where that
// applies (bfloat16), else by tiles.
template <class T>
void convolution(const Tensor& x, const TapMatrices<T>& w, const ConvShape& s, const Tensor& y,
                 bool y_nchw) {
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (takes_padded_rows(s)) return padded_convolution(x, w, s, y);
  }
  implicit_convolution(x, w, TileProducts{s, /*scatter=*/false, y_nchw}, y);
}

// float32; bfloat16 where the CPU has bfloat16 arithmetic, with an even number of input channels
// per group in the computed convolution (the VNNI layout's pairs), and a channels_last result.
void check_dtype(const char* op, const Tensor& t, int64_t group_in, bool result_channels_last) {
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, op,
              ": computes float32 and bfloat16 only, got ", dtype);
  if (dtype != at::kBFloat16) return;
  TORCH_CHECK(cpu_has_bfloat16_microkernel(), op,
              ": computes bfloat16 only on a CPU with bfloat16 arithmetic (AVX512_BF16 or AMX)");
  TORCH_CHECK(group_in % 2 == 0, op,
              ": computes bfloat16 with an even number of input channels per group only (pairs of "
              "the micro-kernel's VNNI layout), got ",
              group_in);
  TORCH_CHECK(result_channels_last, op,
              ": writes bfloat16 results channels_last only (contiguous ones: float32)");
}

// The forward of images (dims 2) or volumes (dims 3).
void implicit_forward(const char* op, int64_t dims, const Tensor& input, const Tensor& weight,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                      const Tensor& output) {
  const auto [s, channels_last] = check_implicit_call(op, input, weight, output, stride, padding,
                                                      dilation, groups, Written::output, dims);
  check_dtype(op, input, s.in_channels / s.groups, channels_last);
  if (output.numel() == 0) return;
  if (input.scalar_type() == at::kFloat) {
    convolution(input, tap_matrices<float>(weight, s, /*input_grad=*/false), s, output,
                !channels_last);
  } else {
    convolution(input, tap_matrices<at::BFloat16>(weight, s, /*input_grad=*/false), s, output,
                !channels_last);
  }
}

// The input gradient of the convolution of `weight` (checked as that convolution, with
// grad_input as its input and grad_output as its output): of stride 1 with padding within the
// kernel's reach, the forward convolution of dY (input_grad_convolution); else dY's products
// scattered into dX's pixels (TileProducts).
template <class T>
void input_grad(const Tensor& grad_output, const Tensor& weight, const ConvShape& s,
                const Tensor& grad_input, bool grad_input_nchw) {
  const TapMatrices<T> w = tap_matrices<T>(weight, s, /*input_grad=*/true);
  if (const std::optional<ConvShape> transposed = input_grad_convolution(s)) {
    return convolution(grad_output, w, *transposed, grad_input, grad_input_nchw);
  }
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (takes_padded_input_grad(s)) return padded_input_grad(grad_output, w, s, grad_input);
  }
  implicit_convolution(grad_output, w, TileProducts{s, /*scatter=*/true, grad_input_nchw},
                       grad_input);
}

// The input gradient of images (dims 2) or volumes (dims 3).
void implicit_input_grad(const char* op, int64_t dims, const Tensor& grad_output,
                         const Tensor& weight, IntArrayRef stride, IntArrayRef padding,
                         IntArrayRef dilation, int64_t groups, const Tensor& grad_input) {
  const auto [s, channels_last] = check_implicit_call(
      op, grad_input, weight, grad_output, stride, padding, dilation, groups, Written::input, dims);
  check_dtype(op, grad_output, s.out_channels / s.groups, channels_last);
  if (grad_input.numel() == 0) return;
  if (grad_output.numel() == 0) {
    grad_input.zero_();
    return;
  }
  if (grad_output.scalar_type() == at::kFloat) {
    input_grad<float>(grad_output, weight, s, grad_input, !channels_last);
  } else {
    input_grad<at::BFloat16>(grad_output, weight, s, grad_input, !channels_last);
  }
}

// The operators: implicit_conv2d and implicit_conv2d_input_grad (dims 2), implicit_conv3d and
// implicit_conv3d_input_grad (dims 3).
template <int64_t dims>
void implicit_forward_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                          IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                          const Tensor& output) {
  implicit_forward(dims == 2 ? "torch_convbp.implicit_conv2d" : "torch_convbp.implicit_conv3d",
                   dims, input, weight, stride, padding, dilation, groups, output);
}

template <int64_t dims>
void implicit_input_grad_cpu(const Tensor& grad_output, const Tensor& weight, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                             const Tensor& grad_input) {
  implicit_input_grad(dims == 2 ? "torch_convbp.implicit_conv2d_input_grad"
                                : "torch_convbp.implicit_conv3d_input_grad",
                      dims, grad_output, weight, stride, padding, dilation, groups, grad_input);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("implicit_conv2d", &implicit_forward_cpu<2>);
  m.impl("implicit_conv2d_input_grad", &implicit_input_grad_cpu<2>);
  m.impl("implicit_conv3d", &implicit_forward_cpu<3>);
  m.impl("implicit_conv3d_input_grad", &implicit_input_grad_cpu<3>);
}

}  // namespace torch_convbp
