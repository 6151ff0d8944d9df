// Route implicit_nhwc, the weight gradient (route.h): dW of a stride-1 convolution as GEMMs on
// shifted views of two padded copies, with no column matrix, on oneDNN's micro-kernel
// (at::native::cpublas::brgemm), of channels_last or NCHW operands (the copies read either), in
// float32, or in bfloat16 where the CPU has bfloat16 arithmetic.
//
// Pad the input with zeros into [Hp, Wp] planes and give the output gradient the same row width:
// output pixel (oh, ow) becomes the extended pixel e = oh*Wp + ow, and the columns ow >= OW hold
// zeros. Tap (ki, kj) then reads input pixel e + ki*dh*Wp + kj*dw of the padded plane for every
// e, one fixed offset, so for one group
//   dW_tap^T [C/G, Cout/G] += Xt [C/G, e0:e1 shifted by the tap's offset] @ dY_ext [e0:e1, Cout/G]
// is one micro-kernel call per block of extended pixels: A = the transposed padded input, its
// channel rows lda apart, read from the tap's offset on; B = the extended output gradient, rows
// of Cout (in bfloat16, pairs of pixels interleaved: the VNNI layout). A GEMM of K = 256 pixels
// per call, where the column route's dW = dY @ im2col(x)^T writes and reads kh*kw*C values per
// output pixel, and per output row the calls had K = OW (benchmarks/NOTES.md, sections 64, 69).
//
// Volumes the same way: their padded depth slices one after another in one plane, output pixel
// (od, oh, ow) the extended pixel (od*Hp + oh)*Wp + ow, and tap (kd, ki, kj) one more fixed offset,
// kd*dd*Hp*Wp further (padded_planes.h). The rows oh >= OH of each slice are zeros in dY_ext.
// NCDHW and channels_last_3d operands are read as they are (section 137).
//
// The zero columns of dY_ext meet input values that the convolution never pairs with them (the
// next row's first pixels, the right edge's): 0 * x, exact for finite x. A chunk whose input
// holds an infinity or a NaN takes plain loops over exactly the convolution's pairs instead, so
// that non-finite values propagate as F.conv2d's do.
//
// The sums: the extended pixels of an image are cut into `parts` equal ranges, fixed by the sizes
// (more than one where dW has too few tiles to give every thread a share). Each dW entry is a
// float32 sum over the parts in order, each part's own sum over the images in order, the part's
// pixel blocks of each in order, in the micro-kernel's order within a block. A task owns one part
// of whole (group, channel block, output channel block, tap) tiles of dW, and a thread walks its
// parts' pixel blocks once for all its tiles, so the bits depend neither on the thread count nor on
// which thread runs a task.
#include <ATen/Parallel.h>
#include <ATen/ceil_div.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "../checks.h"
#include "../cpu_features.h"
#include "../plan.h"
#include "../scratch.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "microkernel.h"
#include "padded_planes.h"
#include "transpose_copy_cpu.h"

