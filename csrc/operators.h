// The operators of torch_convbp called through the dispatcher, as torch.ops calls them: every
// dispatch key (autograd, autocast-free devices, fake tensors, functorch's transforms, the
// profiler) sees the call. The autograd nodes (autograd.cpp) call them for the gradients, and
// the Python functions call them from eager code (python_calls.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace torch_convbp {

// The names of the operators of each dimension (2: conv2d..., 3: conv3d...).
template <int Dims>
struct OperatorNames;
template <>
struct OperatorNames<2> {
  static constexpr const char* forward = "torch_convbp::conv2d";
  static constexpr const char* input_grad = "torch_convbp::conv2d_input_grad";
  static constexpr const char* weight_grad = "torch_convbp::conv2d_weight_grad";
};
template <>
struct OperatorNames<3> {
  static constexpr const char* forward = "torch_convbp::conv3d";
  static constexpr const char* input_grad = "torch_convbp::conv3d_input_grad";
  static constexpr const char* weight_grad = "torch_convbp::conv3d_weight_grad";
};

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

template <int Dims>
at::Tensor call_forward(const at::Tensor& input, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  static const auto op = operator_handle<at::Tensor(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
      at::IntArrayRef, at::IntArrayRef, int64_t)>(OperatorNames<Dims>::forward);
  return op.call(input, weight, bias, stride, padding, dilation, groups);
}

// The sizes are SymInt, so that a traced graph (torch.compile, torch.export) keeps them symbolic.
template <int Dims>
at::Tensor call_input_grad(const at::Tensor& grad_output, const at::Tensor& weight,
                           c10::SymIntArrayRef input_size, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  static const auto op =
      operator_handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef,
                                 at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t)>(
          OperatorNames<Dims>::input_grad);
  return op.call(grad_output, weight, input_size, stride, padding, dilation, groups);
}

template <int Dims>
at::Tensor call_weight_grad(const at::Tensor& input, const at::Tensor& grad_output,
                            c10::SymIntArrayRef weight_size, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  static const auto op =
      operator_handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef,
                                 at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t)>(
          OperatorNames<Dims>::weight_grad);
  return op.call(input, grad_output, weight_size, stride, padding, dilation, groups);
}

}  // namespace torch_convbp
