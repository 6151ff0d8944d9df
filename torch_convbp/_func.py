"""The three operators as torch.autograd.Functions, for torch.func's transforms and forward-mode AD.

Eager calls take the operators' own autograd, nodes written in C++ (csrc/autograd.cpp): less host
time, but torch.func's grad, vjp, jacrev and jvp and forward-mode dual tensors cannot see through a
C++ node. Where one of those is active (functional._operators asks `transforms_active`), the
functional layer calls these Functions instead. They compute with the same operators, and their
derivatives are the same three operators again, so every order works here too:

    y  = conv(x, W) + b           dL/dx = input_grad(g, W)    dL/dW = weight_grad(x, g)
    dx = input_grad(g, W)         d<v, dx>/dg = conv(v, W)    d<v, dx>/dW = weight_grad(v, g)
    dW = weight_grad(x, g)        d<v, dW>/dx = input_grad(g, v)   d<v, dW>/dg = conv(x, v)

Each is linear in each operand, so a tangent (forward mode) is the same operator with one operand
replaced by its tangent, summed over the operands that carry one.

vmap folds the mapped dimension into the operators' own dimensions rather than looping: into the
batch where only the images (x, g) are mapped, else into the groups, B x G groups of one weight
each (a per-sample gradient is a weight gradient of B groups).
"""
import dataclasses
from typing import Optional, Sequence

import torch
import torch.autograd.forward_ad as forward_ad

_ops = torch.ops.torch_convbp

# The operators by their operands' rank: 4 for 1-D and 2-D calls, 5 for 3-D ones.
_CONVOLUTION = {4: _ops.conv2d, 5: _ops.conv3d}
_INPUT_GRAD = {4: _ops.conv2d_input_grad, 5: _ops.conv3d_input_grad}
_WEIGHT_GRAD = {4: _ops.conv2d_weight_grad, 5: _ops.conv3d_weight_grad}


_functorch_transforms_active = torch._C._are_functorch_transforms_active


def transforms_active():
    """Whether a torch.func transform (grad, vjp, jvp, vmap, ...) or a forward-AD dual level is on:
    the calls that the operators' C++ nodes cannot serve. Asked on every eager call, so kept to a
    C call and an attribute read (their cost: benchmarks/NOTES.md, section 126)."""
    return _functorch_transforms_active() or forward_ad._current_level >= 0


def _sum_of(*terms):
    """The sum of the terms that are not None (a tangent of operands without one is None)."""
    present = [t for t in terms if t is not None]
    return sum(present[1:], present[0]) if present else None


def _batch_first(t, dim, batch):
    """The mapped operand with its mapped dimension first; an unmapped one broadcast to it."""
    return t.expand(batch, *t.shape) if dim is None else t.movedim(dim, 0)


def _into_groups(images):
    """[B, N, C, ...] -> [N, B*C, ...]: mapping b's channels become group block b."""
    return images.movedim(0, 1).flatten(1, 2)


def _bilinear_tangent(function, ctx, t_first, t_second):
    """The tangent of function(first, second), linear in each: function(t_first, second) +
    function(first, t_second), the terms of operands without a tangent left out."""
    first, second = ctx.saved_tensors
    return _sum_of(
        None if t_first is None else function.apply(t_first, second, ctx.geometry),
        None if t_second is None else function.apply(first, t_second, ctx.geometry),
    )


@dataclasses.dataclass(frozen=True)
class Geometry:
    """An operator's arguments other than its tensors, as one object: torch.func flattens every
    argument of a Function at every transform level, and one leaf costs less host time than a
    dozen ints. `size` is the input gradient's input size, or the weight gradient's weight size."""
    stride: Sequence[int]
    padding: Sequence[int]
    dilation: Sequence[int]
    groups: int
    size: Optional[Sequence[int]] = None

    def arguments(self):
        return self.stride, self.padding, self.dilation, self.groups

    def sized(self, size):
        return dataclasses.replace(self, size=list(size))

    def mapped(self, batch, size=None):
        """The geometry of B mappings folded into B x G groups (and a result of `size`)."""
        return dataclasses.replace(self, groups=self.groups * batch, size=size)