namespace torch_convbp {
namespace {

using at::IntArrayRef;
using at::Tensor;

// Extended pixels per micro-kernel call (its K): 128 to 1024 ran within a few percent of each
// other at 64@56, 128@28 and 5x5 64@28 (benchmarks/NOTES.md, section 69).
constexpr int64_t kPixelBlock = 256;

// The channels of a tile of dW, along each side: 32 up to 64 channels per group, else 64. At
// 64@56 one 64 x 64 tile per tap left 9 tiles to 2 threads (5 and 4) and 1.1x the time of 32 x 32
// tiles; at 128@28 64 x 64 ran 0.97x 32 x 32 (section 69). bfloat16 keeps this rule, and so does
// float32 on AVX2.
int64_t channel_block(int64_t channels) {
  return channels <= 64 ? std::min<int64_t>(channels, 32) : 64;
}

// float32's where AVX-512 kernels run: output channel blocks of 64, and input channel blocks of
// 64 where that leaves at least kMinFloat32Tiles tiles, else 32. A call's C tile 32 wide (two
// vectors) took 1.1-1.2x the time of 64 (5x5 64@28: 64 x 64 tiles 0.82-0.94x 32 x 32; 3x3 64@56:
// 32 x 64 0.88x, where 64 x 64 left 9 tiles), on an AVX-512 Xeon; with oneDNN capped at AVX2 the
// 5x5 layer took 1.04x, so AVX2 keeps bfloat16's rule (benchmarks/NOTES.md, section 95).
constexpr int64_t kFloat32Block = 64;
constexpr int64_t kMinFloat32Tiles = 16;
int64_t float32_in_block(const ConvShape& s) {
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  const int64_t tiles = s.groups * at::ceil_div(group_in, kFloat32Block) *
                        at::ceil_div(group_out, kFloat32Block) * s.taps();
  return std::min(group_in, tiles >= kMinFloat32Tiles ? kFloat32Block : kFloat32Block / 2);
}

// Whether every value of these n is finite: an infinity's or a NaN's exponent bits are all ones.
// Whether any value's are, as an OR over the values' tests, which the compiler vectorizes with
// three instructions per vector even in the baseline's SSE2 (a maximum over the exponent fields
// took seven there, without an unsigned maximum), and with AVX2 where the CPU has it. It is the
// first read of each input row, before the transposing copy reads the row again from cache
// (benchmarks/NOTES.md, section 129).
template <class T>
TORCH_CONVBP_VECTOR_CLONES bool all_finite(const T* x, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
  constexpr Bits kExponent = sizeof(T) == 4 ? 0x7f800000u : 0x7f80u;
  const auto* bits = reinterpret_cast<const Bits*>(x);
  Bits non_finite = 0;
  for (int64_t i = 0; i < n; ++i) non_finite |= (bits[i] & kExponent) == kExponent;
  return non_finite == 0;
}

// Where the activations' values lie: x [N, C, H, W] and dY [N, Cout, OH, OW], both NHWC in
// memory or both NCHW; volumes' [N, C, D, H, W] seen as images of D*H rows (ConvShape's rows:
// row d*H + h).
struct Activations {
  const ConvShape& s;
  bool channels_last;
  int64_t x_at(int64_t n, int64_t c, int64_t row, int64_t w) const {
    return channels_last ? ((n * s.input_rows() + row) * s.width + w) * s.in_channels + c
                         : ((n * s.in_channels + c) * s.input_rows() + row) * s.width + w;
  }
  int64_t dy_at(int64_t n, int64_t o, int64_t row, int64_t ow) const {
    return channels_last ? ((n * s.output_rows() + row) * s.out_width + ow) * s.out_channels + o
                         : ((n * s.out_channels + o) * s.output_rows() + row) * s.out_width + ow;
  }
  // the elements between dY's channels o and o + 1 of a pixel
  int64_t dy_channel_stride() const { return channels_last ? 1 : s.output_rows() * s.out_width; }
  // The output row of extended row `row` (padded_planes.h: slices of Hp rows, OH of them output
  // rows), or -1 where it is a zero row.
  int64_t output_row(const PaddedPlanes& p, int64_t row) const {
    const int64_t od = row / p.height, oh = row % p.height;
    return oh < s.out_height ? od * s.out_height + oh : -1;
  }
};

// Images [first, first + count) of x copied into the interiors of padded planes, xt [count, C,
// length], whose zeros (the padding, the zero tail) are written once per call, before the first
// chunk: the chunks' planes have the same zeros, and zeroing them row by row cost a call of
// memset per channel and row (benchmarks/NOTES.md, section 112). From NHWC an image row of every
// channel at a time, its pixels transposed; from NCHW a channel's plane at a time, its rows as
// they are (no layout copy before: section 111). Returns whether every input value was finite.
template <class T>
bool padded_input_planes(const T* x, const Activations& a, const PaddedPlanes& p, int64_t first,
                         int64_t count, T* xt) {
  const ConvShape& s = a.s;
  const int64_t c = s.in_channels, lda = p.length, rows = s.input_rows();
  // the first pixel of image row `row` (a volume's row d*H + h) in a padded plane
  const auto interior_row = [&](int64_t row) {
    const int64_t d = row / s.height, h = row % s.height;
    return ((d + s.pad_d) * p.height + h + s.pad_h) * p.width + s.pad_w;
  };
  std::atomic<bool> finite{true};
  if (!a.channels_last) {
    at::parallel_for(0, count * c, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {  // channel i % C of image i / C
        const T* source = x + a.x_at(first + i / c, i % c, 0, 0);
        if (!all_finite(source, rows * s.width)) finite = false;
        for (int64_t h = 0; h < rows; ++h) {
          std::copy_n(source + h * s.width, s.width, xt + i * lda + interior_row(h));
        }
      }
    });
    return finite;
  }
  at::parallel_for(0, count * rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {  // image row r % rows of image r / rows
      const int64_t n = r / rows, h = r % rows;
      const T* source = x + a.x_at(first + n, 0, h, 0);
      if (!all_finite(source, s.width * c)) finite = false;
      // [W, C] into the C planes' row h
      transpose_matrix(source, c, xt + n * c * lda + interior_row(h), lda, s.width, c, sizeof(T));
    }
  });
  return finite;
}

