"""torch_convbp: convolution and all of its gradients as im2col + GEMM, on CPU and CUDA.

    torch_convbp.conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)
    torch_convbp.conv1d, conv3d, conv_transpose1d/2d/3d    # as in torch.nn.functional
    torch_convbp.Conv2d(...)          # an nn.Conv2d; likewise Conv1d/3d, ConvTranspose1d/2d/3d
    torch_convbp.convert(model)       # every nn.Conv1d/2d/3d, nn.ConvTranspose1d/2d/3d becomes ours
    torch_convbp.revert(model)        # and back to the stock classes
    torch_convbp.onnx_translation_table()     # for torch.onnx.export(..., dynamo=True)
    torch_convbp.explain(x, w, padding=1)     # which route each operator takes, and why
    torch_convbp.set_workspace_limit(nbytes)
    torch_convbp.gemm_dtype(torch.bfloat16)   # the dtype the GEMMs run in (float32 on most CPUs)

The operators are torch.ops.torch_convbp.{conv2d, conv2d_input_grad, conv2d_weight_grad} and
their 3-D twins {conv3d, conv3d_input_grad, conv3d_weight_grad}.
"""
import contextlib
import os
import re

import torch

from . import _C  # registers the operators


def _check_built_with(built: "str | None", running: str) -> None:
    """torch has no stable C++ ABI: an extension compiled against one torch release and loaded
    into another can crash (measured: a bus error in the first call) instead of failing. So a
    build for another torch is refused here, with how to rebuild."""
    release = re.match(r"\d+\.\d+\.\d+", running)  # 2.13.0 of 2.13.0+cpu, 2.14.0a0+git...
    if built is not None and release is not None and built != release.group(0):
        raise ImportError(
            f"torch_convbp was compiled against torch {built}, but this is torch {running}; "
            "rebuild it with this torch: pip install --no-build-isolation -e . (in a checkout)"
        )


_check_built_with(_C.built_with_torch, torch.__version__)

from . import _meta  # noqa: E402, F401  (registers the fake kernels; autograd is in C++, csrc/autograd.cpp)
from ._args import CUDA_KERNELS
from ._explain import explain
from ._onnx import onnx_translation_table
from .functional import conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from .modules import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, convert, revert

__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "convert",
    "revert",
    "onnx_translation_table",
    "explain",
    "set_workspace_limit",
    "get_workspace_limit",
    "workspace_limit",
    "workspace_peak",
    "gemm_dtype",
    "gemm_engine",
    "release_scratch",
    "pooled_scratch",
    "CUDA_KERNELS",
]
__version__ = "0.1.0"

WORKSPACE_ENV = "TORCH_CONVBP_WORKSPACE_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"{WORKSPACE_ENV}: expected a positive size like 268435456, 256M or 1G, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def set_workspace_limit(nbytes) -> None:
    """Caps the scratch memory of one call (column buffer plus GEMM staging), in bytes (an int, or
    a string like '256M'). The batch is processed in chunks that fit; the smallest chunk is one
    output row. The default is 1 GiB, or the environment variable TORCH_CONVBP_WORKSPACE_LIMIT."""
    _C.set_workspace_limit(nbytes if isinstance(nbytes, int) else _parse_bytes(nbytes))


def get_workspace_limit() -> int:
    """The workspace limit in bytes."""
    return _C.workspace_limit()


def workspace_peak(reset: bool = False) -> int:
    """The most workspace (column buffers plus staging) held at once since the last reset, in
    bytes, over all calls and threads; reset=True returns it and starts a new count."""
    return _C.workspace_peak(reset)


def release_scratch() -> int:
    """Frees the CPU scratch memory torch_convbp keeps between calls and returns how many bytes
    that was. On the CPU the column matrices, staging, flipped weights and partial sums of a call
    take blocks that earlier calls freed, since freshly mapped memory faults page by page on its
    first write; at most min(workspace limit, 256 MiB) of freed blocks are kept. Results are
    never pool memory. Like torch.cuda.empty_cache(), for when that memory is wanted back."""
    return _C.release_scratch()


def pooled_scratch() -> int:
    """The bytes of CPU scratch memory kept between calls (free blocks, not in use)."""
    return _C.pooled_scratch()


def gemm_dtype(dtype: torch.dtype, device="cpu") -> torch.dtype:
    """The dtype torch_convbp's GEMMs run in for operands of `dtype` on `device`. That is the
    operands' own dtype, except for float16 and bfloat16 on the CPU, where the column matrices and
    GEMMs are float32 and each result is rounded once to `dtype`: ATen emulates half-precision
    GEMMs slowly on CPUs without instructions for them, and on CPUs with them (AVX512-BF16, AMX)
    runs them through oneDNN, whose bits change with the thread count. The environment variable
    TORCH_CONVBP_HALF_GEMM=native runs them in half precision anyway (faster on such CPUs, without
    the same bits on any thread count), =float32 everywhere; the default is auto."""
    return _C.gemm_dtype(dtype, torch.device(device))


def gemm_engine(dtype: torch.dtype = torch.float32, device="cpu", result=None) -> str:
    """What runs torch_convbp's GEMMs for operands of `dtype` on `device`: 'microkernel', our
    GEMM driver on oneDNN's micro-kernel, for float32 GEMMs on CPUs where it measured faster than
    MKL (AMD with AVX-512), or 'aten', ATen's GEMM (MKL on the CPU, cuBLAS on CUDA). With
    `result=(rows, cols)`, the engine of one GEMM whose result has that shape: float32 results
    under 16 on a side run on ATen's, and on AMD CPUs without AVX-512 those at most 256 columns
    wide on the micro-kernel. Both give the same bits on any thread count. The environment variable
    TORCH_CONVBP_GEMM=microkernel runs every float32 CPU GEMM on the micro-kernel where this torch
    and CPU have it, =mkl none."""
    if result is None:
        return _C.gemm_engine(dtype, torch.device(device))
    sides = tuple(result)
    if len(sides) != 2 or any(int(side) < 0 for side in sides):
        raise ValueError(f"gemm_engine: result must be (rows, cols) of sizes >= 0, got {sides}")
    return _C.gemm_engine(dtype, torch.device(device), int(sides[0]), int(sides[1]))


@contextlib.contextmanager
def workspace_limit(nbytes):
    """A workspace limit for the duration of a `with` block."""
    previous = get_workspace_limit()
    set_workspace_limit(nbytes)
    try:
        yield
    finally:
        set_workspace_limit(previous)


if os.environ.get(WORKSPACE_ENV):
    set_workspace_limit(_parse_bytes(os.environ[WORKSPACE_ENV]))
