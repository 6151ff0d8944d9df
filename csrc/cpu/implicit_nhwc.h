// What the implicit route's forward and input-gradient kernels share (implicit_nhwc_cpu.cpp's
// tiles, padded_rows_cpu.cpp's padded rows): the weight as the micro-kernel's B matrices, tap by
// tap (tap_matrices_cpu.cpp), and how wide a task's block of output channels is.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <type_traits>

#include "../shape.h"

namespace torch_convbp {

// The output channels a tile takes: all of a group's, up to this many.
constexpr int64_t kMaxTileChannels = 256;
// Tasks at least this many where the batch would leave fewer (a deep layer at batch 1), so that
// a many-core CPU has them.
constexpr int64_t kMinTiles = 16;

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

// The weight [Cout, C/G, kh, kw] (contiguous or channels_last) as B matrices [G, taps, K, N]:
// K = C/G and N = Cout/G (the forward: B_tap = W_g[:, :, tap]^T), or K = Cout/G and N = C/G with
// the taps reversed (the input gradient's convolution: B_tap = W_g[:, :, taps-1-tap], each
// group's channels swapped, each kernel rotated by 180 degrees). float and at::BFloat16.
template <class T>
TapMatrices<T> tap_matrices(const at::Tensor& weight, const ConvShape& s, bool input_grad);

}  // namespace torch_convbp
