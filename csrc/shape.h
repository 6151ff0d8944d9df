// The ground floor of torch_convbp's C++ code: the sizes of one convolution and the geometry of a
// chunk of its column matrix. Plain structs with no ATen types, so that every part (checks,
// route, orchestration, CPU and CUDA kernels, the harness) can include this and nothing more.
//
// One geometry serves every dimension: a convolution is 3-D, [N, C, D, H, W]; a 2-D one has depth
// 1 (a kernel of depth 1, stride 1, no padding along it), as a 1-D one has height 1. The output's
// depth slices and rows, taken together, are its "rows" (OD*OH of them, each OW pixels): the unit
// by which a chunk of the work is cut, and the second dimension of the [N, C, rows, W] views the
// GEMMs see.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

namespace torch_convbp {

// Sizes of one convolution, checked once by check_convolution() (checks.h).
struct ConvShape {
  int64_t batch, in_channels, height, width;  // input [N, Cin, (D,) H, W]
  int64_t out_channels, kernel_h, kernel_w;   // weight [Cout, Cin/G, (kd,) kh, kw]
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  int64_t out_height, out_width;  // output [N, Cout, (OD,) OH, OW]
  // The third dimension, outermost: 1, 1, 1, 0, 1, 1 for a 2-D convolution.
  int64_t depth = 1, kernel_d = 1, stride_d = 1, pad_d = 0, dilation_d = 1, out_depth = 1;
  int64_t spatial_dims = 2;  // 2: [N, C, H, W] tensors; 3: [N, C, D, H, W]

  // Rows of the column matrix: one per (input channel, kernel depth, kernel row, kernel column).
  int64_t column_rows() const { return in_channels * kernel_d * kernel_h * kernel_w; }
  int64_t taps() const { return kernel_d * kernel_h * kernel_w; }
  // The input's and the output's rows: depth slices times rows.
  int64_t input_rows() const { return depth * height; }
  int64_t output_rows() const { return out_depth * out_height; }
  // A 2-D convolution, of [N, C, H, W] tensors: the direct kernels compute only these, but for the
  // CPU's depthwise forward and input gradient of volumes.
  bool is_planar() const { return spatial_dims == 2; }
  bool is_pointwise() const {  // 1x1(x1), stride 1, no padding: the input is its own column matrix
    return kernel_d == 1 && kernel_h == 1 && kernel_w == 1 && stride_d == 1 && stride_h == 1 &&
           stride_w == 1 && pad_d == 0 && pad_h == 0 && pad_w == 0;
  }
  // One input channel per group (depthwise, with any channel multiplier Cout/G).
  bool is_depthwise() const { return groups > 1 && groups == in_channels; }
};

// The convolution that the input gradient of a stride-1 convolution is (docs/backprop.md): of
// dY, padded by dilation*(k-1) - padding, with each group's weight transposed (in <-> out
// channels) and rotated by 180 degrees. Nothing where the stride is not 1 (it would need dY
// dilated with zeros) or the padding is wider than the kernel's reach (a negative padding).
inline std::optional<ConvShape> input_grad_convolution(const ConvShape& s) {
  const int64_t pad_d = s.dilation_d * (s.kernel_d - 1) - s.pad_d;
  const int64_t pad_h = s.dilation_h * (s.kernel_h - 1) - s.pad_h;
  const int64_t pad_w = s.dilation_w * (s.kernel_w - 1) - s.pad_w;
  if (s.stride_d != 1 || s.stride_h != 1 || s.stride_w != 1 || pad_d < 0 || pad_h < 0 ||
      pad_w < 0) {
    return std::nullopt;
  }
  ConvShape t = s;
  std::swap(t.in_channels, t.out_channels);
  std::swap(t.depth, t.out_depth);
  std::swap(t.height, t.out_height);
  std::swap(t.width, t.out_width);
  t.pad_d = pad_d;
  t.pad_h = pad_h;
  t.pad_w = pad_w;
  return t;
}

// The memory layout an operator computes in (route.h chooses it): channels first (NCHW, NCDHW) or
// last (NHWC, NDHWC).
enum class Layout { nchw, nhwc };

// What an im2col or col2im kernel needs to map a column entry to an input pixel, for one chunk:
// `images` whole images and, of each, the output rows [row_start, row_start + rows) (rows of all
// depth slices in order: output row r is depth slice r / out_height, row r % out_height), P
// pixels in all. The column matrix is, row-major,
//   NCHW: [channels*kernel_d*kernel_h*kernel_w, P]: row (c, kd, ki, kj), column (image, output
//         row, output column), the same for any number of groups;
//   NHWC: [groups, P, kernel_d*kernel_h*kernel_w*channels/groups]: one row per group and output
//         pixel, its entries (kd, ki, kj, c), the memory order of a channels_last weight's rows.
// A plain aggregate, so that it can be passed by value to a CUDA kernel.
struct ColumnGeometry {
  int64_t images, channels, height, width;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t out_width, row_start, rows;
  int64_t groups;  // 1 in NCHW, whose column matrix does not depend on them
  int64_t depth, kernel_d, stride_d, pad_d, dilation_d;
  int64_t out_height;  // output rows per depth slice
  int64_t out_depth;   // output depth slices (1 for images)
};

// The geometry of output rows [row_start, row_start + rows) of convolution `s`, for images of
// `channels` channels in `groups` groups.
inline ColumnGeometry column_geometry(const ConvShape& s, int64_t channels, int64_t groups,
                                      int64_t row_start, int64_t rows) {
  return ColumnGeometry{s.batch,      channels,     s.height,    s.width,    s.kernel_h,
                        s.kernel_w,   s.stride_h,   s.stride_w,  s.pad_h,    s.pad_w,
                        s.dilation_h, s.dilation_w, s.out_width, row_start,  rows,
                        groups,       s.depth,      s.kernel_d,  s.stride_d, s.pad_d,
                        s.dilation_d, s.out_height, s.out_depth};
}

}  // namespace torch_convbp
