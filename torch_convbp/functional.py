"""torch_convbp.conv2d: the argument forms of F.conv2d, normalised onto the operator."""
from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import channels_last
from torch._prims_common import suggest_memory_format

from . import _C  # noqa: F401  (registers torch.ops.torch_convbp)

_IntOrPair = Union[int, Sequence[int]]

# Whether CUDA kernels were built in (decided once, so torch.compile sees a constant).
CUDA_KERNELS = torch._C._dispatch_has_kernel_for_dispatch_key("torch_convbp::im2col", "CUDA")


def _pair(name: str, value: _IntOrPair) -> tuple:
    """An int, or a sequence of 1 or 2 ints, as (height, width) — the forms F.conv2d accepts."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list, torch.Size)) and len(value) in (1, 2):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return (value[0], value[-1])
    raise ValueError(
        f"torch_convbp.conv2d: expected {name} to be a single integer value or a list of 2 integer "
        f"values to match the convolution dimensions, but got {name}={value!r}"
    )


def _same_padding(input, weight, stride, dilation):
    """padding='same' as symmetric padding plus, for an odd total, one extra row/column at the
    bottom/right (done by padding the input), as F.conv2d does. Returns (input, padding)."""
    if stride != (1, 1):
        raise ValueError("torch_convbp.conv2d: padding='same' is not supported for strided convolutions")
    if weight.dim() != 4:  # the operator reports the wrong rank
        return input, (0, 0)
    total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    extra_h, extra_w = total[0] % 2, total[1] % 2
    if extra_h or extra_w:
        input = F.pad(input, (0, extra_w, 0, extra_h))
    return input, (total[0] // 2, total[1] // 2)


def _autocast(device_type: str, *tensors):
    """Under autocast, the tensors in the autocast dtype (the operators run in one dtype)."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t if t is None or not t.is_floating_point() else t.to(dtype) for t in tensors)


def conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor = None,
    stride: _IntOrPair = 1,
    padding: Union[_IntOrPair, str] = 0,
    dilation: _IntOrPair = 1,
    groups: int = 1,
) -> torch.Tensor:
    """2-D convolution with the semantics of torch.nn.functional.conv2d, computed as im2col + GEMM.

    input: (N, C_in, H, W) or unbatched (C_in, H, W); weight: (C_out, C_in/groups, kH, kW);
    bias: (C_out,) or None; stride, dilation: int or (sH, sW); padding: int, (pH, pW), 'valid' or
    'same'; groups: int. Differentiable to any order in input, weight and bias.
    """
    stride, dilation = _pair("stride", stride), _pair("dilation", dilation)
    if input.dim() not in (3, 4):
        raise RuntimeError(
            "torch_convbp.conv2d: expected 3D (unbatched) or 4D (batched) input, "
            f"but got input of size: {list(input.shape)}"
        )
    if input.is_cuda and not CUDA_KERNELS:
        raise RuntimeError(
            "torch_convbp.conv2d: got a CUDA tensor, but torch_convbp was built without CUDA kernels; "
            "rebuild it with a CUDA build of torch and a CUDA toolkit (see the README)"
        )
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
    input, weight, bias = _autocast(input.device.type, input, weight, bias)

    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":
            input, padding = _same_padding(input, weight, stride, dilation)
        else:
            raise ValueError(f"torch_convbp.conv2d: invalid padding string {padding!r}, expected 'same' or 'valid'")
    else:
        padding = _pair("padding", padding)
    if not isinstance(groups, int) or isinstance(groups, bool):
        raise ValueError(f"torch_convbp.conv2d: expected groups to be an integer, got {groups!r}")

    output = torch.ops.torch_convbp.conv2d(input, weight, bias, stride, padding, dilation, groups)
    output = output.contiguous(memory_format=_output_memory_format(input, weight))
    return output.squeeze(0) if unbatched else output


def _output_memory_format(input, weight):
    """channels_last when the input or the weight is channels_last, as F.conv2d decides (except
    for an empty batch, whose output it leaves NCHW). The operators compute in NCHW; a
    channels_last output is one copy away."""
    if input.dim() == 4 and weight.dim() == 4 and input.shape[0] > 0:
        if channels_last in (suggest_memory_format(input), suggest_memory_format(weight)):
            return channels_last
    return torch.contiguous_format
