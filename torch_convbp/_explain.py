"""torch_convbp.explain: which route each operator of a convolution takes, and why.

The routes are chosen in C++, by one function (choose_route in csrc/route.cpp); this asks it."""
from typing import NamedTuple

import torch

from . import _C
from ._args import output_memory_format
from ._meta import conv_output_size
from .functional import convolution_arguments


class RouteChoice(NamedTuple):
    """The route one operator takes: its name (csrc/route.h), the layout it computes in ('nchw'
    or 'nhwc'; operands in the other one are copied), and the rule that chose it."""

    operator: str
    route: str
    layout: str
    reason: str

    def __str__(self):
        return f"{self.operator:<12} {self.route} ({self.layout}): {self.reason}"


class Explanation(tuple):
    """The routes of the three operators of one convolution: forward, input_grad, weight_grad.
    Index it by position or by name (explanation['weight_grad']); print it for a table."""

    def __new__(cls, choices):
        return super().__new__(cls, choices)

    def __getitem__(self, key):
        if isinstance(key, str):
            for choice in self:
                if choice.operator == key:
                    return choice
            raise KeyError(f"no operator {key!r}: expected forward, input_grad or weight_grad")
        return super().__getitem__(key)

    def __str__(self):
        return "\n".join(map(str, self))


def explain(input, weight, stride=1, padding=0, dilation=1, groups=1, grad_output=None) -> Explanation:
    """Which route each of the three operators (forward, input_grad, weight_grad) takes for
    torch_convbp.conv2d(input, weight, None, stride, padding, dilation, groups), or conv1d for a
    3-D weight, or conv3d for a 5-D one, and why: the choice the operators make, from the operands' sizes, strides, dtype
    and device. `grad_output` is the output gradient the backward will get; by default, one in
    the output's memory format. Nothing is computed: the tensors' values are never read.

        >>> print(torch_convbp.explain(x, w, padding=1))
        forward      columns (nhwc): channels_last operands, groups of 16 or more channels
        ...
    """
    op = "torch_convbp.explain"
    dims = {3: 1, 5: 3}.get(weight.dim(), 2)
    input, weight, _, stride, padding, dilation = convolution_arguments(
        op, dims, input, weight, None, stride, padding, dilation, groups
    )
    operator_dims = 3 if dims == 3 else 2  # a 1-D call is a 2-D one of unit height
    spatial = conv_output_size(op, operator_dims, input.shape, weight.shape, stride, padding, dilation, groups)
    output_size = [input.shape[0], weight.shape[0], *spatial]
    if grad_output is None:
        grad_output = torch.empty(
            output_size, dtype=input.dtype, device=input.device, memory_format=output_memory_format(input, weight)
        )
    else:
        if grad_output.dim() == dims + 1:  # unbatched
            grad_output = grad_output.unsqueeze(0)
        if dims == 1:
            grad_output = grad_output.unsqueeze(2)
        if list(grad_output.shape) != output_size:
            raise ValueError(f"{op}: expected grad_output of size {output_size} (the convolution's output), got {list(grad_output.shape)}")
    sizes = (list(input.shape), list(weight.shape), list(stride), list(padding), list(dilation), groups)
    operands = {"forward": [input], "input_grad": [grad_output], "weight_grad": [input, grad_output]}
    return Explanation(RouteChoice(name, *_C._route(name, *sizes, tensors)) for name, tensors in operands.items())
