// The device kernels' operator handles, looked up once each (device_kernels.h).
#include "device_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <vector>

namespace torch_convbp {
namespace {

using at::IntArrayRef;
using at::Tensor;

template <class Signature>
c10::TypedOperatorHandle<Signature> kernel_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// The handles of a family of three kernels (forward, input gradient, weight gradient), each of
// images and of volumes: [kernel][0 images, 1 volumes], named likewise.
template <class Signature>
using KernelHandles = std::array<std::array<c10::TypedOperatorHandle<Signature>, 2>, 3>;
template <class Signature>
KernelHandles<Signature> kernel_handles(const char* const (&names)[3][2]) {
  const auto pair = [&](int kernel) {
    return std::array{kernel_handle<Signature>(names[kernel][0]),
                      kernel_handle<Signature>(names[kernel][1])};
  };
  return {pair(0), pair(1), pair(2)};
}

// im2col and col2im share one signature: (source, geometry, rows, target).
using ColumnKernel = void(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef,
                          int64_t, int64_t, const Tensor&);
// So do the depthwise kernels: (operand, operand, geometry, result); the grouped ones add groups.
using DepthwiseSignature = void(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef,
                                const Tensor&);
using GroupedSignature = void(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef,
                              int64_t, const Tensor&);

// The geometry arguments of the kernels that take volumes too (im2col, col2im, the depthwise
// and implicit kernels of volumes): 2 values each for a 2-D convolution, 3 (depth first) for a 3-D
// one.
struct ColumnArguments {
  std::vector<int64_t> kernel_size, stride, padding, dilation;
  explicit ColumnArguments(const ConvShape& s)
      : kernel_size{s.kernel_h, s.kernel_w},
        stride{s.stride_h, s.stride_w},
        padding{s.pad_h, s.pad_w},
        dilation{s.dilation_h, s.dilation_w} {
    if (s.is_planar()) return;
    kernel_size.insert(kernel_size.begin(), s.kernel_d);
    stride.insert(stride.begin(), s.stride_d);
    padding.insert(padding.begin(), s.pad_d);
    dilation.insert(dilation.begin(), s.dilation_d);
  }
};

}  // namespace

void call_im2col(Layout layout, const Tensor& images, const ConvShape& s, int64_t row_start,
                 int64_t rows, const Tensor& columns) {
  static const auto nchw = kernel_handle<ColumnKernel>("torch_convbp::im2col");
  static const auto nhwc = kernel_handle<ColumnKernel>("torch_convbp::im2col_nhwc");
  const ColumnArguments a(s);
  (layout == Layout::nhwc ? nhwc : nchw)
      .call(images, a.kernel_size, a.stride, a.padding, a.dilation, row_start, rows, columns);
}

void call_col2im(Layout layout, const Tensor& columns, const ConvShape& s, int64_t row_start,
                 int64_t rows, const Tensor& images) {
  static const auto nchw = kernel_handle<ColumnKernel>("torch_convbp::col2im");
  static const auto nhwc = kernel_handle<ColumnKernel>("torch_convbp::col2im_nhwc");
  const ColumnArguments a(s);
  (layout == Layout::nhwc ? nhwc : nchw)
      .call(columns, a.kernel_size, a.stride, a.padding, a.dilation, row_start, rows, images);
}

void call_depthwise(DepthwiseKernel kernel, const Tensor& a, const Tensor& b, const ConvShape& s,
                    const Tensor& result) {
  static const auto handles = kernel_handles<DepthwiseSignature>(
      {{"torch_convbp::depthwise_conv2d", "torch_convbp::depthwise_conv3d"},
       {"torch_convbp::depthwise_input_grad", "torch_convbp::depthwise_conv3d_input_grad"},
       {"torch_convbp::depthwise_weight_grad", "torch_convbp::depthwise_conv3d_weight_grad"}});
  const ColumnArguments v(s);
  handles[static_cast<int>(kernel)][s.is_planar() ? 0 : 1].call(a, b, v.stride, v.padding,
                                                                v.dilation, result);
}

void call_grouped(GroupedKernel kernel, const Tensor& a, const Tensor& b, const ConvShape& s,
                  const Tensor& result) {
  static const auto forward = kernel_handle<GroupedSignature>("torch_convbp::grouped_conv2d");
  static const auto weight_grad =
      kernel_handle<GroupedSignature>("torch_convbp::grouped_weight_grad");
  (kernel == GroupedKernel::forward ? forward : weight_grad)
      .call(a, b, {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w}, {s.dilation_h, s.dilation_w},
            s.groups, result);
}

void call_implicit(ImplicitKernel kernel, const Tensor& a, const Tensor& weight, const ConvShape& s,
                   const Tensor& result) {
  static const auto handles = kernel_handles<GroupedSignature>(
      {{"torch_convbp::implicit_conv2d", "torch_convbp::implicit_conv3d"},
       {"torch_convbp::implicit_conv2d_input_grad", "torch_convbp::implicit_conv3d_input_grad"},
       {"torch_convbp::implicit_conv2d_weight_grad", "torch_convbp::implicit_conv3d_weight_grad"}});
  const ColumnArguments v(s);
  handles[static_cast<int>(kernel)][s.is_planar() ? 0 : 1].call(a, weight, v.stride, v.padding,
                                                                v.dilation, s.groups, result);
}

void call_transpose_copy(const Tensor& source, const Tensor& target) {
  static const auto handle =
      kernel_handle<void(const Tensor&, const Tensor&)>("torch_convbp::transpose_copy");
  handle.call(source, target);
}

void call_transpose_taps(const Tensor& source, const Tensor& target, bool reverse_taps) {
  static const auto handle =
      kernel_handle<void(const Tensor&, const Tensor&, bool)>("torch_convbp::transpose_taps");
  handle.call(source, target, reverse_taps);
}

}  // namespace torch_convbp
