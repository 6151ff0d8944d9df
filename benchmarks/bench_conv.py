"""Times torch_convbp.conv2d against the built-in F.conv2d (oneDNN on CPU, cuDNN on GPU) and
ATen's own im2col path (the built-in with oneDNN/cuDNN turned off), per layer.

    python benchmarks/bench_conv.py --suite quick --batch 8 --passes both
    python benchmarks/bench_conv.py --suite all --json out.json

Candidates are timed interleaved (round after round, each candidate once per round) and the
median per candidate is reported, so that machine noise hits all of them alike.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import torch_convbp  # noqa: E402


def load_layers(suite, name_filter=""):
    with open(os.path.join(HERE, "shapes.json")) as f:
        layers = json.load(f)["layers"]
    return [l for l in layers if (suite == "all" or suite in l["suites"]) and name_filter in l["name"]]


def builtin_without_vendor_library(device):
    """The built-in convolution with oneDNN (CPU) or cuDNN (GPU) off: ATen's im2col path."""
    if device == "cuda":
        return torch.backends.cudnn.flags(enabled=False)
    return torch.backends.mkldnn.flags(enabled=False)


def make_step(conv, x, w, layer, passes, context=contextlib.nullcontext):
    args = (layer["stride"], layer["padding"], layer["dilation"], layer["groups"])

    def forward():
        with torch.no_grad(), context():
            conv(x, w, None, *args)

    def forward_backward():
        with context():
            y = conv(x, w, None, *args)
            torch.autograd.grad(y, (x, w), torch.ones_like(y))

    return forward if passes == "forward" else forward_backward


def flops(layer, batch, out_size, passes):
    """2 x multiply-adds of the forward; the backward is twice that (grad-input, grad-weight)."""
    k = layer["kernel"]
    fwd = 2 * batch * layer["out_channels"] * out_size**2 * (layer["in_channels"] // layer["groups"]) * k * k
    return fwd if passes == "forward" else 3 * fwd


def time_interleaved(steps, rounds, device):
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for step in steps.values():  # warm up (and let cuDNN choose its algorithms)
        step(); step()
    sync()
    # Enough repetitions per measurement for about 50 ms.
    start = time.perf_counter(); next(iter(steps.values()))(); sync()
    reps = max(1, int(0.05 / max(time.perf_counter() - start, 1e-6)))
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            sync()
            start = time.perf_counter()
            for _ in range(reps):
                step()
            sync()
            times[name].append((time.perf_counter() - start) / reps)
    return {name: statistics.median(t) for name, t in times.items()}


def run(args):
    device, dtype = args.device, getattr(torch, args.dtype)
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    rows = []
    layers = load_layers(args.suite, args.layers)
    for i, layer in enumerate(layers, 1):
        torch.manual_seed(0)
        x = torch.randn(args.batch, layer["in_channels"], layer["size"], layer["size"], device=device, dtype=dtype)
        w = torch.randn(layer["out_channels"], layer["in_channels"] // layer["groups"], layer["kernel"], layer["kernel"], device=device, dtype=dtype)
        x.requires_grad_(args.passes != "forward")
        w.requires_grad_(args.passes != "forward")
        steps = {
            "torch_convbp": make_step(torch_convbp.conv2d, x, w, layer, args.passes),
            "builtin": make_step(F.conv2d, x, w, layer, args.passes),
            "aten_im2col": make_step(F.conv2d, x, w, layer, args.passes, lambda: builtin_without_vendor_library(device)),
        }
        seconds = time_interleaved(steps, args.rounds, device)
        out_size = (layer["size"] + 2 * layer["padding"] - layer["dilation"] * (layer["kernel"] - 1) - 1) // layer["stride"] + 1
        work = flops(layer, args.batch, out_size, args.passes)
        row = {"layer": layer["name"], **{f"{k}_ms": v * 1e3 for k, v in seconds.items()}}
        row["gflops"] = work / seconds["torch_convbp"] / 1e9
        row["vs_builtin"] = seconds["torch_convbp"] / seconds["builtin"]
        row["vs_aten_im2col"] = seconds["torch_convbp"] / seconds["aten_im2col"]
        rows.append(row)
        if not args.quiet:
            print(f"[{i}/{len(layers)}] {layer['name']}", file=sys.stderr, flush=True)
    return rows


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def print_table(rows, args, file=sys.stdout):
    builtin = "cuDNN" if args.device == "cuda" else "oneDNN"
    print(f"\n{args.device} {args.dtype}, batch {args.batch}, {args.passes} pass(es), {torch.get_num_threads()} threads; "
          f"ratios are torch_convbp time / other time (below 1: torch_convbp is faster)", file=file)
    header = f"| layer | torch_convbp ms | {builtin} ms | ATen im2col ms | GFLOP/s | vs {builtin} | vs ATen im2col |"
    print(header, file=file)
    print("|---|---:|---:|---:|---:|---:|---:|", file=file)
    for r in rows:
        print(f"| {r['layer']} | {r['torch_convbp_ms']:.2f} | {r['builtin_ms']:.2f} | {r['aten_im2col_ms']:.2f} | "
              f"{r['gflops']:.0f} | {r['vs_builtin']:.2f} | {r['vs_aten_im2col']:.2f} |", file=file)
    print(f"| **geometric mean** | | | | | **{geomean([r['vs_builtin'] for r in rows]):.2f}** | "
          f"**{geomean([r['vs_aten_im2col'] for r in rows]):.2f}** |", file=file)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--suite", default="quick", help="quick, resnet18, resnet50, mobilenet or all (see shapes.json)")
    p.add_argument("--layers", default="", help="only the layers whose name contains this")
    p.add_argument("--passes", default="both", choices=["forward", "both"], help="forward only, or forward+backward")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--tf32", action="store_true", help="allow TF32 on CUDA")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    rows = run(args)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
