"""The layer benchmark: torch_convbp's conv2d (conv3d, conv_transpose3d, as the layer is), layer by
layer, against
  builtin                the built-in F.conv2d (F.conv3d, ...): oneDNN on CPU, cuDNN on GPU
                         (cudnn.benchmark=True),
  builtin_channels_last  the same, fed channels_last input and weight (and torch_convbp_channels_last,
                         ours fed the same: its ratio to this one is the channels_last comparison),
  builtin_deterministic  (GPU only) cuDNN with cudnn.deterministic=True, as our backward always is,
  aten_im2col            ATen's own im2col path: the built-in with oneDNN / cuDNN turned off
                         (for volumes slow_conv3d / slow_conv_transpose3d on the CPU),
  gemm                   the bare GEMMs of the same sizes: the floor of any im2col + GEMM design.

    python -m torch_convbp bench                      # the quick suite, fwd+bwd, batch 8
    python -m torch_convbp bench --suite video        # r3d_18's and r2plus1d_18's 3-D layers
    python -m torch_convbp bench --suite all --json out.json --plot out.png
    python -m torch_convbp bench --suite all --memory --scaling
    python -m torch_convbp bench --suite all --cuda-graphs   # every candidate captured in a CUDA graph
    (benchmarks/bench_conv.py takes the same options)

Candidates are timed with torch.utils.benchmark, interleaved (round after round, each candidate
once per round) and the median per candidate is reported, so that machine noise hits all of them
alike. The layers are listed in shapes.json. --memory adds the peak workspace per call for
batch 8, 64 and 256 against the workspace limit; --scaling adds time against batch size and
image size (both should be linear). On a GPU each row also has every candidate's peak memory
(torch.cuda.max_memory_allocated over one call, above what was allocated before it).
"""
import argparse
import contextlib
import datetime
import json
import sys
import time
import warnings

import torch

import torch_convbp

from .environment import environment, machine_description
from .layers import SUITES, batch_of, flops, functions, load_layers, make_operands, output_pixels
from .report import check_plotting, plot, print_layers, print_memory, print_scaling
from .steps import candidate_steps, conv_step, cudnn_flags, peak_memory_mib
from .timing import Progress, square_gemm, time_interleaved, measure_ceilings


def run_layers(args, layers, progress):
    """Each layer's candidates, and the square GEMM in the same rounds, so that 'of peak' compares
    rates measured side by side (this machine's speed drifts by tens of percent over minutes)."""
    rows = []
    peak_step, peak_work, _ = square_gemm(args.device, args.dtype)
    for layer in layers:
        batch = batch_of(layer, args.batch)
        steps = candidate_steps(layer, batch, args.passes, args.device, args.dtype, cuda_graphs=args.cuda_graphs)
        seconds = time_interleaved({**steps, "square_gemm": peak_step}, args.rounds)
        peak = seconds.pop("square_gemm")
        work = flops(layer, batch, args.passes)
        row = {"layer": layer["name"], "batch": batch, **{f"{k}_ms": v * 1e3 for k, v in seconds.items()}}
        row.update({f"{k}_gflops": work / v / 1e9 for k, v in seconds.items()})
        row["square_gemm_gflops"] = peak_work / peak / 1e9
        row["of_peak"] = row["torch_convbp_gflops"] / row["square_gemm_gflops"]
        for other in seconds:
            if not other.startswith("torch_convbp"):
                row[f"vs_{other}"] = seconds["torch_convbp"] / seconds[other]
        if "torch_convbp_channels_last" in seconds:  # both fed channels_last
            row["channels_last_vs_builtin_channels_last"] = (
                seconds["torch_convbp_channels_last"] / seconds["builtin_channels_last"])
        if args.device == "cuda" and not args.cuda_graphs:  # a graph's memory is taken at capture
            row.update({f"{name}_peak_mib": peak_memory_mib(step) for name, step in steps.items() if name != "gemm"})
        rows.append(row)
        progress.step(layer["name"])
    return rows


