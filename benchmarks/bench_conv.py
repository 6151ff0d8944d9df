"""Benchmarks torch_convbp.conv2d, layer by layer, against
  builtin                the built-in F.conv2d: oneDNN on CPU, cuDNN on GPU (cudnn.benchmark=True),
  builtin_channels_last  the same, fed channels_last input and weight (and torch_convbp_channels_last,
                         ours fed the same: its ratio to this one is the channels_last comparison),
  builtin_deterministic  (GPU only) cuDNN with cudnn.deterministic=True, as our backward always is,
  aten_im2col            ATen's own im2col path: the built-in with oneDNN / cuDNN turned off,
  gemm                   the bare GEMMs of the same sizes: the floor of any im2col + GEMM design.

    python benchmarks/bench_conv.py                           # the quick suite, fwd+bwd, batch 8
    python benchmarks/bench_conv.py --suite all --json out.json --plot out.png
    python benchmarks/bench_conv.py --suite all --memory --scaling

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
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.utils import benchmark

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import torch_convbp  # noqa: E402

CANDIDATES = ("torch_convbp", "builtin", "aten_im2col", "gemm")  # timed on every device


# --- the layers -------------------------------------------------------------------------------

def load_layers(suite="all", name_filter=""):
    with open(os.path.join(HERE, "shapes.json")) as f:
        layers = json.load(f)["layers"]
    return [layer for layer in layers if (suite == "all" or suite in layer["suites"]) and name_filter in layer["name"]]


def conv_args(layer):
    return layer["stride"], layer["padding"], layer["dilation"], layer["groups"]


def out_size(layer, size=None):
    size = layer["size"] if size is None else size
    reach = layer["dilation"] * (layer["kernel"] - 1) + 1
    return (size + 2 * layer["padding"] - reach) // layer["stride"] + 1


def make_operands(layer, batch, device, dtype, size=None, requires_grad=True):
    size = layer["size"] if size is None else size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, layer["in_channels"], size, size, generator=g).to(device, dtype)
    w = torch.randn(layer["out_channels"], layer["in_channels"] // layer["groups"], layer["kernel"],
                    layer["kernel"], generator=g).to(device, dtype)
    return x.requires_grad_(requires_grad), w.requires_grad_(requires_grad)


def flops(layer, batch, passes, size=None):
    """2 x the forward's multiply-adds; the backward is twice the forward (grad-input, grad-weight)."""
    k = layer["kernel"]
    fwd = 2 * batch * layer["out_channels"] * out_size(layer, size) ** 2 * (layer["in_channels"] // layer["groups"]) * k * k
    return {"forward": fwd, "backward": 2 * fwd, "both": 3 * fwd}[passes]


# --- what is timed ----------------------------------------------------------------------------

def builtin_without_vendor_library(device):
    """The built-in convolution with oneDNN (CPU) or cuDNN (GPU) off: ATen's im2col path."""
    if device == "cuda":
        return torch.backends.cudnn.flags(enabled=False)
    return torch.backends.mkldnn.flags(enabled=False)


def conv_step(conv, x, w, layer, passes, context=contextlib.nullcontext):
    """One call of the pass(es): forward, backward (from a saved forward) or both."""
    args = conv_args(layer)
    if passes == "forward":
        def step():
            with torch.no_grad(), context():
                conv(x, w, None, *args)
        return step
    if passes == "both":
        def step():
            with context():
                y = conv(x, w, None, *args)
                torch.autograd.grad(y, (x, w), torch.ones_like(y))
        return step
    with context():
        y = conv(x, w, None, *args)
    grad_y = torch.ones_like(y)

    def step():
        with context():
            torch.autograd.grad(y, (x, w), grad_y, retain_graph=True)
    return step


def gemm_step(layer, batch, passes, device, dtype, size=None):
    """The GEMMs an im2col design must run, on ready operands, each one call over the whole batch
    ([G, M, K] @ [G, K, N] as one bmm, or one mm for a single group):
      forward      Y  [G, Cout/G, NP] = W    [G, Cout/G, K] @ col [G, K, NP]
      grad-input   dC [G, K, NP]      = W^T  [G, K, Cout/G] @ dY  [G, Cout/G, NP]
      grad-weight  dW [G, Cout/G, K]  = dY   [G, Cout/G, NP] @ col^T [G, NP, K]
    with K = Cin/G*kh*kw and NP the output pixels of the batch, in the dtype torch_convbp's GEMMs
    run in (float32 for half-precision operands on a CPU without instructions for them)."""
    dtype = torch_convbp.gemm_dtype(dtype, device)
    groups = layer["groups"]
    k = layer["in_channels"] // groups * layer["kernel"] ** 2
    m, n = layer["out_channels"] // groups, batch * out_size(layer, size) ** 2
    new = lambda *shape: torch.randn(groups, *shape, device=device, dtype=dtype)
    weight, col, grad_y = new(m, k), new(k, n), new(m, n)
    y, grad_col, grad_w = new(m, n), new(k, n), new(m, k)
    mm = torch.mm if groups == 1 else torch.bmm
    squeeze = (lambda t: t[0]) if groups == 1 else (lambda t: t)
    forward = [(squeeze(weight), squeeze(col), squeeze(y))]
    backward = [(squeeze(weight.transpose(1, 2)), squeeze(grad_y), squeeze(grad_col)),
                (squeeze(grad_y), squeeze(col.transpose(1, 2)), squeeze(grad_w))]
    products = {"forward": forward, "backward": backward, "both": forward + backward}[passes]

    def step():
        for a, b, out in products:
            mm(a, b, out=out)
    return step


def cudnn_flags(deterministic=False):
    """cuDNN as every GPU row runs it: on, autotuned (cudnn.benchmark), TF32 as --tf32 set it
    (torch.backends.cuda.matmul.allow_tf32 holds that choice), deterministic or not. Through the
    context manager, since torch's own test helpers forbid setting the flags directly."""
    return torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=deterministic,
                                      allow_tf32=torch.backends.cuda.matmul.allow_tf32)


