// Route implicit_nhwc (route.h): a float32 or bfloat16 convolution of channels_last operands as
// GEMMs on shifted views of the input, with no column matrix (an implicit GEMM), on oneDNN's
// micro-kernel (at::native::cpublas::brgemm). Two operators: the forward convolution, and the
// input gradient: of a stride-1 convolution itself such a convolution (input_grad_convolution,
// shape.h) of dY, of a strided one the same GEMMs scattered into dX's pixels (TileProducts).
// (The weight gradient: implicit_weight_grad_cpu.cpp.)
//
// For one group, the output row (n, oh) of channels [co, co + nb) is
//   Y[n, oh, :, co..] = sum over the taps (ki, kj) in order of  X_tap [OW', C/G] @ W_tap [C/G, nb]
// where X_tap is the run of input pixels that tap reads along row ih = oh*s - p + ki*d: pixel
// ow*s - p + kj*d for the output columns ow whose tap lands inside the image (OW' of them). In NHWC
// that run is a matrix with rows stride*C apart: one micro-kernel call per tap, A = the run
// (lda = stride*C), B = the tap's weights (TapMatrices: one transposing copy of the weight per
// call), C = the output row (ldc = Cout), which the calls add into after it is zeroed. The column
// matrix of the columns route costs a write and a read of kh*kw*C values per output pixel; here
// each input pixel is read in place (benchmarks/NOTES.md, section 26).
//
// A task computes whole tiles (a band of output rows, one group, one block of output channels),
// tap by tap in (ki, kj) order, so every output entry is summed in the same order whichever thread
// runs its tile, and whichever rows share the tile: the bits depend neither on the thread count
// nor on the tiles. Inputs of fewer than 16 channels with one group, undilated along the width
// (implicit_merges_kernel_rows, route.h: an RGB stem), whose calls of one tap would have K = C,
// take a kernel row's kw taps in one call instead, K = kw*C, in the same order. bfloat16 of stride
// 1, one group and up to 128 or 256 input channels (by the CPU) takes padded rows instead (below):
// kernel rows of kw taps in one call, blocks of pixels across rows.
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
#include "microkernel.h"
#include "padded_planes.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

// The output channels a tile takes: all of a group's, up to this many.
constexpr int64_t kMaxTileChannels = 256;

// The weights of every tap of every group as the micro-kernel's B matrices [K, N] (K = the
// computed convolution's input channels per group, N its output channels per group), laid out
// tap by tap, [G, taps, K, N], by one pass of the weight's transposing copy (transpose_taps_cpu):
// read in place from the transposed weight [G, K, taps, N], a tap's rows taps * N apart (9 or 18
// KiB in a deep layer) fell on a quarter or a half of L1's sets, and the micro-kernel ran at 0.6x
// (benchmarks/NOTES.md, section 61); as ATen's flip and copies the weight took a fifth of the
// 512@7 layer's time (section 40), and a transposing copy then a per-tap copy was one pass more
// than needed (section 63). In float32 B is row-major, its rows ldb apart; in bfloat16 it is in
// the VNNI layout the micro-kernel reads ([K/2][N][2] per tap, its rows k and k+1 interleaved
// into a pair).
template <class T>
struct TapMatrices {
  at::Tensor memory;
  int64_t group_stride, tap_stride, ldb;

  const T* of(int64_t g, int64_t tap) const {
    return memory.const_data_ptr<T>() + g * group_stride + tap * tap_stride;
  }
  // Output channel `co` of a B matrix's columns: where its column starts.
  static int64_t column(int64_t co) { return std::is_same_v<T, float> ? co : 2 * co; }
};

