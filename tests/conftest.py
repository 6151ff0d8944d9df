"""Shared fixtures: the devices to test on, and the matrix of convolution cases; first, a warm-up
of the MKL VML functions (below)."""
import pytest
import torch

import torch_convbp

# In a fresh process, ATen's first call of an MKL VML function (torch.cos, exp, sqrt, ...), where it
# runs on several threads at once, can compute one thread's share with a low-accuracy kernel
# (pytorch/pytorch#188792, oneMKL 2024.2: errors near 1e-8 in float64). Tests that make upstream
# gradients with torch.cos would then compare against a slightly wrong one (benchmarks/NOTES.md,
# section 34). One small call of each, on one thread, settles the dispatch before any test runs.
VML_FUNCTIONS = ["acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin",
                 "sqrt", "tan", "tanh", "trunc"]
for dtype in (torch.float32, torch.float64):
    for name in VML_FUNCTIONS:
        getattr(torch, name)(torch.full((8,), 0.5, dtype=dtype))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and torch_convbp.CUDA_KERNELS else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _restore_workspace_limit():
    limit = torch_convbp.get_workspace_limit()
    yield
    torch_convbp.set_workspace_limit(limit)
