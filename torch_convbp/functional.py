"""The convolution family as torch.nn.functional spells it, on the three operators.

    conv2d            = torch_convbp::conv2d
    conv1d            = conv2d of unit height
    conv_transpose2d  = torch_convbp::conv2d_input_grad (the adjoint of conv2d), plus the bias
    conv_transpose1d  = conv_transpose2d of unit height
    conv3d            = torch_convbp::conv3d (the same engine: a 2-D convolution is a 3-D one of depth 1)
    conv_transpose3d  = torch_convbp::conv3d_input_grad, plus the bias

A transposed convolution is the gradient of a convolution with respect to its input, so its own
gradients are the convolution and its weight gradient, and gradients of any order need no new
operator.
"""
import torch
import torch.nn.functional as F
from torch.overrides import has_torch_function_variadic

from . import _C, _func
from ._args import (
    autocast,
    check_tensors,
    check_groups,
    check_input_rank,
    check_weight_rank,
    cuda_result_contiguous,
    int_tuple,
    string_padding,
)

_ops = torch.ops.torch_convbp


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution with the semantics of torch.nn.functional.conv2d, computed as im2col + GEMM.

    input: (N, C_in, H, W) or unbatched (C_in, H, W); weight: (C_out, C_in/groups, kH, kW);
    bias: (C_out,) or None; stride, dilation: int or (sH, sW); padding: int, (pH, pW), 'valid' or
    'same'; groups: int. Differentiable to any order in input, weight and bias.
    """
    return _convolution("torch_convbp.conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution with the semantics of torch.nn.functional.conv1d: a 2-D one of unit height.

    input: (N, C_in, L) or unbatched (C_in, L); weight: (C_out, C_in/groups, kL); padding: int,
    (p,), 'valid' or 'same'. Differentiable to any order.
    """
    return _convolution("torch_convbp.conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """2-D transposed convolution with the semantics (and argument order) of
    torch.nn.functional.conv_transpose2d: the input gradient of a convolution.

    input: (N, C_in, H, W) or unbatched (C_in, H, W); weight: (C_in, C_out/groups, kH, kW);
    the output is (N, C_out, OH, OW) with OH = (H - 1)·sH - 2·pH + dH·(kH - 1) + output_padding + 1.
    Differentiable to any order.
    """
    return _transposed_convolution(
        "torch_convbp.conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """1-D transposed convolution with the semantics of torch.nn.functional.conv_transpose1d:
    a 2-D one of unit height. input: (N, C_in, L) or (C_in, L); weight: (C_in, C_out/groups, kL)."""
    return _transposed_convolution(
        "torch_convbp.conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-D convolution with the semantics of torch.nn.functional.conv3d, computed as vol2col + GEMM.

    input: (N, C_in, D, H, W) or unbatched (C_in, D, H, W); weight: (C_out, C_in/groups, kD, kH, kW);
    bias: (C_out,) or None; stride, dilation: int or (sD, sH, sW); padding: int, (pD, pH, pW),
    'valid' or 'same'; groups: int. Differentiable to any order in input, weight and bias.
    """
    return _convolution("torch_convbp.conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """3-D transposed convolution with the semantics of torch.nn.functional.conv_transpose3d: the
    input gradient of a 3-D convolution. input: (N, C_in, D, H, W) or (C_in, D, H, W); weight:
    (C_in, C_out/groups, kD, kH, kW). Differentiable to any order.
    """
    return _transposed_convolution(
        "torch_convbp.conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


# (convolution, its input gradient) for 2-D and 3-D calls: the torch.ops operators, and their
# direct calls (_C.conv2d, ...), which take the same arguments with less host time
# (benchmarks/NOTES.md, section 90).
_OPERATORS = {2: (_ops.conv2d, _ops.conv2d_input_grad), 3: (_ops.conv3d, _ops.conv3d_input_grad)}
_DIRECT_CALLS = {2: (_C.conv2d, _C.conv2d_input_grad), 3: (_C.conv3d, _C.conv3d_input_grad)}


def _operators(dims, input, weight, bias):
    """(convolution, its input gradient) for 1-D and 2-D calls (as 2-D ones) or 3-D calls: in
    eager code the direct calls, else torch.ops: torch.compile traces only those, and only they
    offer the call to __torch_function__ (tensor subclasses, torch function modes). Under a
    torch.func transform or a forward-AD dual level, the operators as Python autograd Functions,
    which those can differentiate and map (_func.py)."""
    if torch.compiler.is_compiling() or has_torch_function_variadic(input, weight, bias):
        return _OPERATORS[3 if dims == 3 else 2]
    if _func.transforms_active():
        return _func.convolution, _func.input_grad
    return _DIRECT_CALLS[3 if dims == 3 else 2]


def _convolution(op, dims, input, weight, bias, stride, padding, dilation, groups):
    unbatched = input.dim() == dims + 1
    input, weight, bias, stride, padding, dilation = convolution_arguments(
        op, dims, input, weight, bias, stride, padding, dilation, groups
    )
    convolution, _ = _operators(dims, input, weight, bias)
    output = convolution(input, weight, bias, stride, padding, dilation, groups)
    return _as_given(output, dims, unbatched, input)


def convolution_arguments(op, dims, input, weight, bias, stride, padding, dilation, groups):
    """The arguments of a 1-D, 2-D or 3-D convolution as the operators take them: a batched input
    and weight of 4 dimensions (a unit height for 1-D) or 5, pairs or triples of ints (a string
    padding resolved, the input padded where 'same' needs an odd total), and the autocast dtype
    under autocast. Returns (input,
    weight, bias, stride, padding, dilation)."""
    check_tensors(op, input, weight, bias)
    check_input_rank(op, input, dims)
    if dims in (1, 3):  # read by 'same' padding, and reshaped for 1-D
        check_weight_rank(op, weight, dims)
    stride, dilation = int_tuple(op, "stride", stride, dims), int_tuple(op, "dilation", dilation, dims)
    if not isinstance(padding, str):
        padding = int_tuple(op, "padding", padding, dims)
    check_groups(op, groups)
    if input.dim() == dims + 1:  # unbatched
        input = input.unsqueeze(0)
    if dims == 1:  # a unit height: kernel 1, stride 1, no padding, in the first dimension
        input, weight = input.unsqueeze(2), weight.unsqueeze(2)
        stride, dilation = (1, *stride), (1, *dilation)
        padding = padding if isinstance(padding, str) else (0, *padding)
    input, weight, bias = autocast(input, weight, bias)
    if isinstance(padding, str):
        input, padding = string_padding(op, padding, input, weight, stride, dilation)
    return input, weight, bias, stride, padding, dilation


def _transposed_convolution(op, dims, input, weight, bias, stride, padding, output_padding, groups, dilation):
    check_tensors(op, input, weight, bias)
    check_input_rank(op, input, dims)
    check_weight_rank(op, weight, dims)
    stride, padding, output_padding, dilation = (
        int_tuple(op, name, value, dims)
        for name, value in (("stride", stride), ("padding", padding), ("output_padding", output_padding),
                            ("dilation", dilation))
    )
    check_groups(op, groups)
    unbatched = input.dim() == dims + 1
    if unbatched:
        input = input.unsqueeze(0)
    if dims == 1:  # a unit height
        input, weight = input.unsqueeze(2), weight.unsqueeze(2)
        stride, padding, output_padding, dilation = (1, *stride), (0, *padding), (0, *output_padding), (1, *dilation)
    input, weight, bias = autocast(input, weight, bias)
    output_size = _transposed_output_size(op, input, weight, stride, padding, output_padding, dilation, groups)
    _check_transposed_bias(op, input, bias, output_size[1])

    _, input_grad = _operators(dims, input, weight, bias)
    if all(o < s for o, s in zip(output_padding, stride)):
        # The usual case: the convolution of this stride and padding maps output_size back onto
        # the input's size, so the input gradient of that convolution is the whole answer.
        output = input_grad(input, weight, output_size, stride, padding, dilation, groups)
    else:
        # output_padding >= stride (allowed where it is below the dilation): no convolution of this
        # padding maps output_size onto the input's size. Compute the unpadded result, then crop
        # the padding and add output_padding rows/columns, which no kernel tap reaches (zeros).
        full = [(i - 1) * s + d * (k - 1) + 1 for i, s, d, k in zip(input.shape[2:], stride, dilation, weight.shape[2:])]
        output = input_grad(input, weight, [*output_size[:2], *full], stride, (0,) * len(full), dilation, groups)
        # F.pad lists (before, after) pairs from the last dimension back.
        crop = [(-p, p + o - f) for p, o, f in zip(padding, output_size[2:], full)]
        output = F.pad(output, [n for pair in reversed(crop) for n in pair])
    if bias is not None:
        output = output + bias.view(1, -1, *[1] * (output.dim() - 2))
    return _as_given(output, dims, unbatched, input)


def _as_given(output, dims, unbatched, input):
    """The operator's result in the form of the call: without the unit height of a 1-D call,
    without the batch dimension of an unbatched one, and in torch.nn.functional's memory format."""
    if dims == 1:
        output = output.squeeze(2)
    elif cuda_result_contiguous(input):
        # Everywhere else the operators' format is F's already (output_memory_format); tested
        # here rather than by output_memory_format and a copy call on every CUDA call, which cost
        # 10 us of host time on a slow CPU (benchmarks/NOTES.md, section 82).
        output = output.contiguous()
    return output.squeeze(0) if unbatched else output


def _transposed_output_size(op, input, weight, stride, padding, output_padding, dilation, groups):
    """[N, C_out, OH, OW] (or [N, C_out, OD, OH, OW]) of a transposed convolution, after the checks that only its own argument
    forms need: the operator checks the convolution it runs (groups, channels of the weight)."""
    if any(s <= 0 for s in stride) or any(d <= 0 for d in dilation):
        raise RuntimeError(f"{op}: stride and dilation must be positive, got stride={list(stride)}, dilation={list(dilation)}")
    if any(p < 0 for p in padding) or any(o < 0 for o in output_padding):
        raise RuntimeError(
            f"{op}: padding and output_padding must be non-negative, got padding={list(padding)}, "
            f"output_padding={list(output_padding)}"
        )
    if any(o >= s and o >= d for o, s, d in zip(output_padding, stride, dilation)):
        raise RuntimeError(
            f"{op}: output_padding must be smaller than either stride or dilation, got "
            f"output_padding={list(output_padding)}, stride={list(stride)}, dilation={list(dilation)}"
        )
    if input.shape[1] != weight.shape[0]:
        raise RuntimeError(
            f"{op}: given weight of size {list(weight.shape)}, expected input of size {list(input.shape)} to have "
            f"{weight.shape[0]} channels (the weight's dimension 0), but got {input.shape[1]} channels instead"
        )
    size = [
        (i - 1) * s - 2 * p + d * (k - 1) + o + 1
        for i, s, p, d, k, o in zip(input.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding)
    ]
    if any(n <= 0 for n in size):
        raise RuntimeError(
            f"{op}: the output size per channel ({' x '.join(map(str, size))}) must be positive; it is "
            "(input - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1"
        )
    return [input.shape[0], weight.shape[1] * groups, *size]


def _check_transposed_bias(op, input, bias, channels):
    """The bias is added here, not by an operator, so it is checked here."""
    if bias is None:
        return
    if bias.dim() != 1 or bias.shape[0] != channels:
        raise RuntimeError(f"{op}: expected bias of size [{channels}] (one per output channel), got {list(bias.shape)}")
    if bias.dtype != input.dtype or bias.device != input.device:
        raise RuntimeError(
            f"{op}: input ({input.dtype}, {input.device}) and bias ({bias.dtype}, {bias.device}) must have the "
            "same dtype and device"
        )
