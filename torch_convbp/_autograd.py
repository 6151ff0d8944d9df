"""Autograd for the three operators, each differentiated with the others.

With y = conv2d(x, W) and <a, b> the sum of a*b, the two gradient operators are the adjoints
    <conv2d(x, W), g> = <x, conv2d_input_grad(g, W)> = <W, conv2d_weight_grad(x, g)>,
so each is linear in both of its tensors, and its gradients are again among the three:
    conv2d_input_grad(g, W), incoming v:  dg = conv2d(v, W),           dW = conv2d_weight_grad(v, g)
    conv2d_weight_grad(x, g), incoming u: dx = conv2d_input_grad(g, u), dg = conv2d(x, u)
Gradients of any order therefore need nothing else. Only the gradients asked for are computed.
"""
import torch

_ops = torch.ops.torch_convbp


def _setup(ctx, inputs, output):
    # Every operator's two tensors come first and its convolution arguments last.
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.conv_args = inputs[-4:]  # stride, padding, dilation, groups


def _conv2d_setup(ctx, inputs, output):
    _setup(ctx, inputs, output)
    ctx.has_bias = inputs[2] is not None


def _conv2d_backward(ctx, grad):
    x, w = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx = _ops.conv2d_input_grad(grad, w, x.shape, *ctx.conv_args) if needs[0] else None
    dw = _ops.conv2d_weight_grad(x, grad, w.shape, *ctx.conv_args) if needs[1] else None
    db = grad.sum((0, 2, 3)) if ctx.has_bias and needs[2] else None
    return dx, dw, db, None, None, None, None


def _input_grad_backward(ctx, v):
    g, w = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dg = _ops.conv2d(v, w, None, *ctx.conv_args) if needs[0] else None
    dw = _ops.conv2d_weight_grad(v, g, w.shape, *ctx.conv_args) if needs[1] else None
    return dg, dw, None, None, None, None, None


def _weight_grad_backward(ctx, u):
    x, g = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx = _ops.conv2d_input_grad(g, u, x.shape, *ctx.conv_args) if needs[0] else None
    dg = _ops.conv2d(x, u, None, *ctx.conv_args) if needs[1] else None
    return dx, dg, None, None, None, None, None


torch.library.register_autograd("torch_convbp::conv2d", _conv2d_backward, setup_context=_conv2d_setup)
torch.library.register_autograd(
    "torch_convbp::conv2d_input_grad", _input_grad_backward, setup_context=_setup
)
torch.library.register_autograd(
    "torch_convbp::conv2d_weight_grad", _weight_grad_backward, setup_context=_setup
)