def channels_last_copies(x, w):
    """Leaf copies of the operands in channels_last (the layout cuDNN and oneDNN are fastest in)."""
    return tuple(t.detach().to(memory_format=torch.channels_last).requires_grad_(t.requires_grad) for t in (x, w))


def candidate_steps(layer, batch, passes, device, dtype, size=None, variants=True):
    """The candidates' steps; with variants, also ours and the built-in fed channels_last and (on
    a GPU, where cuDNN's backward is not deterministic by default) the built-in made
    deterministic."""
    x, w = make_operands(layer, batch, device, dtype, size, requires_grad=passes != "forward")
    steps = {
        "torch_convbp": conv_step(torch_convbp.conv2d, x, w, layer, passes),
        "builtin": conv_step(F.conv2d, x, w, layer, passes),
        "aten_im2col": conv_step(F.conv2d, x, w, layer, passes, lambda: builtin_without_vendor_library(device)),
        "gemm": gemm_step(layer, batch, passes, device, dtype, size),
    }
    if variants:
        x_cl, w_cl = channels_last_copies(x, w)
        steps["torch_convbp_channels_last"] = conv_step(torch_convbp.conv2d, x_cl, w_cl, layer, passes)
        steps["builtin_channels_last"] = conv_step(F.conv2d, x_cl, w_cl, layer, passes)
        if device == "cuda":
            steps["builtin_deterministic"] = conv_step(F.conv2d, x, w, layer, passes,
                                                      lambda: cudnn_flags(deterministic=True))
    return steps