class Convolution(torch.autograd.Function):
    """conv(input, weight) + bias, the operator conv2d or conv3d."""

    @staticmethod
    def forward(input, weight, bias, geometry):
        return _CONVOLUTION[input.dim()](input, weight, bias, *geometry.arguments())

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, _, ctx.geometry = inputs
        ctx.output_shape = output.shape
        ctx.save_for_backward(input, weight)
        ctx.save_for_forward(input, weight)

    @staticmethod
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        want_input, want_weight, want_bias = ctx.needs_input_grad[:3]
        geometry = ctx.geometry
        d_input = InputGrad.apply(grad, weight, geometry.sized(input.shape)) if want_input else None
        d_weight = WeightGrad.apply(input, grad, geometry.sized(weight.shape)) if want_weight else None
        d_bias = grad.sum([0, *range(2, grad.dim())]) if want_bias else None
        return d_input, d_weight, d_bias, None

    @staticmethod
    def jvp(ctx, t_input, t_weight, t_bias, _):
        input, weight = ctx.saved_tensors
        tangent = _sum_of(
            None if t_input is None else Convolution.apply(t_input, weight, None, ctx.geometry),
            None if t_weight is None else Convolution.apply(input, t_weight, None, ctx.geometry),
        )
        if t_bias is None:
            return tangent
        t_bias = t_bias.view(1, -1, *[1] * (len(ctx.output_shape) - 2))
        return t_bias.expand(ctx.output_shape).contiguous() if tangent is None else tangent + t_bias

    @staticmethod
    def vmap(info, in_dims, input, weight, bias, geometry):
        input_dim, weight_dim, bias_dim = in_dims[:3]
        batch = info.batch_size
        shared_bias = None if bias_dim is not None else bias
        if weight_dim is None and input_dim is None:  # only the bias is mapped
            output = Convolution.apply(input, weight, None, geometry).unsqueeze(0)
        elif weight_dim is None:  # images of every mapping in one batch
            images = input.movedim(input_dim, 0)
            output = Convolution.apply(images.flatten(0, 1), weight, shared_bias, geometry)
            output = output.unflatten(0, (batch, -1))
        else:  # one weight per mapping: B x G groups
            images = _into_groups(_batch_first(input, input_dim, batch))
            weights = weight.movedim(weight_dim, 0).flatten(0, 1)
            biases = None if shared_bias is None else shared_bias.repeat(batch)
            output = Convolution.apply(images, weights, biases, geometry.mapped(batch))
            output = output.unflatten(1, (batch, -1)).movedim(1, 0)
        if bias_dim is not None:
            spatial = output.dim() - 3
            output = output + bias.movedim(bias_dim, 0).view(batch, 1, -1, *[1] * spatial)
        return output, 0


class _GradientOperator(torch.autograd.Function):
    """A gradient operator, function(first, second, geometry): both tensors kept for the backward
    and for the tangent (_bilinear_tangent)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        first, second, ctx.geometry = inputs
        ctx.save_for_backward(first, second)
        ctx.save_for_forward(first, second)


class InputGrad(_GradientOperator):
    """input_grad(grad_output, weight): dL/dinput of a convolution of input size geometry.size,
    the operator conv2d_input_grad or conv3d_input_grad (a transposed convolution)."""

    @staticmethod
    def forward(grad_output, weight, geometry):
        return _INPUT_GRAD[grad_output.dim()](grad_output, weight, geometry.size, *geometry.arguments())

    @staticmethod
    def backward(ctx, v):
        grad_output, weight = ctx.saved_tensors
        want_grad_output, want_weight = ctx.needs_input_grad[:2]
        geometry = ctx.geometry
        d_grad_output = Convolution.apply(v, weight, None, geometry) if want_grad_output else None
        d_weight = WeightGrad.apply(v, grad_output, geometry.sized(weight.shape)) if want_weight else None
        return d_grad_output, d_weight, None

    @staticmethod
    def jvp(ctx, t_grad_output, t_weight, _):
        return _bilinear_tangent(InputGrad, ctx, t_grad_output, t_weight)

    @staticmethod
    def vmap(info, in_dims, grad_output, weight, geometry):
        grad_dim, weight_dim = in_dims[:2]
        batch, size = info.batch_size, geometry.size
        if weight_dim is None:  # images of every mapping in one batch
            grads = grad_output.movedim(grad_dim, 0).flatten(0, 1)
            output = InputGrad.apply(grads, weight, geometry.sized([batch * size[0], *size[1:]]))
            return output.unflatten(0, (batch, -1)), 0
        grads = _into_groups(_batch_first(grad_output, grad_dim, batch))
        weights = weight.movedim(weight_dim, 0).flatten(0, 1)
        output = InputGrad.apply(grads, weights, geometry.mapped(batch, [size[0], batch * size[1], *size[2:]]))
        return output.unflatten(1, (batch, -1)), 1


class WeightGrad(_GradientOperator):
    """weight_grad(input, grad_output): dL/dweight of a convolution of weight size geometry.size,
    the operator conv2d_weight_grad or conv3d_weight_grad."""

    @staticmethod
    def forward(input, grad_output, geometry):
        return _WEIGHT_GRAD[input.dim()](input, grad_output, geometry.size, *geometry.arguments())

    @staticmethod
    def backward(ctx, v):
        input, grad_output = ctx.saved_tensors
        want_input, want_grad_output = ctx.needs_input_grad[:2]
        geometry = ctx.geometry
        d_input = InputGrad.apply(grad_output, v, geometry.sized(input.shape)) if want_input else None
        d_grad_output = Convolution.apply(input, v, None, geometry) if want_grad_output else None
        return d_input, d_grad_output, None

    @staticmethod
    def jvp(ctx, t_input, t_grad_output, _):
        return _bilinear_tangent(WeightGrad, ctx, t_input, t_grad_output)

    @staticmethod
    def vmap(info, in_dims, input, grad_output, geometry):
        # The weight gradient sums over the batch, so the mappings cannot share it: B x G groups.
        batch, size = info.batch_size, geometry.size
        images = _into_groups(_batch_first(input, in_dims[0], batch))
        grads = _into_groups(_batch_first(grad_output, in_dims[1], batch))
        output = WeightGrad.apply(images, grads, geometry.mapped(batch, [batch * size[0], *size[1:]]))
        return output.unflatten(0, (batch, -1)), 0


def convolution(input, weight, bias, stride, padding, dilation, groups):
    return Convolution.apply(input, weight, bias, Geometry(stride, padding, dilation, groups))


def input_grad(grad_output, weight, input_size, stride, padding, dilation, groups):
    return InputGrad.apply(grad_output, weight, Geometry(stride, padding, dilation, groups, list(input_size)))
