// The ground floor of torch_convbp's C++ code: the sizes of one convolution and the geometry of a
// chunk of its column matrix. Plain structs with no ATen types, so that every part (checks,
// route, orchestration, CPU and CUDA kernels, the harness) can include this and nothing more.
#pragma once

#include <cstdint>

namespace torch_convbp {

// Sizes of one convolution, checked once by check_conv2d() (checks.h).
struct ConvShape {
  int64_t batch, in_channels, height, width;  // input [N, Cin, H, W]
  int64_t out_channels, kernel_h, kernel_w;   // weight [Cout, Cin/G, kh, kw]
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  int64_t out_height, out_width;  // output [N, Cout, OH, OW]

  // Rows of the column matrix: one per (input channel, kernel row, kernel column).
  int64_t column_rows() const { return in_channels * kernel_h * kernel_w; }
  bool is_pointwise() const {  // 1x1, stride 1, no padding: the input is its own column matrix
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 &&
           pad_w == 0;
  }
  // One input channel per group (depthwise, with any channel multiplier Cout/G).
  bool is_depthwise() const { return groups > 1 && groups == in_channels; }
};

// The memory layout an operator computes in (route.h chooses it).
enum class Layout { nchw, nhwc };

// What an im2col or col2im kernel needs to map a column entry to an input pixel, for one chunk:
// `images` whole images and, of each, the output rows [row_start, row_start + rows), P pixels
// in all. The column matrix is, row-major,
//   NCHW: [channels*kernel_h*kernel_w, P]: row (c, ki, kj), column (image, output row, output
//         column), the same for any number of groups;
//   NHWC: [groups, P, kernel_h*kernel_w*channels/groups]: one row per group and output pixel,
//         its entries (ki, kj, c), the memory order of a channels_last weight's rows.
// A plain aggregate, so that it can be passed by value to a CUDA kernel.
struct ColumnGeometry {
  int64_t images, channels, height, width;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t out_width, row_start, rows;
  int64_t groups;  // 1 in NCHW, whose column matrix does not depend on them
};

}  // namespace torch_convbp
