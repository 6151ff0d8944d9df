// Route implicit_nhwc (route.h): a float32 convolution of channels_last operands as GEMMs on
// shifted views of the input, with no column matrix (an implicit GEMM), on oneDNN's micro-kernel
// (at::native::cpublas::brgemm).
//
// For one group, the output row (n, oh) of channels [co, co + nb) is
//   Y[n, oh, :, co..] = sum over the taps (ki, kj) in order of  X_tap [OW', C/G] @ W_tap [C/G, nb]
// where X_tap is the run of input pixels that tap reads along row ih = oh*s - p + ki*d: pixel
// ow*s - p + kj*d for the output columns ow whose tap lands inside the image (OW' of them). In NHWC
// that run is a matrix with rows stride*C apart: one micro-kernel call per tap, A = the run
// (lda = stride*C), B = the tap's weights (rearranged once per call to [G, kh, kw, C/G, Cout/G]),
// C = the output row (ldc = Cout), which the calls add into after it is zeroed. The column matrix
// of the columns route costs a write and a read of kh*kw*C values per output pixel; here each
// input pixel is read in place (benchmarks/NOTES.md, section 26).
//
// A task computes whole tiles (an output row of one image, one group, one block of output
// channels), tap by tap in (ki, kj) order, so every output entry is summed in the same order
// whichever thread runs its tile: the bits do not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "../checks.h"
#include "cpu_kernels.h"
#include "microkernel.h"

namespace torch_convbp {
namespace {

// The output channels a tile takes: all of a group's, up to this many.
constexpr int64_t kMaxTileChannels = 256;

// One tile: output row oh of image n, group g, output channels [co, co + count) of the group.
void tile(const float* x, const float* w, float* y, const ConvShape& s, int64_t n, int64_t oh,
          int64_t g, int64_t co, int64_t count) {
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  float* row = y + ((n * s.out_height + oh) * s.out_width) * s.out_channels + g * group_out + co;
  for (int64_t ow = 0; ow < s.out_width; ++ow) std::fill_n(row + ow * s.out_channels, count, 0.f);
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    const int64_t ih = input_row(s, oh, ki);
    if (ih < 0) continue;
    const float* x_row = x + ((n * s.height + ih) * s.width) * s.in_channels + g * group_in;
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      const Tap tap = tap_columns(s, kj);
      const int64_t columns = tap.columns.end - tap.columns.begin;
      if (columns <= 0) continue;
      const int64_t iw = tap.columns.begin * s.stride_w + tap.offset;
      // [columns, nb] += [columns, C/G] @ [C/G, nb]
      const float* w_tap = w + (((g * s.kernel_h + ki) * s.kernel_w + kj) * group_in) * group_out;
      micro_gemm(columns, count, group_in, x_row + iw * s.in_channels, s.stride_w * s.in_channels,
                 w_tap + co, group_out, row + tap.columns.begin * s.out_channels, s.out_channels,
                 /*add=*/true);
    }
  }
}

void implicit_conv2d_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                         IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                         const Tensor& output) {
  constexpr const char* op = "torch_convbp.implicit_conv2d";
  const ConvShape s = check_grouped(op, input, weight, output, stride, padding, dilation, groups);
  TORCH_CHECK(input.scalar_type() == at::kFloat, op, ": computes float32 only, got ",
              input.scalar_type());
  if (output.numel() == 0) return;
  const int64_t group_out = s.out_channels / s.groups;
  // [Cout, C/G, kh, kw] as [G, kh, kw, C/G, Cout/G]: a tap's weights are a row-major [C/G, Cout/G]
  const Tensor w =
      weight.view({s.groups, group_out, s.in_channels / s.groups, s.kernel_h, s.kernel_w})
          .permute({0, 3, 4, 2, 1})
          .contiguous();
  const int64_t per_tile = std::min(group_out, kMaxTileChannels);
  const int64_t blocks = (group_out + per_tile - 1) / per_tile;
  const int64_t rows = s.batch * s.out_height, tiles = rows * s.groups * blocks;
  const float* x = input.const_data_ptr<float>();
  const float* w_data = w.const_data_ptr<float>();
  float* y = output.mutable_data_ptr<float>();
  // Tiles in the order (group, block, row): consecutive tasks share a block of weights.
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row = t % rows, block = t / rows % blocks, g = t / rows / blocks;
      const int64_t co = block * per_tile, count = std::min(per_tile, group_out - co);
      tile(x, w_data, y, s, row / s.out_height, row % s.out_height, g, co, count);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) { m.impl("implicit_conv2d", &implicit_conv2d_cpu); }

}  // namespace torch_convbp