// Images [first, first + count) of dY extended, [count, pixels, Cout]: output row oh's OW
// pixels, then Wp - OW pixels of zeros (a volume's extended rows past each slice's OH: zeros
// whole). In float32 row-major; in bfloat16 the VNNI layout,
// [count, pixels / 2, Cout, 2], extended pixels 2q and 2q + 1 interleaved into pair q. From NCHW
// each output row is transposed first (into the row itself in float32, into a thread's staging
// row in bfloat16), while in cache: no layout copy of dY before (benchmarks/NOTES.md, 111, 112).
// With `test_finite`, returns whether every value of dY was finite (each row tested in cache,
// NHWC); without it, true.
template <class T>
bool extended_output_grad(const T* dy, const Activations& a, const PaddedPlanes& p, int64_t first,
                          int64_t count, bool test_finite, T* dy_ext) {
  const ConvShape& s = a.s;
  const int64_t co = s.out_channels, rows = p.extended_rows(s);
  std::atomic<bool> finite{true};
  if constexpr (std::is_same_v<T, float>) {
    at::parallel_for(0, count * rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {  // extended row r % rows of image r / rows
        const int64_t n = first + r / rows, oh = a.output_row(p, r % rows);
        float* row = dy_ext + ((n - first) * p.pixels + r % rows * p.width) * co;
        const int64_t written = oh < 0 ? 0 : s.out_width;
        if (oh >= 0) {
          const float* source = dy + a.dy_at(n, 0, oh, 0);
          if (a.channels_last) {
            std::memcpy(row, source, s.out_width * co * sizeof(float));
          } else {  // [Cout, OW], rows OD*OH*OW apart, into [OW, Cout]
            transpose_matrix(source, a.dy_channel_stride(), row, co, co, s.out_width,
                             sizeof(float));
          }
          if (test_finite && !all_finite(row, s.out_width * co)) finite = false;
        }
        std::fill_n(row + written * co, (p.width - written) * co, 0.f);
      }
    });
  } else {
    // A task per extended row writes the pairs whose first pixel is in it: where Wp is odd, a
    // row's last pair takes the next row's first pixel as its second.
    const std::vector<uint16_t> zeros(co, 0);
    const auto* source = reinterpret_cast<const uint16_t*>(dy);
    at::parallel_for(0, count * rows, 4, [&](int64_t begin, int64_t end) {
      std::vector<uint16_t> staged(a.channels_last ? 0 : (s.out_width + 1) * co);
      for (int64_t r = begin; r < end; ++r) {  // extended row r % rows of image r / rows
        const int64_t n = first + r / rows, extended_row = r % rows;
        const int64_t row_start = extended_row * p.width, next_start = row_start + p.width;
        const int64_t oh = a.output_row(p, extended_row);
        const int64_t next_oh = extended_row + 1 < rows ? a.output_row(p, extended_row + 1) : -1;
        const bool straddles = next_start % 2 != 0 && next_oh >= 0;
        // the row's OW pixels (none for a zero row) and the next row's first, as NHWC pixels of
        // Cout
        const uint16_t* row = oh < 0 ? nullptr : source + a.dy_at(n, 0, oh, 0);
        const uint16_t* next_first = straddles ? source + a.dy_at(n, 0, next_oh, 0) : nullptr;
        if (!a.channels_last) {  // [Cout, OW], rows OD*OH*OW apart, into [OW, Cout]
          if (row) {
            transpose_matrix(row, a.dy_channel_stride(), staged.data(), co, co, s.out_width,
                             sizeof(uint16_t));
            row = staged.data();
          }
          if (straddles) {
            uint16_t* pixel = staged.data() + s.out_width * co;
            for (int64_t o = 0; o < co; ++o) pixel[o] = next_first[o * a.dy_channel_stride()];
            next_first = pixel;
          }
        }
        if (test_finite && row && !all_finite(reinterpret_cast<const T*>(row), s.out_width * co)) {
          finite = false;
        }
        const auto pixel =
            [&](int64_t e) {  // extended pixel e of this row, or the next row's first
              if (e == next_start) return straddles ? next_first : zeros.data();
              return row && e - row_start < s.out_width ? row + (e - row_start) * co : zeros.data();
            };
        const int64_t last_pair = extended_row + 1 == rows ? p.pixels / 2 : (next_start + 1) / 2;
        uint16_t* image_pairs = reinterpret_cast<uint16_t*>(dy_ext) + (n - first) * p.pixels * co;
        for (int64_t q = (row_start + 1) / 2; q < last_pair; ++q) {
          interleave_pair_of_rows(pixel(2 * q), pixel(2 * q + 1), co, image_pairs + q * 2 * co);
        }
      }
    });
  }
  return finite;
}

