"""The CUTLASS implicit-GEMM prototype's forward (TORCH_CONVBP_CUTLASS=1; benchmarks/NOTES.md,
section 33) against our own bfloat16 forward and cuDNN's, all fed channels_last, on the dense
layers of the suite whose channels it takes (multiples of 8, one group):

    python benchmarks/bench_cutlass.py [--batch 32] [--rounds 7] [--json out.json]

The question it answers: does the forward without a column matrix reach cuDNN's time, so that
an implicit-GEMM route (the three operators) is worth its build time and code?"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_convbp  # noqa: E402
from torch_convbp.benchmark.layers import conv_args, load_layers, make_operands  # noqa: E402
from torch_convbp.benchmark.steps import cudnn_flags  # noqa: E402
from torch_convbp.benchmark.timing import time_interleaved  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json")
    args = p.parse_args()
    if not (torch.cuda.is_available() and hasattr(torch.ops.torch_convbp, "cutlass_fprop_bf16")):
        sys.exit("needs a GPU and a build with TORCH_CONVBP_CUTLASS=1")
    rows = []
    layers = [layer for layer in load_layers("2d") if layer["groups"] == 1 and layer["in_channels"] % 8 == 0
              and layer["out_channels"] % 8 == 0 and not layer.get("transposed")]
    with cudnn_flags(), torch.no_grad():
        for layer in layers:
            x, w = make_operands(layer, args.batch, "cuda", torch.bfloat16, requires_grad=False)
            x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
            stride, padding, dilation, _ = conv_args(layer)
            steps = {
                "cutlass": lambda: torch.ops.torch_convbp.cutlass_fprop_bf16(x, w, stride, padding, dilation),
                "torch_convbp": lambda: torch_convbp.conv2d(x, w, None, stride, padding, dilation),
                "cudnn": lambda: F.conv2d(x, w, None, stride, padding, dilation),
            }
            ms = {k: v * 1e3 for k, v in time_interleaved(steps, args.rounds).items()}
            rows.append({"layer": layer["name"], **{f"{k}_ms": v for k, v in ms.items()},
                         "cutlass_vs_cudnn": ms["cutlass"] / ms["cudnn"],
                         "cutlass_vs_torch_convbp": ms["cutlass"] / ms["torch_convbp"]})
            print(f"| {layer['name']} | {ms['cutlass']:.3f} | {ms['torch_convbp']:.3f} | {ms['cudnn']:.3f} | "
                  f"{rows[-1]['cutlass_vs_cudnn']:.2f} | {rows[-1]['cutlass_vs_torch_convbp']:.2f} |", flush=True)
    geomean = lambda key: statistics.geometric_mean(r[key] for r in rows)
    print(f"geometric mean: CUTLASS {geomean('cutlass_vs_cudnn'):.2f}x cuDNN, "
          f"{geomean('cutlass_vs_torch_convbp'):.2f}x our bfloat16 forward ({torch.cuda.get_device_name()})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
