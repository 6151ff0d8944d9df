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
// section 16), which a GPU layer waits for. Their nodes are written as ATen's generated ones are
// (a Node with its saved tensors as members), not as torch::autograd::Function, whose general
// machinery (a context with a hash map of saved data, the outputs' wrapping for views and in-place
// results, the inputs' and outputs' metadata) cost host time on every call (section 81).
#include <ATen/FuncTorchTLS.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <type_traits>

#include "operators.h"

namespace torch_convbp {
namespace {

using at::IntArrayRef;
using at::Tensor;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// ---- What every node saves ---------------------------------------------------------------------

// The convolution's arguments, which every operator takes last and its gradients reuse (2 or 3
// numbers each: no heap memory).
struct ConvArgs {
  c10::SmallVector<int64_t, 3> stride, padding, dilation;
  int64_t groups;
};

// A node of one of the three operators: its two tensors (the operator's inputs, never its output)
// and the convolution's arguments. Its edges are its operator's tensor inputs, in order.
struct ConvNode : Node {
  SavedVariable first, second;
  ConvArgs args;

  void save(const Tensor& first_tensor, const Tensor& second_tensor, IntArrayRef stride,
            IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
    first = SavedVariable(first_tensor, /*is_output=*/false);
    second = SavedVariable(second_tensor, /*is_output=*/false);
    args = {{stride.begin(), stride.end()},
            {padding.begin(), padding.end()},
            {dilation.begin(), dilation.end()},
            groups};
  }

  // After a backward that does not retain the graph: a second one is refused by SavedVariable.
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    first.reset_data();
    second.reset_data();
  }

  // The gradients of the operator's tensor operands (one per edge), for a defined incoming
  // gradient `grad`, each only where task_should_compute_output asks for it: where the edge
  // requires grad and the backward needs it (torch.autograd.grad(y, x) asks for x's only), as
  // ATen's nodes do.
  virtual void gradients(const Tensor& grad, const Tensor& first_tensor,
                         const Tensor& second_tensor, variable_list& result) = 0;

  // None for an undefined incoming gradient (a zero one). The node's mutex is held, as every node
  // that reads saved state must hold it (two backwards through one graph may run in two threads).
  variable_list apply(variable_list&& grads) final {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list result(num_outputs());
    if (grads[0].defined()) gradients(grads[0], first.unpack(), second.unpack(), result);
    return result;
  }
};

// ---- The three nodes, of either dimension ------------------------------------------------------

template <int Dims>
struct ForwardBackward final : ConvNode {
  std::string name() const override {
    return Dims == 2 ? "torch_convbp::Conv2dBackward" : "torch_convbp::Conv3dBackward";
  }

  // Edges: input, weight, bias.
  void gradients(const Tensor& grad, const Tensor& input, const Tensor& weight,
                 variable_list& result) override {
    const auto& [stride, padding, dilation, groups] = args;
    if (task_should_compute_output(0)) {
      result[0] =
          call_input_grad<Dims>(grad, weight, input.sym_sizes(), stride, padding, dilation, groups);
    }
    if (task_should_compute_output(1)) {
      result[1] = call_weight_grad<Dims>(input, grad, weight.sym_sizes(), stride, padding, dilation,
                                         groups);
    }
    // The bias's gradient sums the batch and the pixels (without a bias its edge is invalid, and
    // task_should_compute_output says no).
    if (task_should_compute_output(2)) {
      result[2] = Dims == 2 ? grad.sum({0, 2, 3}) : grad.sum({0, 2, 3, 4});
    }
  }
};

template <int Dims>
struct InputGradBackward final : ConvNode {
  std::string name() const override {
    return Dims == 2 ? "torch_convbp::Conv2dInputGradBackward"
                     : "torch_convbp::Conv3dInputGradBackward";
  }

  // Edges: grad_output, weight; the incoming gradient v.
  void gradients(const Tensor& v, const Tensor& grad_output, const Tensor& weight,
                 variable_list& result) override {
    const auto& [stride, padding, dilation, groups] = args;
    if (task_should_compute_output(0)) {
      result[0] = call_forward<Dims>(v, weight, std::nullopt, stride, padding, dilation, groups);
    }
    if (task_should_compute_output(1)) {
      result[1] = call_weight_grad<Dims>(v, grad_output, weight.sym_sizes(), stride, padding,
                                         dilation, groups);
    }
  }
};

template <int Dims>
struct WeightGradBackward final : ConvNode {
  std::string name() const override {
    return Dims == 2 ? "torch_convbp::Conv2dWeightGradBackward"
                     : "torch_convbp::Conv3dWeightGradBackward";
  }