// The tiles of dW: tile t is tap t % taps of (group, channel block, output channel block)
// t / taps, in that order.
struct Tiles {
  int64_t group_in, group_out, in_block, out_block, in_blocks, out_blocks, taps;
  Tiles(const ConvShape& s, bool wide)  // wide: float32's tiles where AVX-512 kernels run
      : group_in(s.in_channels / s.groups),
        group_out(s.out_channels / s.groups),
        in_block(wide ? float32_in_block(s) : channel_block(group_in)),
        out_block(wide ? std::min(group_out, kFloat32Block) : channel_block(group_out)),
        in_blocks(at::ceil_div(group_in, in_block)),
        out_blocks(at::ceil_div(group_out, out_block)),
        taps(s.taps()) {}
  int64_t count(int64_t groups) const { return groups * in_blocks * out_blocks * taps; }
};

// The tasks: at least kMinTasks where the tiles are fewer, the extended pixels of each image cut
// into parts for that. 9 tiles (3x3, 32 channels) left 2 threads 5 and 4, 25 (5x5 at 64) 13 and 12;
// and a many-core machine needs pieces for every core (benchmarks/NOTES.md, section 105).
constexpr int64_t kMinTasks = 32;
struct Parts {
  int64_t tiles, count, pixels;
  bool even;  // the VNNI layout pairs pixels: each part starts at an even one
  Parts(const Tiles& t, const ConvShape& s, const PaddedPlanes& p)
      : tiles(t.count(s.groups)),
        count(std::clamp<int64_t>(at::ceil_div(kMinTasks, tiles), 1,
                                  std::max<int64_t>(p.pixels / kPixelBlock, 1))),
        pixels(p.pixels),
        even(p.even_pixels) {}
  int64_t tasks() const { return count * tiles; }
  // the first extended pixel of part `part` (of an image); start(count) is the end of the last
  int64_t start(int64_t part) const {
    const int64_t first = part * pixels / count;
    return even ? first / 2 * 2 : first;
  }
};