def peak_memory_mib(step):
    """CUDA memory one call of step takes at its peak, above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def time_interleaved(steps, rounds, min_seconds=0.05):
    """Median seconds per call of each step, measured round after round, each step once per round
    (torch.utils.benchmark.Timer, which synchronizes CUDA, on the threads torch uses)."""
    timers = {name: benchmark.Timer("step()", globals={"step": step}, num_threads=torch.get_num_threads())
              for name, step in steps.items()}
    for step in steps.values():  # warm up (and let cuDNN choose its algorithms)
        step()
        step()
    first = next(iter(timers.values())).timeit(1).median
    reps = max(1, int(min_seconds / max(first, 1e-6)))
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(timer.timeit(reps).median)
    return {name: statistics.median(t) for name, t in times.items()}


# --- progress ----------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total, quiet=False):
        self.total, self.done, self.quiet, self.start = total, 0, quiet, time.time()
        self.tty = sys.stderr.isatty()

    def step(self, label):
        self.done += 1
        if self.quiet:
            return
        elapsed = time.time() - self.start
        left = elapsed / self.done * (self.total - self.done)
        filled = int(30 * self.done / self.total)
        line = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {elapsed:.0f}s, ~{left:.0f}s left: {label}"
        if self.tty:
            print("\r" + line[:120].ljust(120), end="\n" if self.done == self.total else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


# --- the sections of a run ---------------------------------------------------------------------

def square_gemm(device, dtype):
    """One large square GEMM in the dtype our GEMMs run in: (step, its FLOPs, its size)."""
    dtype = torch_convbp.gemm_dtype(dtype, device)
    n = 4096 if device == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)
    return (lambda: torch.mm(a, b, out=out)), 2 * n**3, n


def measure_ceilings(device, dtype):
    """The machine's two ceilings: one large square GEMM (GFLOP/s) and a large copy (GB/s)."""
    gemm, work, n = square_gemm(device, dtype)
    src = torch.randn(64 << 20 if device == "cuda" else 16 << 20, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = time_interleaved({"gemm": gemm, "copy": lambda: dst.copy_(src)}, rounds=5)
    return {"square_gemm_size": n, "square_gemm_gflops": work / t["gemm"] / 1e9,
            "copy_gbytes_per_s": 2 * src.nbytes / t["copy"] / 1e9}


def run_layers(args, layers, progress):
    """Each layer's candidates, and the square GEMM in the same rounds, so that 'of peak' compares
    rates measured side by side (this machine's speed drifts by tens of percent over minutes)."""
    rows = []
    peak_step, peak_work, _ = square_gemm(args.device, args.dtype)
    for layer in layers:
        steps = candidate_steps(layer, args.batch, args.passes, args.device, args.dtype)
        seconds = time_interleaved({**steps, "square_gemm": peak_step}, args.rounds)
        peak = seconds.pop("square_gemm")
        work = flops(layer, args.batch, args.passes)
        row = {"layer": layer["name"], **{f"{k}_ms": v * 1e3 for k, v in seconds.items()}}
        row.update({f"{k}_gflops": work / v / 1e9 for k, v in seconds.items()})
        row["square_gemm_gflops"] = peak_work / peak / 1e9
        row["of_peak"] = row["torch_convbp_gflops"] / row["square_gemm_gflops"]
        for other in seconds:
            if not other.startswith("torch_convbp"):
                row[f"vs_{other}"] = seconds["torch_convbp"] / seconds[other]
        if "torch_convbp_channels_last" in seconds:  # both fed channels_last
            row["channels_last_vs_builtin_channels_last"] = (
                seconds["torch_convbp_channels_last"] / seconds["builtin_channels_last"])
        if args.device == "cuda":
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
            step = conv_step(torch_convbp.conv2d, x, w, layer, "both")
            row = {"layer": layer["name"], "batch": batch,
                   "output_mib": batch * layer["out_channels"] * out_size(layer) ** 2 * x.element_size() / 2**20}
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
    plan += [("size", args.batch, s) for s in args.scaling_sizes]
    for axis, batch, size in plan:
        steps = candidate_steps(layer, batch, "both", args.device, args.dtype, size, variants=False)
        seconds = time_interleaved({k: steps[k] for k in ("torch_convbp", "builtin")}, max(3, args.rounds // 2))
        pixels = batch * out_size(layer, size) ** 2
        rows.append({"layer": layer["name"], "axis": axis, "batch": batch, "size": size,
                     **{f"{k}_ms": v * 1e3 for k, v in seconds.items()},
                     **{f"{k}_ns_per_pixel": v * 1e9 / pixels for k, v in seconds.items()}})
        progress.step(f"scaling: batch {batch}, image size {size}")
    return rows


# --- reporting ---------------------------------------------------------------------------------

def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def machine_description(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {torch.get_num_threads()} threads"


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
SETTINGS = ("DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


def cpu_flags():
    """The instruction-set extensions of ISA_FLAGS that this CPU reports (/proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return [flag for flag in ISA_FLAGS if flag in flags]


def library_versions():
    """The versions of oneDNN and MKL in this torch, as torch.__config__.show() names them."""
    config = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    return {"onednn": onednn.group(1) if onednn else None, "mkl": mkl.group(1) if mkl else None}


def source_version():
    """The git commit of the torch_convbp that is imported, and whether its tracked files differ
    from it (None outside a git checkout)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(torch_convbp.__file__)))
    try:
        commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "-C", checkout, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment(device, dtype):
    """What a result depends on besides the code: the CPU's instruction sets, the libraries' and
    ATen's choices, the settings that change them, and the build of torch_convbp that ran."""
    return {
        "torch_convbp": source_version(),
        "cpu_flags": cpu_flags(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **library_versions(),
        "gemm_dtype": str(torch_convbp.gemm_dtype(dtype, device)).replace("torch.", ""),
        "settings": {name: os.environ[name] for name in SETTINGS if name in os.environ},
    }


def environment_line(env):
    """One line for a table's heading."""
    commit = env["torch_convbp"]["commit"]
    build = f"torch_convbp {commit[:7]}{' (modified)' if env['torch_convbp']['dirty'] else ''}" if commit else "torch_convbp"
    settings = "".join(f", {k}={v}" for k, v in env["settings"].items())
    return (f"{build}; ISA: {' '.join(env['cpu_flags']) or 'unknown'} (ATen {env['aten_cpu_capability']}); "
            f"oneDNN {env['onednn']}, MKL {env['mkl']}; GEMMs in {env['gemm_dtype']}{settings}")


def builtin_name(device):
    return "cuDNN" if device == "cuda" else "oneDNN"


def column_names(device):
    """The table's heading for each candidate, in the order they are printed."""
    builtin = builtin_name(device)
    return {"torch_convbp": "torch_convbp", "builtin": builtin, "torch_convbp_channels_last": "torch_convbp channels_last",
            "builtin_channels_last": f"{builtin} channels_last",
            "builtin_deterministic": f"{builtin} deterministic", "aten_im2col": "ATen im2col", "gemm": "bare GEMMs"}


def print_layers(result, file=None):
    file = file or sys.stdout
    a, rows, ceiling = result["args"], result["rows"], result["ceilings"]
    names = {k: v for k, v in column_names(a["device"]).items() if f"{k}_ms" in rows[0]}
    others = [k for k in names if not k.startswith("torch_convbp")]
    memory = [k for k in names if f"{k}_peak_mib" in rows[0]]
    print(f"\n{result['machine']}, torch {result['torch']}, {result['date']}: {a['device']} {a['dtype']}, batch {a['batch']}, "
          f"{a['passes']} pass(es){', TF32 allowed' if a.get('tf32') else ''}. Square {ceiling['square_gemm_size']}^3 GEMM: "
          f"{ceiling['square_gemm_gflops']:.0f} GFLOP/s; copy: {ceiling['copy_gbytes_per_s']:.0f} GB/s. Ratios are "
          f"torch_convbp's time over the other's (below 1: torch_convbp is faster); 'of peak' is torch_convbp's GFLOP/s "
          f"over the square GEMM's, timed in the same rounds as the layer.", file=file)
    if "environment" in result:
        print(environment_line(result["environment"]), file=file)
    heading = [f"{names[k]} ms" for k in names] + ["GFLOP/s", "of peak"] + [f"vs {names[k]}" for k in others]
    channels_last = "channels_last_vs_builtin_channels_last" in rows[0]
    heading += [f"channels_last: vs {names['builtin_channels_last']}"] if channels_last else []
    heading += [f"{names[k]} peak MiB" for k in memory]
    print("| layer | " + " | ".join(heading) + " |", file=file)
    print("|---|" + "---:|" * len(heading), file=file)
    for r in rows:
        cells = [f"{r[f'{k}_ms']:.2f}" for k in names] + [f"{r['torch_convbp_gflops']:.0f}", f"{r['of_peak']:.0%}"]
        cells += [f"{r[f'vs_{k}']:.2f}" for k in others]
        cells += [f"{r['channels_last_vs_builtin_channels_last']:.2f}"] if channels_last else []
        cells += [f"{r[f'{k}_peak_mib']:.0f}" for k in memory]
        print(f"| {r['layer']} | " + " | ".join(cells) + " |", file=file)
    means = [f"**{geomean(r[f'vs_{k}'] for r in rows):.2f}**" for k in others]
    means += [f"**{geomean(r['channels_last_vs_builtin_channels_last'] for r in rows):.2f}**"] if channels_last else []
    print("| **geometric mean** | " + " | ".join([""] * (len(names) + 2) + means + [""] * len(memory)) + " |", file=file)


def print_memory(rows, file=None):
    file = file or sys.stdout
    print("\nPeak workspace of one forward+backward (torch_convbp's scratch memory; the output is for scale):", file=file)
    print("| layer | batch | output MiB | peak MiB (limit 1 GiB) | s | peak MiB (limit 64 MiB) | s |", file=file)
    print("|---|---:|---:|---:|---:|---:|---:|", file=file)
    for r in rows:
        print(f"| {r['layer']} | {r['batch']} | {r['output_mib']:.0f} | {r['default_peak_mib']:.1f} | "
              f"{r['default_seconds']:.3f} | {r['tight_peak_mib']:.1f} | {r['tight_seconds']:.3f} |", file=file)


def print_scaling(rows, file=None):
    file = file or sys.stdout
    print(f"\nScaling of one forward+backward, {rows[0]['layer']} (linear when ns per output pixel stays flat):", file=file)
    print("| varied | batch | image size | torch_convbp ms | ns/pixel | builtin ms | ns/pixel |", file=file)
    print("|---|---:|---:|---:|---:|---:|---:|", file=file)
    for r in rows:
        print(f"| {r['axis']} | {r['batch']} | {r['size']} | {r['torch_convbp_ms']:.2f} | {r['torch_convbp_ns_per_pixel']:.2f} | "
              f"{r['builtin_ms']:.2f} | {r['builtin_ns_per_pixel']:.2f} |", file=file)


def plot(result, path):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, a = result["rows"], result["args"]
    names = [r["layer"] for r in rows]
    series = [(f"vs {builtin_name(a['device'])}", "vs_builtin", "#1f77b4"),
              ("vs ATen im2col", "vs_aten_im2col", "#ff7f0e"),
              ("vs bare GEMMs", "vs_gemm", "#7f7f7f")]
    if "channels_last_vs_builtin_channels_last" in rows[0]:  # both fed channels_last
        series.append((f"channels_last: vs {builtin_name(a['device'])} channels_last",
                       "channels_last_vs_builtin_channels_last", "#2ca02c"))
    fig, ax = plt.subplots(figsize=(9, 0.15 * len(series) * len(rows) + 1.6))
    height = 0.8 / len(series)
    for i, (label, key, color) in enumerate(series):  # bars from 1 to the ratio
        offset = (i - (len(series) - 1) / 2) * height
        ax.barh([j + offset for j in range(len(rows))], [r[key] - 1 for r in rows], height, left=1,
                label=label, color=color)
    ax.set_xscale("log", base=2)
    ratios = [r[key] for r in rows for _, key, _ in series]
    ax.set_xlim(min(0.25, min(ratios) / 1.2), max(4.0, max(ratios) * 1.2))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    finish_ratio_plot(fig, ax, path, range(len(rows)), names,
                      "torch_convbp time / other time (log scale; left of 1: torch_convbp is faster)",
                      f"torch_convbp, {a['passes']} pass(es), {a['dtype']}, batch {a['batch']}\n"
                      f"{result['machine']}, {result['date']}")


def finish_ratio_plot(fig, ax, path, yticks, labels, xlabel, title):
    """What every ratio plot of the benchmarks shares (bench_models.py too): horizontal bars
    against a line at 1, labelled rows from the top, the legend beside the bars (never over
    them), and the PNG."""
    import matplotlib.pyplot as plt

    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(yticks, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# --- the command ---------------------------------------------------------------------------------

def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--suite", default="quick", help="quick, resnet18, resnet50, mobilenet or all (see shapes.json)")
    p.add_argument("--layers", default="", help="only the layers whose name contains this")
    p.add_argument("--passes", default="both", choices=["forward", "backward", "both"],
                   help="forward only, backward only (from a saved forward), or both")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds; medians are reported")
    p.add_argument("--tf32", action="store_true", help="allow TF32 on CUDA")
    p.add_argument("--memory", action="store_true", help="also measure the peak workspace for --memory-batches")
    p.add_argument("--memory-batches", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--scaling", action="store_true", help="also time against batch size and image size")
    p.add_argument("--scaling-layer", default="resnet18 3x3 128 @28")
    p.add_argument("--scaling-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--scaling-sizes", type=int, nargs="+", default=[14, 28, 56, 112])
    p.add_argument("--json", help="write everything measured here")
    p.add_argument("--plot", help="write a PNG of the ratios per layer here (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


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


if __name__ == "__main__":
    main()
