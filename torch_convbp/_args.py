"""Argument normalisation shared by the functions of torch_convbp.functional: the forms of the
torch.nn.functional arguments, brought to what the operators take. Nothing numeric here."""
from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import channels_last
from torch._prims_common import suggest_memory_format

from . import _C  # noqa: F401  (registers torch.ops.torch_convbp)

IntOrTuple = Union[int, Sequence[int]]

# Whether CUDA kernels were built in (decided once, so torch.compile sees a constant).
CUDA_KERNELS = torch._C._dispatch_has_kernel_for_dispatch_key("torch_convbp::im2col", "CUDA")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_tuple(op: str, name: str, value: IntOrTuple, n: int) -> tuple:
    """An int, or a sequence of 1 or n ints, as an n-tuple: the forms torch.nn.functional takes."""
    if type(value) is int:  # the usual case first (host time: benchmarks/NOTES.md, section 32)
        return (value,) * n
    if is_int(value):
        return (value,) * n
    if isinstance(value, (tuple, list, torch.Size)) and len(value) in (1, n) and all(map(is_int, value)):
        return tuple(value) * (n // len(value))
    raise ValueError(
        f"{op}: expected {name} to be a single integer value or a list of {n} integer values to match the "
        f"convolution dimensions, but got {name}={value!r}"
    )


def check_groups(op: str, groups) -> None:
    if not is_int(groups):
        raise ValueError(f"{op}: expected groups to be an integer, got {groups!r}")


def check_input_rank(op: str, input, dims: int) -> None:
    """dims + 1 dimensions (unbatched) or dims + 2 (batched)."""
    if input.dim() not in (dims + 1, dims + 2):
        raise RuntimeError(
            f"{op}: expected {dims + 1}D (unbatched) or {dims + 2}D (batched) input, "
            f"but got input of size: {list(input.shape)}"
        )


def check_weight_rank(op: str, weight, dims: int) -> None:
    """Where Python reads or reshapes the weight (the operators check the 2-D weight's rank)."""
    if weight.dim() != dims + 2:
        raise RuntimeError(f"{op}: expected a {dims + 2}-D weight, got size {list(weight.shape)}")


# The devices torch_convbp computes on: the CPU, CUDA (where built with its kernels), and meta
# (sizes only, no values: shape inference, models built before to_empty()).
DEVICES = ("cpu", "cuda", "meta")


def computable(t) -> bool:
    """A tensor torch_convbp computes on: dense, not quantized, on the CPU or (where built with its
    kernels) CUDA. In a few attribute reads: host time (benchmarks/NOTES.md, sections 32 and 47)."""
    return (t.is_cpu or (t.is_cuda and CUDA_KERNELS)) and t.layout == torch.strided and not (t.is_nested or t.is_quantized)


def check_tensor(op: str, name: str, t) -> None:
    """The kinds of tensor torch_convbp does not compute on, refused by name: nested, sparse (any
    non-strided layout), quantized, and devices without kernels."""
    if t is None or computable(t):
        return
    if t.is_nested:
        raise RuntimeError(f"{op}: {name} is a nested tensor; torch_convbp computes on dense tensors only "
                           "(unbind it and convolve each tensor, or pad them to one size)")
    if t.layout != torch.strided:
        raise RuntimeError(f"{op}: {name} must be a dense (strided) tensor, got layout {t.layout} "
                           "(to_dense() it first)")
    if t.is_quantized:
        raise RuntimeError(f"{op}: {name} is quantized ({t.dtype}); torch_convbp computes in floating point "
                           "(dequantize() it first)")
    if t.device.type not in DEVICES:
        raise RuntimeError(f"{op}: {name} is on device '{t.device}', where torch_convbp has no kernels; it computes on "
                           f"{', '.join(DEVICES[:-1])} (and meta, for shapes)")
    if t.device.type == "cuda" and not CUDA_KERNELS:
        raise RuntimeError(
            f"{op}: got a CUDA tensor, but torch_convbp was built without CUDA kernels; "
            "rebuild it with a CUDA build of torch and a CUDA toolkit (see the README)"
        )


def check_tensors(op: str, input, weight, bias) -> None:
    """check_tensor for a call's input, weight and bias (None where there is none)."""
    if computable(input) and computable(weight) and (bias is None or computable(bias)):
        return
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        check_tensor(op, name, t)


def autocast(*tensors):
    """Under autocast for the first tensor's device, the tensors in the autocast dtype (the
    operators run in one dtype). Devices without autocast (meta, for one) are never under it."""
    input = tensors[0]
    device_type = "cpu" if input.is_cpu else input.device.type  # the CPU's without a device object
    if device_type not in ("cpu", "cuda") and not torch.amp.is_autocast_available(device_type):
        return tensors
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t if t is None or not t.is_floating_point() else t.to(dtype) for t in tensors)


def string_padding(op: str, padding: str, input, weight, stride, dilation):
    """padding='valid' or 'same' for a 2-D or 3-D convolution. 'same' is symmetric padding plus,
    for an odd total, one extra row/column/slice at the end (done by padding the input), as
    F.conv2d and F.conv3d do. Returns (input, padding)."""
    dims = len(stride)
    if padding == "valid":
        return input, (0,) * dims
    if padding != "same":
        raise ValueError(f"{op}: invalid padding string {padding!r}, expected 'same' or 'valid'")
    if any(s != 1 for s in stride):
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
    if weight.dim() != dims + 2:  # the operator refuses the weight's rank, with its own message
        return input, (0,) * dims
    total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    if any(t % 2 for t in total):
        # F.pad lists (before, after) pairs from the last dimension back.
        input = F.pad(input, [n for t in reversed(total) for n in (0, t % 2)])
    return input, tuple(t // 2 for t in total)


def channels_last_format(rank: int):
    """The channels-last memory format of a batched tensor of this rank (4 or 5)."""
    return torch.channels_last_3d if rank == 5 else channels_last


def cuda_result_contiguous(input) -> bool:
    """Whether F's result on CUDA is contiguous whatever the operands' formats: where cuDNN would
    not run channels_last (float64, or cuDNN disabled; seen on an H100 with torch 2.11)."""
    return input.is_cuda and (input.dtype == torch.float64 or not torch.backends.cudnn.enabled)


def output_memory_format(input, weight):
    """channels_last (channels_last_3d for volumes) when the input or the weight is, as
    torch.nn.functional decides (except for an empty batch, whose output it leaves contiguous;
    on meta tensors; and on CUDA where cuDNN would not run channels_last: float64, or cuDNN
    disabled, seen on an H100 with torch 2.11). The operators return this format themselves but
    for the CUDA cases (result_format in csrc/route.h), where it is one copy away.

    Volumes on the CPU differ from F.conv3d in one way, on purpose: where F.conv3d falls back
    from oneDNN to ATen's own kernels (float64, oneDNN disabled, a batch of one small volume on
    some thread counts), those return contiguous tensors; here the format never depends on the
    dtype or the thread count (docs/design.md, "Memory formats")."""
    if cuda_result_contiguous(input):
        return torch.contiguous_format
    if input.device.type == "meta":  # F.conv2d's meta kernel returns contiguous tensors
        return torch.contiguous_format
    if input.dim() in (4, 5) and weight.dim() == input.dim() and input.shape[0] > 0:
        memory_format = channels_last_format(input.dim())
        if memory_format in (suggest_memory_format(input), suggest_memory_format(weight)):
            return memory_format
    return torch.contiguous_format