// The extended pixels [first, second) that each depth tap computes: for a volume with depth
// padding and a finite dY, those whose depth tap reads inside it (PaddedPlanes::depth_tap_pixels;
// the others pair the padding's zeros: 8% of the products of 8 slices deep, 17% of 4, section
// 137); else all (0 * a NaN of dY is NaN, as the convolution's pairs give).
using TapPixels = std::vector<std::pair<int64_t, int64_t>>;
TapPixels depth_tap_pixels(const ConvShape& s, const PaddedPlanes& p, bool dy_finite) {
  TapPixels pixels;
  for (int64_t kd = 0; kd < s.kernel_d; ++kd) {
    pixels.push_back(dy_finite ? p.depth_tap_pixels(s, kd)
                               : std::pair<int64_t, int64_t>{0, p.pixels});
  }
  return pixels;
}

// Tile `tile` (Tiles) of image n's extended pixels [first_pixel, first_pixel + pixels), those of
// them its depth tap computes (TapPixels), added into `sums` [C, taps, Cout/G] (dW_tap^T of every
// group, rows of (channel, tap)): one micro-kernel call.
template <class T>
void accumulate_tile(const T* xt, const T* dy_ext, const ConvShape& s, const PaddedPlanes& p,
                     const Tiles& t, const TapPixels& computed, int64_t tile, int64_t n,
                     int64_t first_pixel, int64_t pixels, float* sums) {
  const int64_t tap = tile % t.taps, block = tile / t.taps;
  const auto [computed_begin, computed_end] = computed[tap / (s.kernel_h * s.kernel_w)];
  const int64_t e = std::max(first_pixel, computed_begin);
  pixels = std::min(first_pixel + pixels, computed_end) - e;
  if (pixels <= 0) return;
  const int64_t ob = block % t.out_blocks, ib = block / t.out_blocks % t.in_blocks;
  const int64_t g = block / (t.out_blocks * t.in_blocks);
  const int64_t c = g * t.group_in + ib * t.in_block, o = g * t.group_out + ob * t.out_block;
  const int64_t rows = std::min(t.in_block, t.group_in - ib * t.in_block);
  const int64_t cols = std::min(t.out_block, (g + 1) * t.group_out - o);
  const T* a = xt + (n * s.in_channels + c) * p.length + e + p.offset(s, tap);
  // row e of the float32 [pixels, Cout], or pair e / 2 of the VNNI [pixels / 2, Cout, 2]
  const int64_t cout = s.out_channels;
  const T* b = dy_ext + (n * p.pixels + e) * cout + (std::is_same_v<T, float> ? o : 2 * o);
  float* c_tile = sums + (c * t.taps + tap) * t.group_out + (o - g * t.group_out);
  // [rows, cols] += [rows, pixels] @ [pixels, cols]
  micro_gemm(rows, cols, pixels, a, p.length, b, cout, c_tile, t.taps * t.group_out, /*add=*/true);
}

// The tasks [begin, end) over images [0, count) of the chunk: task = part * tiles + tile (Parts,
// Tiles). For each image, each part and each block of the part's extended pixels, the call of
// every task of that part. `sums` [parts, C, taps, Cout/G]: a part's sums as accumulate_tile's.
template <class T>
void accumulate_tasks(const T* xt, const T* dy_ext, const ConvShape& s, const PaddedPlanes& p,
                      const Tiles& t, const TapPixels& computed, const Parts& parts, int64_t count,
                      int64_t begin, int64_t end, float* sums) {
  const int64_t part_sums = s.in_channels * t.taps * t.group_out;
  for (int64_t n = 0; n < count; ++n) {
    for (int64_t part = begin / parts.tiles; part * parts.tiles < end; ++part) {
      const int64_t first = std::max(begin, part * parts.tiles);
      const int64_t last = std::min(end, (part + 1) * parts.tiles);
      const int64_t part_end = parts.start(part + 1);
      for (int64_t e = parts.start(part); e < part_end; e += kPixelBlock) {
        const int64_t pixels = std::min(kPixelBlock, part_end - e);
        for (int64_t task = first; task < last; ++task) {
          accumulate_tile(xt, dy_ext, s, p, t, computed, task - part * parts.tiles, n, e, pixels,
                          sums + part * part_sums);
        }
      }
    }
  }
  if constexpr (!std::is_same_v<T, float>) release_microkernel(/*vnni=*/true);
}

