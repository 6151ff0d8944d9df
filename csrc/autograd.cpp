// The autograd of the three operators (of each dimension), each differentiated with the others.
//
// With y = conv2d(x, W) and <a, b> the sum of a*b, the two gradient operators are the adjoints
//     <conv2d(x, W), g> = <x, conv2d_input_grad(g, W)> = <W, conv2d_weight_grad(x, g)>,
// so each is linear in both of its tensors, and its gradients are again among the three:
//   conv2d(x, W) + b, incoming g:
//       dx = conv2d_input_grad(g, W),  dW = conv2d_weight_grad(x, g),  db = sum of g over N, H, W
//   conv2d_input_grad(g, W), incoming v:
//       dg = conv2d(v, W),             dW = conv2d_weight_grad(v, g)
//   conv2d_weight_grad(x, g), incoming u:
//       dx = conv2d_input_grad(g, u),  dg = conv2d(x, u)
// The backward functions call the operators through the dispatcher, so each call records its own
// autograd node when a higher order is asked for: gradients of any order need nothing else.
// Only the gradients asked for are computed.
//
// These are kernels at the Autograd key, in C++, rather than torch.library.register_autograd in
// Python: a Python autograd wrapper costs about 70 us of host time per call (benchmarks/NOTES.md
// section 16), which a GPU layer waits for.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace torch_convbp {
namespace {

using at::IntArrayRef;
using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- The operators, called through the dispatcher ----------------------------------------------

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
c10::TypedOperatorHandle<Signature> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

template <int Dims>
Tensor call_forward(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                    IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  static const auto op =
      handle<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, IntArrayRef,
                    IntArrayRef, IntArrayRef, int64_t)>(OperatorNames<Dims>::forward);
  return op.call(input, weight, bias, stride, padding, dilation, groups);
}

// The sizes are SymInt, so that a traced graph (torch.compile, torch.export) keeps them symbolic.
template <int Dims>
Tensor call_input_grad(const Tensor& grad_output, const Tensor& weight,
                       c10::SymIntArrayRef input_size, IntArrayRef stride, IntArrayRef padding,
                       IntArrayRef dilation, int64_t groups) {
  static const auto op =
      handle<Tensor(const Tensor&, const Tensor&, c10::SymIntArrayRef, IntArrayRef, IntArrayRef,
                    IntArrayRef, int64_t)>(OperatorNames<Dims>::input_grad);
  return op.call(grad_output, weight, input_size, stride, padding, dilation, groups);
}

template <int Dims>
Tensor call_weight_grad(const Tensor& input, const Tensor& grad_output,
                        c10::SymIntArrayRef weight_size, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
  static const auto op =
      handle<Tensor(const Tensor&, const Tensor&, c10::SymIntArrayRef, IntArrayRef, IntArrayRef,
                    IntArrayRef, int64_t)>(OperatorNames<Dims>::weight_grad);
  return op.call(input, grad_output, weight_size, stride, padding, dilation, groups);
}

// ---- What every node saves ---------------------------------------------------------------------

// The convolution's arguments, which every operator takes last and its gradients reuse (2 or 3
// numbers each: no heap memory).
struct ConvArgs {
  c10::SmallVector<int64_t, 3> stride, padding, dilation;
  int64_t groups;
};

// A node saves its operator's two tensors and the convolution's arguments, these as one list
// [stride..., padding..., dilation..., groups] in one entry of its saved data (an entry costs a
// hashed string and a list: host time, benchmarks/NOTES.md section 47).
void save(AutogradContext* ctx, const Tensor& first, const Tensor& second, IntArrayRef stride,
          IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  ctx->save_for_backward({first, second});
  std::vector<int64_t> args;
  args.reserve(3 * stride.size() + 1);
  for (IntArrayRef values : {stride, padding, dilation}) {
    args.insert(args.end(), values.begin(), values.end());
  }
  args.push_back(groups);
  ctx->saved_data["args"] = std::move(args);
}

ConvArgs saved_args(AutogradContext* ctx) {
  const c10::List<int64_t> args = ctx->saved_data["args"].toIntList();
  const size_t dims = (args.size() - 1) / 3;
  ConvArgs result{{}, {}, {}, args.get(args.size() - 1)};
  for (size_t i = 0; i < dims; ++i) {
    result.stride.push_back(args.get(i));
    result.padding.push_back(args.get(dims + i));
    result.dilation.push_back(args.get(2 * dims + i));
  }
  return result;
}

