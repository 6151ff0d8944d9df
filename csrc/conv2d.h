// torch_convbp: 2-D convolution and its gradients as im2col + GEMM.
//
// This header is the contract between the parts of the C++ code:
//   ops.cpp      the operator schemas,
//   checks.cpp   every check of their arguments,
//   conv2d.cpp   the device-agnostic orchestration (column buffers, GEMMs),
//   cpu/, cuda/  the only device-specific code: the im2col and col2im kernels, and the direct
//                kernels of the depthwise and narrow-grouped special cases.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

// Sizes of one convolution, checked once by check_conv2d().
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
  // One input channel per group (depthwise, with any channel multiplier Cout/G): each group's
  // GEMM would be a thin [Cout/G, kh*kw] @ [kh*kw, P], so direct kernels take its place.
  bool is_depthwise() const { return groups > 1 && groups == in_channels; }
};

// Checks everything F.conv2d checks about sizes and arguments, with messages that name the
// problem, and returns the convolution's shape. `op` names the caller in the messages.
ConvShape check_conv2d(const char* op, IntArrayRef input_size, IntArrayRef weight_size,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                       int64_t groups);

// Checks that the tensors of one call share a floating dtype (float64/32/16, bfloat16), a device
// and the strided layout; the first one names the dtype and device expected of the others.
void check_operands(const char* op,
                    std::initializer_list<std::pair<const char*, const Tensor*>> operands);

// The memory layout an operator computes in (layout.h chooses it from the operands' strides).
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

// The input rows [first, first + count) that output rows [row_start, row_start + rows) read: the
// rows col2im writes. count is 0 when the band reaches only padding.
struct InputRows {
  int64_t first, count;
};
inline InputRows input_rows_reached(const ColumnGeometry& g) {
  const int64_t first = std::max<int64_t>(0, g.row_start * g.stride_h - g.pad_h);
  const int64_t last = std::min(g.height - 1, (g.row_start + g.rows - 1) * g.stride_h - g.pad_h +
                                                  (g.kernel_h - 1) * g.dilation_h);
  return {first, g.rows == 0 || last < first ? 0 : last - first + 1};
}

// Checks the arguments of the im2col / col2im operators of one layout and returns their
// geometry: images [n, C, H, W] contiguous (NCHW) or dense channels_last (NHWC); columns
// contiguous, of the images' dtype (or float32 for half-precision images) and device, and of the
// layout's size: any shape of C*kh*kw*P elements in NCHW, exactly [G, P, kh*kw*C/G] in NHWC
// (G, the groups, divides C).
ColumnGeometry check_columns(const char* op, Layout layout, const Tensor& images,
                             const Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, int64_t row_start,
                             int64_t rows);

// Checks the arguments of the depthwise operators: input [N, C, H, W], weight [C*m, 1, kh, kw]
// and output [N, C*m, OH, OW] (for the gradient operators: their gradients), of one dtype and
// device, the weight contiguous, the input and output both contiguous or both dense
// channels_last. Returns the convolution's shape, with groups = C, and the layout.
struct DepthwiseCall {
  ConvShape shape;
  bool channels_last;  // the input and output are NHWC in memory
};
DepthwiseCall check_depthwise(const char* op, const Tensor& input, const Tensor& weight,
                              const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                              IntArrayRef dilation);

// Checks the arguments of the direct grouped kernel (grouped_conv2d): input [N, C, H, W], weight
// [Cout, C/G, kh, kw] and output [N, Cout, OH, OW] of one dtype and device, the weight
// contiguous, the input and output dense channels_last. Returns the convolution's shape.
ConvShape check_grouped(const char* op, const Tensor& input, const Tensor& weight,
                        const Tensor& output, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups);

// The three convolution operators (registered for every device in ops.cpp).
Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                      int64_t groups);
Tensor conv2d_input_grad(const Tensor& grad_output, const Tensor& weight, IntArrayRef input_size,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t groups);
Tensor conv2d_weight_grad(const Tensor& input, const Tensor& grad_output, IntArrayRef weight_size,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t groups);

// The dtype the GEMMs run in for operands of `dtype` on `device` (see conv2d.cpp).
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device);

// Whether this CPU multiplies float16 (bfloat16) matrices natively, with AVX512-FP16 (BF16) or
// AMX, rather than by a slow emulation. cpu/half_gemm.cpp; true for other dtypes.
bool cpu_has_native_half_gemm(at::ScalarType dtype);

// The largest column buffer (plus GEMM staging) one call may allocate, in bytes.
void set_workspace_limit(int64_t bytes);
int64_t workspace_limit();
// The most workspace held at once (all calls, all threads) since the last reset, in bytes;
// reset=true returns it and starts a new count.
int64_t workspace_peak(bool reset);

}  // namespace torch_convbp