// For a chunk whose input holds an infinity or a NaN: the convolution's pairs and no others, in
// plain loops, added into `sums` as accumulate_tasks does. A task owns a channel's rows of sums.
template <class T>
void accumulate_exact_pairs(const T* x, const T* dy, const Activations& a, const Tiles& t,
                            int64_t first, int64_t count, float* sums) {
  const ConvShape& s = a.s;
  const int64_t dy_step = a.dy_channel_stride();
  at::parallel_for(0, s.in_channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t g = c / t.group_in;
      for (int64_t n = first; n < first + count; ++n) {
        for (int64_t row = 0; row < s.output_rows(); ++row) {  // output row (od, oh)
          const int64_t od = row / s.out_height, oh = row % s.out_height;
          for (int64_t ow = 0; ow < s.out_width; ++ow) {
            const T* d = dy + a.dy_at(n, g * t.group_out, row, ow);
            for (int64_t tap = 0; tap < t.taps; ++tap) {  // (kd, ki, kj)
              const int64_t plane_tap = tap % (s.kernel_h * s.kernel_w);
              const int64_t id = od - s.pad_d + tap / (s.kernel_h * s.kernel_w) * s.dilation_d;
              const int64_t ih = oh - s.pad_h + plane_tap / s.kernel_w * s.dilation_h;
              const int64_t iw = ow - s.pad_w + plane_tap % s.kernel_w * s.dilation_w;
              const bool inside =
                  id >= 0 && id < s.depth && ih >= 0 && ih < s.height && iw >= 0 && iw < s.width;
              // padding is a zero the convolution pairs too (0 * a NaN of dY is NaN)
              const float v =
                  inside ? static_cast<float>(x[a.x_at(n, c, id * s.height + ih, iw)]) : 0.f;
              float* row = sums + (c * t.taps + tap) * t.group_out;
              for (int64_t o = 0; o < t.group_out; ++o) {
                row[o] += v * static_cast<float>(d[o * dy_step]);
              }
            }
          }
        }
      }
    }
  });
}