def run_memory(args, layers, progress):
    """Peak workspace (torch_convbp's only scratch memory) of one forward+backward, per batch size,
    under the default limit and under a tight one, with the time under each."""
    rows = []
    tight = 64 << 20
    for layer in layers:
        for batch in args.memory_batches:
            x, w = make_operands(layer, batch, args.device, args.dtype)
            step = conv_step(functions(layer)[0], x, w, layer, "both")
            row = {"layer": layer["name"], "batch": batch,
                   "output_mib": batch * layer["out_channels"] * output_pixels(layer) * x.element_size() / 2**20}
            for name, limit in (("default", torch_convbp.get_workspace_limit()), ("tight", tight)):
                with torch_convbp.workspace_limit(limit):
                    torch_convbp.workspace_peak(reset=True)
                    start = time.perf_counter()
                    step()
                    if args.device == "cuda":
                        torch.cuda.synchronize()
                    row[f"{name}_seconds"] = time.perf_counter() - start
                    row[f"{name}_limit_mib"] = limit / 2**20
                    row[f"{name}_peak_mib"] = torch_convbp.workspace_peak() / 2**20
            rows.append(row)
            progress.step(f"memory {layer['name']} batch {batch}")
    return rows


def run_scaling(args, progress):
    """Time of one forward+backward against batch size (image size fixed) and against image size
    (batch fixed), for torch_convbp and the built-in: per image and per pixel it should be flat."""
    layer = load_layers("all", args.scaling_layer)[0]
    rows = []
    plan = [("batch", b, layer["size"]) for b in args.scaling_batches]
    plan += [("size", batch_of(layer, args.batch), s) for s in args.scaling_sizes]
    for axis, batch, size in plan:
        steps = candidate_steps(layer, batch, "both", args.device, args.dtype, size, variants=False)
        seconds = time_interleaved({k: steps[k] for k in ("torch_convbp", "builtin")}, max(3, args.rounds // 2))
        pixels = batch * output_pixels(layer, size)
        rows.append({"layer": layer["name"], "axis": axis, "batch": batch, "size": size,
                     **{f"{k}_ms": v * 1e3 for k, v in seconds.items()},
                     **{f"{k}_ns_per_pixel": v * 1e9 / pixels for k, v in seconds.items()}})
        progress.step(f"scaling: batch {batch}, image size {size}")
    return rows


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--batch", type=int, help="the batch of every layer (default: the layer's own in shapes.json, else 8)")
    p.add_argument("--suite", default="quick",
                   help=f"{', '.join(SUITES)}, all, 2d or 3d (every layer of those dimensions); see shapes.json")
    p.add_argument("--layers", default="", help="only the layers whose name contains this")
    p.add_argument("--passes", default="both", choices=["forward", "backward", "both"],
                   help="forward only, backward only (from a saved forward), or both")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds; medians are reported")
    p.add_argument("--tf32", action="store_true", help="allow TF32 on CUDA")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="time every candidate captured in a CUDA graph and replayed: the GPU's time without the host's")
    p.add_argument("--memory", action="store_true", help="also measure the peak workspace for --memory-batches")
    p.add_argument("--memory-batches", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--scaling", action="store_true", help="also time against batch size and image size")
    p.add_argument("--scaling-layer", default="resnet18 3x3 128 @28")
    p.add_argument("--scaling-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--scaling-sizes", type=int, nargs="+", default=[14, 28, 56, 112])
    p.add_argument("--json", help="write everything measured here")
    p.add_argument("--plot", help="write a PNG of the ratios per layer here (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    check_plotting(p, args)
    if args.cuda_graphs and args.device != "cuda":
        p.error("--cuda-graphs needs --device cuda (CUDA graphs are a GPU's)")
    return args


def main(argv=None):
    args = parse(argv)
    # Turning oneDNN off and on makes torch note that oneDNN's TF32 is for Intel GPUs only.
    warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    with cudnn_flags() if args.device == "cuda" else contextlib.nullcontext():
        return run(args)


def run(args):
    dtype = getattr(torch, args.dtype)
    layers = load_layers(args.suite, args.layers)
    if not layers:
        sys.exit(f"no layer of suite {args.suite!r} has {args.layers!r} in its name")
    memory_runs = len(args.memory_batches) if args.memory else 0
    scaling_runs = len(args.scaling_batches) + len(args.scaling_sizes) if args.scaling else 0
    steps = len(layers) * (1 + memory_runs) + scaling_runs
    progress = Progress(steps, args.quiet)
    run_args = argparse.Namespace(**{**vars(args), "dtype": dtype})
    result = {"machine": machine_description(args.device), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "args": vars(args),
              "environment": environment(args.device, dtype), "ceilings": measure_ceilings(args.device, dtype)}
    result["rows"] = run_layers(run_args, layers, progress)
    if args.memory:
        result["memory"] = run_memory(run_args, layers, progress)
    if args.scaling:
        result["scaling"] = run_scaling(run_args, progress)
    print_layers(result)
    if args.memory:
        print_memory(result["memory"])
    if args.scaling:
        print_scaling(result["scaling"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(result, args.plot)
    return result

