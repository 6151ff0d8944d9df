"""python -m torch_convbp: a self-check against F.conv2d, then a timing table on this machine."""
import os
import sys
import time
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
            results.append((y, *torch.autograd.grad(y, (x, w, b), torch.cos(y))))
        err = max((a - e).abs().max().item() for a, e in zip(*results))
        worst = max(worst, err)
        print(f"  {'ok  ' if err < 1e-9 else 'FAIL'} {name:28s} output and 3 gradients agree to {err:.1e}")
    ok = torch.autograd.gradgradcheck(lambda x, w: torch_convbp.conv2d(x, w, None, 1, 1), (
        torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True),
        torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)))
    print(f"  {'ok  ' if ok else 'FAIL'} second derivatives (gradgradcheck)")
    return worst < 1e-9 and ok


def main():
    passed = self_check()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        import bench_conv
    except ImportError:
        print("\n(benchmarks/ not found next to the package: no timing table)")
        return 0 if passed else 1
    print("\nTiming, forward + backward, float32, batch 8 (a minute or so)...")
    start = time.time()
    rows = bench_conv.main(["--suite", "quick", "--batch", "8", "--quiet", "--rounds", "5"])["rows"]
    g = bench_conv.geomean([r["vs_builtin"] for r in rows])
    builtin = "cuDNN" if torch.cuda.is_available() else "oneDNN"
    print(f"\nIn short: on these layers torch_convbp takes {g:.2f}x the time of {builtin} (geometric mean) and "
          f"{bench_conv.geomean([r['vs_aten_im2col'] for r in rows]):.2f}x that of ATen's own im2col path, "
          f"measured in {time.time() - start:.0f} s.")
    print("Self-check " + ("passed." if passed else "FAILED."))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
