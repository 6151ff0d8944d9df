// The operator schemas of torch_convbp, and the registration of the orchestration (conv2d.cpp)
// for every device. The arguments are checked in checks.cpp; the device kernels register
// themselves in cpu/ and cuda/.
#include <torch/library.h>

#include "checks.h"
#include "conv2d.h"

namespace torch_convbp {

TORCH_LIBRARY(torch_convbp, m) {
  // y = conv(input, weight) + bias, like F.conv2d with explicit pairs.
  m.def(
      "conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups) -> Tensor");
  // dL/dinput given dL/doutput. The input size travels with it: with a stride above 1 several
  // input sizes give the same output size. Sizes are SymInt so that torch.export can keep the
  // batch size symbolic (the kernel itself gets concrete ints).
  m.def(
      "conv2d_input_grad(Tensor grad_output, Tensor weight, SymInt[4] input_size, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> Tensor");
  // dL/dweight given the input and dL/doutput.
  m.def(
      "conv2d_weight_grad(Tensor input, Tensor grad_output, SymInt[4] weight_size, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> Tensor");
  // The same three for [N, C, D, H, W] tensors, on the same engine (triples: depth, height, width).
  m.def(
      "conv3d(Tensor input, Tensor weight, Tensor? bias, int[3] stride, int[3] padding, "
      "int[3] dilation, int groups) -> Tensor");
  m.def(
      "conv3d_input_grad(Tensor grad_output, Tensor weight, SymInt[5] input_size, int[3] stride, "
      "int[3] padding, int[3] dilation, int groups) -> Tensor");
  m.def(
      "conv3d_weight_grad(Tensor input, Tensor grad_output, SymInt[5] weight_size, int[3] stride, "
      "int[3] padding, int[3] dilation, int groups) -> Tensor");
  // The device kernels. im2col writes the column matrix of output rows
  // [row_start, row_start+rows) of every image; col2im adds the columns back into the images.
  // Images [N, C, H, W] take pairs, [N, C, D, H, W] triples (their output rows are the depth
  // slices' rows counted together: shape.h).
  m.def(
      "im2col(Tensor images, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, int row_start, int rows, Tensor(a!) columns) -> ()");
  m.def(
      "col2im(Tensor columns, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, int row_start, int rows, Tensor(a!) images) -> ()");
  // The same two for channels_last images, with the NHWC column matrix [G, P, kh*kw*C/G]
  // (shape.h, ColumnGeometry): the groups are the columns' first dimension.
  m.def(
      "im2col_nhwc(Tensor images, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, int row_start, int rows, Tensor(a!) columns) -> ()");
  m.def(
      "col2im_nhwc(Tensor columns, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, int row_start, int rows, Tensor(a!) images) -> ()");
  // target[b, j, i] = source[b, i, j]: how an activation changes between NCHW ([C, pixels] per
  // image) and channels_last ([pixels, C]). Other devices than the CPU take ATen's copy (below).
  m.def("transpose_copy(Tensor source, Tensor(a!) target) -> ()");
  // target[g, b, a, t] = source[g, a, b, t], or source[g, a, b, taps-1-t] with reverse_taps: a
  // weight [G, A, B, taps] with each group's channels swapped (and each kernel rotated by 180
  // degrees), into a target of any memory order (conv2d.cpp, flipped_transposed_weight). Other
  // devices than the CPU take ATen's copy (below).
  m.def("transpose_taps(Tensor source, Tensor(a!) target, bool reverse_taps) -> ()");
  // The depthwise special case (one input channel per group), computed directly: each writes
  // its last argument whole.
  m.def(
      "depthwise_conv2d(Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, Tensor(a!) output) -> ()");
  m.def(
      "depthwise_input_grad(Tensor grad_output, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, Tensor(a!) grad_input) -> ()");
  m.def(
      "depthwise_weight_grad(Tensor input, Tensor grad_output, int[2] stride, int[2] padding, "
      "int[2] dilation, Tensor(a!) grad_weight) -> ()");
  // The depthwise forward, input gradient and weight gradient of volumes, both activations
  // contiguous or both channels_last_3d (CPU, float32 and float64): the forward's and input
  // gradient's each value one sum over its (kd, kh, kw) taps, the weight gradient's in the order
  // of rows; each writes its last argument whole.
  m.def(
      "depthwise_conv3d(Tensor input, Tensor weight, int[3] stride, int[3] padding, "
      "int[3] dilation, Tensor(a!) output) -> ()");
  m.def(
      "depthwise_conv3d_input_grad(Tensor grad_output, Tensor weight, int[3] stride, "
      "int[3] padding, int[3] dilation, Tensor(a!) grad_input) -> ()");
  m.def(
      "depthwise_conv3d_weight_grad(Tensor input, Tensor grad_output, int[3] stride, "
      "int[3] padding, int[3] dilation, Tensor(a!) grad_weight) -> ()");
  // A grouped convolution computed directly on channels_last activations, for groups too narrow
  // for the column matrix's GEMMs, and its weight gradient: each writes its last argument whole.
  m.def(
      "grouped_conv2d(Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, Tensor(a!) output) -> ()");
  m.def(
      "grouped_weight_grad(Tensor input, Tensor grad_output, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, Tensor(a!) grad_weight) -> ()");
  // A float32 convolution of channels_last activations as GEMMs on shifted views of the input
  // (an implicit GEMM, no column matrix), on the CPU's GEMM micro-kernel: it writes `output`;
  // the input gradient of a stride-1 one, the same kind of convolution of grad_output; and the
  // weight gradient of a stride-1 one, GEMMs on shifted views of padded copies (float32).
  m.def(
      "implicit_conv2d(Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, Tensor(a!) output) -> ()");
  m.def(
      "implicit_conv2d_input_grad(Tensor grad_output, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups, Tensor(a!) grad_input) -> ()");
  m.def(
      "implicit_conv2d_weight_grad(Tensor input, Tensor grad_output, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups, Tensor(a!) grad_weight) -> ()");
  // The forward and input gradient of volumes likewise (channels_last_3d, the result also
  // contiguous), their depth slices' rows as an image's rows; the weight gradient of volumes as
  // the images' (both activations NCDHW or both channels_last_3d), their padded depth slices one
  // plane.
  m.def(
      "implicit_conv3d(Tensor input, Tensor weight, int[3] stride, int[3] padding, "
      "int[3] dilation, int groups, Tensor(a!) output) -> ()");
  m.def(
      "implicit_conv3d_input_grad(Tensor grad_output, Tensor weight, int[3] stride, "
      "int[3] padding, int[3] dilation, int groups, Tensor(a!) grad_input) -> ()");
  m.def(
      "implicit_conv3d_weight_grad(Tensor input, Tensor grad_output, int[3] stride, "
      "int[3] padding, int[3] dilation, int groups, Tensor(a!) grad_weight) -> ()");
}

// The orchestration is the same on every device: it reaches the device through im2col/col2im.
TORCH_LIBRARY_IMPL(torch_convbp, CompositeExplicitAutograd, m) {
  m.impl("conv2d", &conv2d_forward);
  m.impl("conv2d_input_grad", &conv2d_input_grad);
  m.impl("conv2d_weight_grad", &conv2d_weight_grad);
  m.impl("conv3d", &conv3d_forward);
  m.impl("conv3d_input_grad", &conv3d_input_grad);
  m.impl("conv3d_weight_grad", &conv3d_weight_grad);
  // The CPU registers a tiled kernel (cpu/transpose_copy_cpu.cpp); other devices take ATen's copy
  // (on a GPU not yet measured against a tiled kernel).
  m.impl("transpose_copy", [](const Tensor& source, const Tensor& target) {
    check_transpose_copy("torch_convbp.transpose_copy", source, target);
    target.copy_(source.transpose(1, 2));
  });
  m.impl("transpose_taps", [](const Tensor& source, const Tensor& target, bool reverse_taps) {
    check_transpose_taps("torch_convbp.transpose_taps", source, target);
    const Tensor swapped = source.transpose(1, 2);
    target.copy_(reverse_taps ? swapped.flip(3) : swapped);
  });
}

}  // namespace torch_convbp