// The weight gradient of convolution `s` into grad_weight [Cout, C/G, (kd,) kh, kw] (contiguous
// or channels_last), of activations in the layout `channels_last` says.
template <class T>
void implicit_weight_grad(const Tensor& input, const Tensor& grad_output, const ConvShape& s,
                          bool channels_last, const Tensor& grad_weight) {
  const Activations a{s, channels_last};
  const PaddedPlanes p(s, /*even_pixels=*/!std::is_same_v<T, float>);
  const Tiles t(s, /*wide=*/std::is_same_v<T, float> && cpu_allows_avx512_kernels());
  const Parts parts(t, s, p);
  const auto f32 = input.options().dtype(at::kFloat);
  // per part, dW_tap^T of every group: [parts, C, taps, Cout/G], each group's rows [C/G * taps,
  // Cout/G]
  const Tensor sums =
      empty_scratch({parts.count, s.in_channels * t.taps, t.group_out}, f32).zero_();
  // The padded copies of a chunk of images (padded_planes.h). The sums run on over the chunks in
  // the same order, so the chunks do not change the bits.
  const int64_t images =
      padded_chunk_images(p.weight_grad_image_bytes(s, int64_t{sizeof(T)}), s.batch);
  // (zeroed once: padded_input_planes writes the interiors)
  const Tensor xt = empty_scratch({images * s.in_channels * p.length}, input.options()).zero_();
  const Tensor dy_ext = empty_scratch({images * p.pixels * s.out_channels}, input.options());
  const CountedScratch counted_xt(xt), counted_dy(dy_ext), counted_sums(sums);
  const T* x = input.const_data_ptr<T>();
  const T* dy = grad_output.const_data_ptr<T>();
  float* sum_data = sums.mutable_data_ptr<float>();
  // dY is tested for non-finite values only where a depth tap skips pixels (images: never)
  const bool clips_depth = depth_tap_pixels(s, p, true) != depth_tap_pixels(s, p, false);
  for (int64_t first = 0; first < s.batch; first += images) {
    const int64_t count = std::min(images, s.batch - first);
    if (!padded_input_planes(x, a, p, first, count, xt.mutable_data_ptr<T>())) {
      accumulate_exact_pairs(x, dy, a, t, first, count, sum_data);
      continue;
    }
    const bool dy_finite =
        extended_output_grad(dy, a, p, first, count, clips_depth, dy_ext.mutable_data_ptr<T>());
    const TapPixels computed = depth_tap_pixels(s, p, dy_finite);
    at::parallel_for(0, parts.tasks(), 1, [&](int64_t begin, int64_t end) {
      accumulate_tasks(xt.const_data_ptr<T>(), dy_ext.const_data_ptr<T>(), s, p, t, computed, parts,
                       count, begin, end, sum_data);
    });
  }
  for (int64_t part = 1; part < parts.count; ++part) sums[0].add_(sums[part]);  // in order
  // [C/G * taps, Cout/G] of group g into its rows of dW, rounded once at the end: contiguous
  // [Cout, C/G * taps] at once, channels_last [Cout, taps, C/G] a tap's [C/G, Cout/G] at a time
  const int64_t per_group = t.group_in * t.taps;
  const Tensor rows =
      std::is_same_v<T, float> ? grad_weight : empty_scratch(grad_weight.sizes(), f32);
  float* w = rows.mutable_data_ptr<float>();
  const bool weight_channels_last = !grad_weight.is_contiguous();
  at::parallel_for(0, s.groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const float* group_sums = sum_data + g * per_group * t.group_out;
      float* group_rows = w + g * t.group_out * per_group;
      if (!weight_channels_last) {
        transpose_matrix(group_sums, t.group_out, group_rows, per_group, per_group, t.group_out,
                         sizeof(float));
        continue;
      }
      for (int64_t tap = 0; tap < t.taps; ++tap) {
        transpose_matrix(group_sums + tap * t.group_out, t.taps * t.group_out,
                         group_rows + tap * t.group_in, per_group, t.group_in, t.group_out,
                         sizeof(float));
      }
    }
  });
  if constexpr (!std::is_same_v<T, float>) {
    round_to_bfloat16(w, rows.numel(), grad_weight.mutable_data_ptr<T>());
  }
}

// The operators of images (dims 2) and volumes (dims 3).
template <int64_t dims>
void implicit_weight_grad_cpu(const Tensor& input, const Tensor& grad_output, IntArrayRef stride,
                              IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                              const Tensor& grad_weight) {
  const char* op = dims == 2 ? "torch_convbp.implicit_conv2d_weight_grad"
                             : "torch_convbp.implicit_conv3d_weight_grad";
  const auto [s, channels_last] = check_implicit_weight_grad_call(
      op, input, grad_weight, grad_output, stride, padding, dilation, groups, dims);
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, op,
              ": computes float32 and bfloat16 only, got ", dtype);
  TORCH_CHECK(s.stride_d == 1 && s.stride_h == 1 && s.stride_w == 1, op,
              ": computes stride 1 only, got stride ", stride);
  TORCH_CHECK(dtype == at::kFloat ? cpu_has_gemm_microkernel() : cpu_has_bfloat16_microkernel(), op,
              ": needs the GEMM micro-kernel (cpublas::brgemm) in ", dtype,
              ", which this CPU or torch lacks");
  if (grad_weight.numel() == 0) return;
  if (s.batch == 0) {
    grad_weight.zero_();
    return;
  }
  if (dtype == at::kFloat) {
    implicit_weight_grad<float>(input, grad_output, s, channels_last, grad_weight);
  } else {
    implicit_weight_grad<at::BFloat16>(input, grad_output, s, channels_last, grad_weight);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("implicit_conv2d_weight_grad", &implicit_weight_grad_cpu<2>);
  m.impl("implicit_conv3d_weight_grad", &implicit_weight_grad_cpu<3>);
}

}  // namespace torch_convbp
