"""Where a layer's GPU step goes: torch.profiler over a few forward + backward steps of
torch_convbp on CUDA, per layer and format: the wall time per step, the GPU's busy time per step,
and the kernels by GPU time.

    python benchmarks/profile_layers.py --layers dw --batch 32 > profile.txt
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_convbp.benchmark.layers import batch_of, load_layers  # noqa: E402
from torch_convbp.benchmark.steps import candidate_steps  # noqa: E402

FORMATS = {"nchw": "torch_convbp", "channels_last": "torch_convbp_channels_last"}


def profile_step(step, steps):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / steps / 1e3
    return wall * 1e3, busy, prof


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default="", help="the layers whose name contains this")
    p.add_argument("--suite", default="2d")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rows", type=int, default=12, help="kernels listed per layer")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_layers.py needs a CUDA device")
    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        for layer in load_layers(args.suite, args.layers):
            steps = candidate_steps(layer, batch_of(layer, args.batch), "both", "cuda", torch.float32)
            for fmt, name in FORMATS.items():
                wall, busy, prof = profile_step(steps[name], args.steps)
                print(f"=== {layer['name']}, {fmt}, batch {batch_of(layer, args.batch)}: "
                      f"wall {wall:.3f} ms/step, GPU busy {busy:.3f} ms/step")
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.rows,
                                                max_name_column_width=70))


if __name__ == "__main__":
    main()