// The backward of an operator with two tensor inputs and four convolution arguments: no gradient
// for the arguments.
variable_list two_gradients(Tensor first, Tensor second) {
  return {std::move(first), std::move(second), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
}

// ---- The three nodes, of either dimension ------------------------------------------------------

template <int Dims>
struct ForwardNode : torch::autograd::Function<ForwardNode<Dims>> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                        const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
    save(ctx, input, weight, stride, padding, dilation, groups);
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_forward<Dims>(input, weight, bias, stride, padding, dilation, groups);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &weight = saved[1], &grad = grads[0];
    const auto [stride, padding, dilation, groups] = saved_args(ctx);
    Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input =
          call_input_grad<Dims>(grad, weight, input.sym_sizes(), stride, padding, dilation, groups);
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = call_weight_grad<Dims>(input, grad, weight.sym_sizes(), stride, padding,
                                           dilation, groups);
    }
    // The bias is an edge only when it was given; its gradient sums the batch and the pixels.
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_bias = Dims == 2 ? grad.sum({0, 2, 3}) : grad.sum({0, 2, 3, 4});
    }
    return {grad_input, grad_weight, grad_bias, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

template <int Dims>
struct InputGradNode : torch::autograd::Function<InputGradNode<Dims>> {
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& weight,
                        c10::SymIntArrayRef input_size, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
    save(ctx, grad_output, weight, stride, padding, dilation, groups);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_input_grad<Dims>(grad_output, weight, input_size, stride, padding, dilation,
                                 groups);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &grad_output = saved[0], &weight = saved[1], &v = grads[0];
    const auto [stride, padding, dilation, groups] = saved_args(ctx);
    Tensor d_grad_output, d_weight;
    if (ctx->needs_input_grad(0)) {
      d_grad_output =
          call_forward<Dims>(v, weight, std::nullopt, stride, padding, dilation, groups);
    }
    if (ctx->needs_input_grad(1)) {
      d_weight = call_weight_grad<Dims>(v, grad_output, weight.sym_sizes(), stride, padding,
                                        dilation, groups);
    }
    return two_gradients(d_grad_output, d_weight);
  }
};

template <int Dims>
struct WeightGradNode : torch::autograd::Function<WeightGradNode<Dims>> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& grad_output,
                        c10::SymIntArrayRef weight_size, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
    save(ctx, input, grad_output, stride, padding, dilation, groups);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_weight_grad<Dims>(input, grad_output, weight_size, stride, padding, dilation,
                                  groups);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &grad_output = saved[1], &u = grads[0];
    const auto [stride, padding, dilation, groups] = saved_args(ctx);
    Tensor d_input, d_grad_output;
    if (ctx->needs_input_grad(0)) {
      d_input = call_input_grad<Dims>(grad_output, u, input.sym_sizes(), stride, padding, dilation,
                                      groups);
    }
    if (ctx->needs_input_grad(1)) {
      d_grad_output = call_forward<Dims>(input, u, std::nullopt, stride, padding, dilation, groups);
    }
    return two_gradients(d_input, d_grad_output);
  }
};

// ---- The kernels at the Autograd key ------------------------------------------------------------
//
// Where there is nothing for autograd to record (grad mode off, as in every backward call unless
// a higher order is asked for, or no operand requiring grad), each calls its operator below the
// Autograd key straight away, without a node and its saved state: host time that a small GPU layer
// waits for (benchmarks/NOTES.md, section 32). An operand with a forward-mode tangent still goes
// through the node, which refuses it by name (the C++ Functions have no jvp).

bool nothing_to_record(std::initializer_list<const Tensor*> operands) {
  const bool grad_mode = at::GradMode::is_enabled();
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    if ((grad_mode && t->requires_grad()) || t->_fw_grad(/*level=*/0).defined()) return false;
  }
  return true;
}

template <int Dims>
Tensor forward_autograd(const Tensor& input, const Tensor& weight,
                        const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
  if (nothing_to_record({&input, &weight, bias ? &*bias : &input})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_forward<Dims>(input, weight, bias, stride, padding, dilation, groups);
  }
  return ForwardNode<Dims>::apply(input, weight, bias, stride, padding, dilation, groups);
}

template <int Dims>
Tensor input_grad_autograd(const Tensor& grad_output, const Tensor& weight,
                           c10::SymIntArrayRef input_size, IntArrayRef stride, IntArrayRef padding,
                           IntArrayRef dilation, int64_t groups) {
  if (nothing_to_record({&grad_output, &weight})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_input_grad<Dims>(grad_output, weight, input_size, stride, padding, dilation,
                                 groups);
  }
  return InputGradNode<Dims>::apply(grad_output, weight, input_size, stride, padding, dilation,
                                    groups);
}

template <int Dims>
Tensor weight_grad_autograd(const Tensor& input, const Tensor& grad_output,
                            c10::SymIntArrayRef weight_size, IntArrayRef stride,
                            IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  if (nothing_to_record({&input, &grad_output})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_weight_grad<Dims>(input, grad_output, weight_size, stride, padding, dilation,
                                  groups);
  }
  return WeightGradNode<Dims>::apply(input, grad_output, weight_size, stride, padding, dilation,
                                     groups);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, Autograd, m) {
  m.impl("conv2d", &forward_autograd<2>);
  m.impl("conv2d_input_grad", &input_grad_autograd<2>);
  m.impl("conv2d_weight_grad", &weight_grad_autograd<2>);
  m.impl("conv3d", &forward_autograd<3>);
  m.impl("conv3d_input_grad", &input_grad_autograd<3>);
  m.impl("conv3d_weight_grad", &weight_grad_autograd<3>);
}

}  // namespace torch_convbp