// The B matrices [G, taps, K, N] of a channels_last weight, whose memory is [Cout][taps][C/G]: a
// tap's [Cout/G, C/G] matrix of each group has its rows taps * C/G apart. The forward's B_tap is
// that matrix transposed (the transposing copy, the taps of a group as its batch); the input
// gradient's, for tap taps-1-t, is that matrix itself (a copy of its rows). Read in place, where a
// contiguous copy of the weight first was one more pass over it on every call (benchmarks/NOTES.md,
// section 109).
void channels_last_tap_rows(const Tensor& weight, const ConvShape& s, bool input_grad,
                            const Tensor& rows) {
  const int64_t groups = s.groups, taps = s.taps();
  const int64_t a_size = s.out_channels / groups, b_size = s.in_channels / groups;
  // the weight's memory, [Cout, kh, kw, C/G], as [G, A, taps, B]
  const Tensor memory = weight.permute({0, 2, 3, 1}).view({groups, a_size, taps, b_size});
  if (!input_grad) {  // rows[g] [taps, B, A] = the [taps, A, B] view of W_g, each tap transposed
    for (int64_t g = 0; g < groups; ++g) transpose_copy_cpu(memory[g].transpose(0, 1), rows[g]);
    return;
  }
  // rows[g, tap, a] [B] = W[g*A + a, :, taps-1-tap]: rows copied, the taps reversed
  const int64_t row_bytes = b_size * weight.element_size();
  const auto* from = static_cast<const char*>(memory.const_data_ptr());
  auto* to = static_cast<char*>(rows.mutable_data_ptr());
  at::parallel_for(0, groups * taps * a_size, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t a = i % a_size, tap = i / a_size % taps, g = i / (a_size * taps);
      std::memcpy(to + i * row_bytes, from + ((g * a_size + a) * taps + taps - 1 - tap) * row_bytes,
                  row_bytes);
    }
  });
}

// The weight [Cout, C/G, kh, kw] (contiguous or channels_last) as B matrices [G, taps, K, N]:
// K = C/G and N = Cout/G (the forward: B_tap = W_g[:, :, tap]^T), or K = Cout/G and N = C/G with
// the taps reversed (the input gradient's convolution: B_tap = W_g[:, :, taps-1-tap], each
// group's channels swapped, each kernel rotated by 180 degrees).
template <class T>
TapMatrices<T> tap_matrices(const Tensor& weight, const ConvShape& s, bool input_grad) {
  const int64_t groups = s.groups, taps = s.taps();
  const int64_t group_in = s.in_channels / groups, group_out = s.out_channels / groups;
  const int64_t k = input_grad ? group_out : group_in, n = input_grad ? group_in : group_out;
  const Tensor rows = at::empty({groups, taps, k, n}, weight.options());
  if (weight.is_contiguous()) {
    // [G, A, B, taps] = [G, Cout/G, C/G, taps] into [G, B, A, taps] views of rows: A and N the
    // same dimension in the forward, B and N in the input gradient
    const Tensor target = input_grad ? rows.permute({0, 3, 2, 1}) : rows.permute({0, 2, 3, 1});
    transpose_taps_cpu(weight.view({groups, group_out, group_in, taps}), target,
                       /*reverse_taps=*/input_grad);
  } else {
    channels_last_tap_rows(weight, s, input_grad, rows);
  }
  if constexpr (std::is_same_v<T, float>) {
    return {rows, taps * k * n, k * n, n};
  } else {
    const Tensor pairs = at::empty({groups, taps, k / 2, n * 2}, weight.options());
    const auto* from = reinterpret_cast<const uint16_t*>(rows.const_data_ptr<T>());
    auto* to = reinterpret_cast<uint16_t*>(pairs.mutable_data_ptr<T>());
    at::parallel_for(0, groups * taps * (k / 2), 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {  // pair i of rows 2i and 2i + 1 of [G * taps * K, N]
        interleave_pair_of_rows(from + 2 * i * n, from + (2 * i + 1) * n, n, to + i * n * 2);
      }
    });
    return {pairs, taps * k * n, k * n, n};
  }
}

// A tile's output rows: consecutive rows of the output (of one image or of several), as many as
// make at least kTilePixels output pixels, so that a tap's B matrix, loaded into L2 by the tile's
// first row, serves the others from there. Taken row by row with every tap's B in turn, the
// deep layers' weights (2.4 MB at 256@14) streamed from L3 for every row: the micro-kernel ran
// at 0.7x its rate on one B in L2 (benchmarks/NOTES.md, section 61). Fewer rows where that
// leaves under kMinTiles tiles (a deep layer at batch 1), so that a many-core CPU has them.
constexpr int64_t kTilePixels = 128;
constexpr int64_t kMinTiles = 16;

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
// The source is NHWC; the result NHWC, or, in float32, NCHW (result_nchw): each tile's sums then
// transposed into the result's planes while in cache, where a layout copy after the call was one
// more pass over the result in memory (benchmarks/NOTES.md, section 111).
struct TileProducts {
  const ConvShape& s;
  bool scatter;
  bool result_nchw = false;