  // Edges: input, grad_output; the incoming gradient u.
  void gradients(const Tensor& u, const Tensor& input, const Tensor& grad_output,
                 variable_list& result) override {
    const auto& [stride, padding, dilation, groups] = args;
    if (task_should_compute_output(0)) {
      result[0] = call_input_grad<Dims>(grad_output, u, input.sym_sizes(), stride, padding,
                                        dilation, groups);
    }
    if (task_should_compute_output(1)) {
      result[1] = call_forward<Dims>(input, u, std::nullopt, stride, padding, dilation, groups);
    }
  }
};

// ---- The kernels at the Autograd key ------------------------------------------------------------
//
// Where there is nothing for autograd to record (grad mode off, as in every backward call unless
// a higher order is asked for, or no operand requiring grad), each calls its operator below the
// Autograd key straight away, without a node and its saved state: host time that a small GPU layer
// waits for (benchmarks/NOTES.md, section 32). Else it makes the node, saves what the node needs,
// computes below the Autograd key and makes the node the result's grad_fn (autograd_kernel).

// A new node. Newer torch (2.13, 2.14) holds nodes by c10::intrusive_ptr; older (2.11, on the GPU
// machine) by std::shared_ptr, deleted by torch::autograd::deleteNode (which frees a long chain of
// nodes without deep recursion, and is gone where nodes are intrusive). It is called unqualified,
// on the node's type, so that it is looked up only where that branch is compiled (ADL finds it in
// the namespace of Node, the node's base).
template <class NodeType>
auto new_node() {
  using NodePointer = decltype(torch::autograd::Edge::function);
  if constexpr (std::is_same_v<NodePointer, std::shared_ptr<Node>>) {
    return std::shared_ptr<NodeType>(new NodeType(), [](NodeType* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<NodeType>();
  }
}

// The operators' own nodes are reverse mode only: an operand with a forward-mode tangent (a dual
// tensor) is refused by name, never its tangent dropped. torch_convbp's Python functions take
// tangents and torch.func's transforms on Python autograd Functions instead
// (torch_convbp/_func.py).
void refuse_tangents(const char* op, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands) {
    TORCH_CHECK(!t->defined() || !t->_fw_grad(/*level=*/0).defined(), op,
                ": forward-mode AD is not implemented on the operator (an operand is a dual "
                "tensor, with a tangent); call torch_convbp's functions (torch_convbp.conv2d, "
                "...), which take tangents, or differentiate in reverse mode");
  }
}

bool nothing_to_record(const char* op, std::initializer_list<const Tensor*> operands) {
  refuse_tangents(op, operands);
  if (!at::GradMode::is_enabled()) return true;
  for (const Tensor* t : operands) {
    if (t->defined() && t->requires_grad()) return false;
  }
  return true;
}

// An operator's kernel at the Autograd key: `compute` below the Autograd key, and where there is
// something to record, a new NodeType as the result's grad_fn, whose edges are `operands` (the
// operator's tensor inputs, in order; an undefined one, no bias, gets an invalid edge) and which
// saves the first two and the convolution's arguments. Under torch.func's transforms (vmap, grad,
// ...), which see through Python autograd functions only, a recorded call is refused, as for any
// C++ node (torch_convbp's Python functions call torch_convbp/_func.py's Functions there).
template <class NodeType, class Compute>
Tensor autograd_kernel(const char* op, std::initializer_list<const Tensor*> operands,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                       int64_t groups, Compute compute) {
  if (nothing_to_record(op, operands)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return compute();
  }
  if (const auto& functorch_tls = at::functorch::functorchTLSAccessor()) {
    functorch_tls->checkSupportsCppAutogradFunction();
  }
  auto node = new_node<NodeType>();
  torch::autograd::edge_list edges;
  for (const Tensor* t : operands) {
    edges.push_back(t->defined() ? torch::autograd::impl::gradient_edge(*t)
                                 : torch::autograd::Edge());
  }
  node->set_next_edges(std::move(edges));
  node->save(*operands.begin()[0], *operands.begin()[1], stride, padding, dilation, groups);
  Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    result = compute();
  }
  torch::autograd::set_history(result, node);
  return result;
}

template <int Dims>
Tensor forward_autograd(const Tensor& input, const Tensor& weight,
                        const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, int64_t groups) {
  const Tensor& bias_tensor = bias ? *bias : Tensor();
  return autograd_kernel<ForwardBackward<Dims>>(
      OperatorNames<Dims>::forward, {&input, &weight, &bias_tensor}, stride, padding, dilation,
      groups,
      [&] { return call_forward<Dims>(input, weight, bias, stride, padding, dilation, groups); });
}

template <int Dims>
Tensor input_grad_autograd(const Tensor& grad_output, const Tensor& weight,
                           c10::SymIntArrayRef input_size, IntArrayRef stride, IntArrayRef padding,
                           IntArrayRef dilation, int64_t groups) {
  return autograd_kernel<InputGradBackward<Dims>>(
      OperatorNames<Dims>::input_grad, {&grad_output, &weight}, stride, padding, dilation, groups,
      [&] {
        return call_input_grad<Dims>(grad_output, weight, input_size, stride, padding, dilation,
                                     groups);
      });
}

template <int Dims>
Tensor weight_grad_autograd(const Tensor& input, const Tensor& grad_output,
                            c10::SymIntArrayRef weight_size, IntArrayRef stride,
                            IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  return autograd_kernel<WeightGradBackward<Dims>>(
      OperatorNames<Dims>::weight_grad, {&input, &grad_output}, stride, padding, dilation, groups,
      [&] {
        return call_weight_grad<Dims>(input, grad_output, weight_size, stride, padding, dilation,
                                      groups);
      });
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
