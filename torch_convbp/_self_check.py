"""The self-check of `python -m torch_convbp`: torch_convbp.conv2d against F.conv2d in float64, and
second derivatives."""
import warnings

import torch
import torch.nn.functional as F

import torch_convbp

CHECKS = [  # (name, input shape, weight shape, stride, padding, dilation, groups)
    ("3x3, padding 1", (4, 8, 12, 12), (16, 8, 3, 3), 1, 1, 1, 1),
    ("strided, asymmetric kernel", (3, 6, 11, 9), (4, 6, 3, 2), (2, 1), (1, 0), 1, 1),
    ("grouped and dilated", (2, 8, 13, 13), (8, 2, 3, 3), 1, 2, 2, 4),
    ("depthwise, 'same'", (2, 6, 9, 9), (6, 1, 4, 4), 1, "same", 1, 6),
    ("1x1", (5, 16, 7, 7), (32, 16, 1, 1), 1, 0, 1, 1),
]


def upstream_gradient(y):
    """The same seeded random gradient for either convolution's output. Not torch.cos(y): in a fresh
    process the first call of an MKL VML function (cos, sin, exp, ...) can run a low-accuracy kernel
    on one thread's share (pytorch/pytorch#188792, oneMKL 2024.2), which once failed this check by
    6.8e-9 (benchmarks/NOTES.md, section 34)."""
    return torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))


def self_check():
    print("Self-check: torch_convbp.conv2d against torch.nn.functional.conv2d (float64)")
    warnings.filterwarnings("ignore", message="Using padding='same'")  # F.conv2d's own note
    worst = 0.0
    for name, xs, ws, stride, padding, dilation, groups in CHECKS:
        torch.manual_seed(0)
        x = torch.randn(xs, dtype=torch.float64, requires_grad=True)
        w = torch.randn(ws, dtype=torch.float64, requires_grad=True)
        b = torch.randn(ws[0], dtype=torch.float64, requires_grad=True)
        results = []
        for conv in (torch_convbp.conv2d, F.conv2d):
            y = conv(x, w, b, stride, padding, dilation, groups)
            results.append((y, *torch.autograd.grad(y, (x, w, b), upstream_gradient(y))))
        err = max((a - e).abs().max().item() for a, e in zip(*results))
        worst = max(worst, err)
        print(f"  {'ok  ' if err < 1e-9 else 'FAIL'} {name:28s} output and 3 gradients agree to {err:.1e}")
    ok = torch.autograd.gradgradcheck(lambda x, w: torch_convbp.conv2d(x, w, None, 1, 1), (
        torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True),
        torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)))
    print(f"  {'ok  ' if ok else 'FAIL'} second derivatives (gradgradcheck)")
    return worst < 1e-9 and ok