  int64_t result_height() const { return scatter ? s.height : s.out_height; }
  int64_t result_width() const { return scatter ? s.width : s.out_width; }
  int64_t result_channels() const { return scatter ? s.in_channels : s.out_channels; }
  int64_t source_height() const { return scatter ? s.out_height : s.height; }
  int64_t source_width() const { return scatter ? s.out_width : s.width; }
  int64_t source_channels() const { return scatter ? s.out_channels : s.in_channels; }
  int64_t b_tap(int64_t ki, int64_t kj) const {
    const int64_t tap = ki * s.kernel_w + kj;
    return scatter ? s.taps() - 1 - tap : tap;
  }
  // The source row that result row `row` (of an image) takes at kernel row ki, or -1 (none).
  int64_t source_row(int64_t row, int64_t ki) const {
    if (!scatter) return input_row(s, row, ki);
    const int64_t on_stride = row + s.pad_h - ki * s.dilation_h;
    if (on_stride < 0 || on_stride % s.stride_h != 0) return -1;
    return on_stride / s.stride_h < s.out_height ? on_stride / s.stride_h : -1;
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

// Source row `row` (NHWC, `channels` per pixel) padded: the input columns [-pad_w, -pad_w +
// width) into [width, channels], zeros where they fall outside the image (the left padding, then
// the row, then zeros), as the kernel-row calls and the padded planes read it. Bits only:
// float32 and bfloat16 zeros are zero bytes, and a copy of c10::BFloat16 in a loop compiled to
// one 16-bit move per element (benchmarks/NOTES.md, section 53).
template <class T>
void padded_source_row(const T* row, const ConvShape& s, int64_t channels, int64_t width,
                       T* padded) {
  const int64_t first = std::min(s.pad_w, width);                         // padded columns before
  const int64_t inside = std::clamp<int64_t>(width - first, 0, s.width);  // the image's, after
  std::memset(padded, 0, first * channels * sizeof(T));
  std::memcpy(padded + first * channels, row, inside * channels * sizeof(T));
  std::memset(padded + (first + inside) * channels, 0,
              (width - first - inside) * channels * sizeof(T));
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
template <class T>
void tile(const T* x, const TapMatrices<T>& w, T* y, float* sums, T* padded, const TileProducts& p,
          int64_t first_row, int64_t rows, int64_t g, int64_t co, int64_t count) {
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
  const auto source_row_of = [&](int64_t r, int64_t ki) -> const T* {
    const int64_t n = (first_row + r) / p.result_height();
    const int64_t source_row = p.source_row((first_row + r) % p.result_height(), ki);
    if (source_row < 0) return nullptr;
    return x + (n * p.source_height() + source_row) * p.source_width() * p.source_channels() +
           g * group_k;
  };
  const bool kernel_rows = !p.scatter && implicit_merges_kernel_rows(s);
  // The first kernel row whose call writes row r's sums (kernel_h: none reads inside the image).
  const auto first_kernel_row = [&](int64_t r) {
    int64_t ki = 0;
    while (ki < s.kernel_h && source_row_of(r, ki) == nullptr) ++ki;
    return ki;
  };
  // The first kernel column whose tap reads inside the image's width (kernel_w: none does).
  int64_t first_kernel_column = 0;
  while (first_kernel_column < s.kernel_w && tap_run(p, first_kernel_column).pixels <= 0) {
    ++first_kernel_column;
  }
  const auto gathers_row = [&](int64_t r) {  // whether row r's first call stores
    return !p.scatter && first_kernel_row(r) < s.kernel_h && first_kernel_column < s.kernel_w;
  };
  const auto zero_columns = [&](int64_t r, int64_t begin, int64_t end) {
    for (int64_t ow = begin; ow < end; ++ow) std::fill_n(sum_row(r) + ow * ldc, count, 0.f);
  };
  for (int64_t r = 0; r < rows; ++r) {  // zeros, where the calls add to them
    if (!gathers_row(r)) zero_columns(r, 0, width);
  }
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    if (kernel_rows) {
      const T* b = w.of(g, ki * s.kernel_w) + TapMatrices<T>::column(co);  // kw taps' rows
      for (int64_t r = 0; r < rows; ++r) {
        const T* x_row = source_row_of(r, ki);
        if (x_row == nullptr) continue;
        padded_source_row(x_row, s, group_k, padded_row_width(s, width), padded);
        // [OW, nb] (+)= [OW, kw*K] @ [kw*K, nb]: A's rows overlap, stride_w pixels apart
        micro_gemm(width, count, s.kernel_w * group_k, padded, s.stride_w * group_k, b, w.ldb,
                   sum_row(r), ldc, /*add=*/ki > first_kernel_row(r));
      }
      continue;
    }
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      const TapRun run = tap_run(p, kj);
      if (run.pixels <= 0) continue;
      const T* b = w.of(g, p.b_tap(ki, kj)) + TapMatrices<T>::column(co);
      for (int64_t r = 0; r < rows; ++r) {
        const T* x_row = source_row_of(r, ki);
        if (x_row == nullptr) continue;
        const bool stores =
            gathers_row(r) && ki == first_kernel_row(r) && kj == first_kernel_column;
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
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first_row = t % row_tiles * tile_rows, unit = t / row_tiles;
      const int64_t g = unit / blocks, co = unit % blocks * per_tile;
      tile(x_data, w, y_data, sums.data(), padded.data(), p, first_row,
           std::min(tile_rows, rows - first_row), g, co, std::min(per_tile, group_n - co));
    }
    if constexpr (!std::is_same_v<T, float>) release_microkernel(/*vnni=*/true);
  });
}

// bfloat16 of one group, undilated along the width (padded rows): the input copied once into
// zero-padded planes (padded_planes.h), so that output pixel (oh, ow) is the extended pixel
// e = oh*We + ow and tap (ki, kj) reads padded pixel stride_w*e + offset(ki, kj) for every e. One
// micro-kernel call then covers a block of up to kPaddedTilePixels extended pixels across rows
// (the columns ow >= OW computed and dropped) and a whole kernel row: its kw taps' runs of C
// channels are one run of kw*C (A's rows overlap, lda = stride_w*C), and their B matrices lie one
// after another (TapMatrices). A strided layer's padded rows lie in phase planes, so that the
// rows of extended pixels stay stride_w pixels apart (padded_planes.h). On AMX a call of one row and one tap, K = C = 64, spent about half its
// time loading and storing its C tiles (about 600 GFLOP/s a core, section 57); with K = 3C and
// M = 256 the dense 3x3 forwards took 0.53-0.81x the time, the input gradients 0.45-0.79x
// (benchmarks/NOTES.md, section 70). Each output entry sums its kernel rows in order, each call's
// K in the micro-kernel's order, whatever the block: the bits depend neither on the blocks nor on
// the threads.
constexpr int64_t kPaddedTilePixels = 256;
// Kernel rows in one call up to this many input channels (K = kw*C). On AMX 256: 512@7 took 1.4x
// with K = 1536, and a dilated layer's taps one by one on the padded copy 1.5x the row tiles
// (section 70). With AVX512_BF16 and no AMX (a Zen 4 EPYC) 128: the forward and input gradient
// of 256@14 (K = 768) ran slower than on the tiles' calls of one tap (K = 256), while 64@56 and
// 5x5 64@28 still gained from padded rows (section 109).
int64_t most_merged_channels() { return cpu_has_amx_bfloat16_microkernel() ? 256 : 128; }

bool takes_padded_rows(const ConvShape& s) {
  return s.dilation_w == 1 && s.groups == 1 && s.in_channels <= most_merged_channels();
}

void padded_convolution(const Tensor& x, const TapMatrices<at::BFloat16>& w, const ConvShape& s,
                        const Tensor& y) {
  using T = at::BFloat16;
  const PaddedPlanes p(s, /*even_pixels=*/false);
  const int64_t c = s.in_channels, row = p.width * c;  // a padded row's elements
  const int64_t per_tile = std::min(s.out_channels, kMaxTileChannels);
  const int64_t out_blocks = (s.out_channels + per_tile - 1) / per_tile;
  // blocks of extended pixels per image: at most kPaddedTilePixels each, more where the batch
  // would leave under kMinTiles tiles (a deep layer at batch 1), at least 16 pixels each
  const int64_t blocks =
      std::clamp<int64_t>((kMinTiles + s.batch * out_blocks - 1) / (s.batch * out_blocks),
                          (p.pixels + kPaddedTilePixels - 1) / kPaddedTilePixels,
                          std::max<int64_t>((p.pixels + 15) / 16, 1));
  const int64_t block = (p.pixels + blocks - 1) / blocks;
  const int64_t images = padded_chunk_images(p.length * c * int64_t{sizeof(T)}, s.batch);
  const Tensor padded = empty_scratch({images * p.length * c}, x.options());
  const CountedScratch counted(padded);
  const T* x_data = x.const_data_ptr<T>();
  T* y_data = y.mutable_data_ptr<T>();
  T* pad = padded.mutable_data_ptr<T>();
  for (int64_t first = 0; first < s.batch; first += images) {
    const int64_t count = std::min(images, s.batch - first);
    at::parallel_for(0, count * p.height, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {  // padded row r % Hp of image r / Hp
        const int64_t n = r / p.height, hp = r % p.height, h = hp - s.pad_h;
        T* target = pad + (n * p.length + p.row_start(hp)) * c;
        if (h < 0 || h >= s.height) {
          std::memset(target, 0, row * sizeof(T));  // bits only, as padded_source_row
        } else {
          padded_source_row(x_data + ((first + n) * s.height + h) * s.width * c, s, c, p.width,
                            target);
        }
        if (p.ends_plane(hp)) {  // the rest of its plane
          std::memset(target + row, 0,
                      (p.phase_length - (hp / p.phases + 1) * p.width) * c * sizeof(T));
        }
      }
    });
    at::parallel_for(0, count * blocks * out_blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sums(block * per_tile);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t co = t % out_blocks * per_tile, e0 = t / out_blocks % blocks * block;
        const int64_t n = t / (out_blocks * blocks);
        const int64_t m = std::min(block, p.pixels - e0),
                      nb = std::min(per_tile, s.out_channels - co);
        if (m <= 0) continue;
        const T* image = pad + n * p.length * c;
        for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
          // [m, nb] (+)= [m, kw*C] @ [kw*C, nb]: kernel row ki's taps, A's rows overlapping
          micro_gemm(m, nb, s.kernel_w * c,
                     image + (s.stride_w * e0 + p.offset(s, ki * s.kernel_w)) * c, s.stride_w * c,
                     w.of(0, ki * s.kernel_w) + TapMatrices<T>::column(co), w.ldb, sums.data(), nb,
                     /*add=*/ki > 0);
        }
        for (int64_t i = 0; i < m; ++i) {  // the extended pixels that are output pixels
          const int64_t oh = (e0 + i) / p.extended_width, ow = (e0 + i) % p.extended_width;
          if (ow >= s.out_width) continue;
          round_to_bfloat16(
              sums.data() + i * nb, nb,
              y_data + (((first + n) * s.out_height + oh) * s.out_width + ow) * s.out_channels +
                  co);
        }
      }
      release_microkernel(/*vnni=*/true);
    });
  }
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

void implicit_conv2d_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                         IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                         const Tensor& output) {
  constexpr const char* op = "torch_convbp.implicit_conv2d";
  const auto [s, channels_last] = check_implicit_call(op, input, weight, output, stride, padding,
                                                      dilation, groups, Written::output);
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
  implicit_convolution(grad_output, w, TileProducts{s, /*scatter=*/true, grad_input_nchw},
                       grad_input);
}

void implicit_conv2d_input_grad_cpu(const Tensor& grad_output, const Tensor& weight,
                                    IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                    int64_t groups, const Tensor& grad_input) {
  constexpr const char* op = "torch_convbp.implicit_conv2d_input_grad";
  const auto [s, channels_last] = check_implicit_call(op, grad_input, weight, grad_output, stride,
                                                      padding, dilation, groups, Written::input);
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

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("implicit_conv2d", &implicit_conv2d_cpu);
  m.impl("implicit_conv2d_input_grad", &implicit_conv2d_input_grad_cpu);
}

}  // namespace torch_convbp
