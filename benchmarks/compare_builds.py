"""Before/after: torch_convbp's time per layer in two builds of it, side by side.

    python benchmarks/compare_builds.py --before /path/to/old/checkout [--after .] [--suite all]
                                        [--device cuda] [--layers 1x1] [--channels-last]

Each build is a checkout with the extension built in place (`python setup.py build_ext --inplace`,
or an editable install). Two builds of one extension cannot live in one process (they register the
same operators), so this runs one process per build, alternating before, after, before, ... for
--pairs pairs, each timing every layer of the suite (forward + backward, interleaved rounds as in
the layer benchmark). It reports per layer the median over the processes and the after/before ratio.

glibc's malloc adapts its mmap threshold to the sizes freed so far, so whether a layer's 25 MB
output comes from reused heap or from fresh, page-faulting mmap depends on what the process ran
before: measured, the 1x1 64>256@56 layer ran at 19.7 or 37.6 ms from one process to the next. The
child processes fix the thresholds (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) so that both
builds see the same allocator.
"""
import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(100 << 30)}


def this_checkouts_benchmark():
    """This checkout's torch_convbp/benchmark as a package of its own, "bench": a child process
    times another checkout's torch_convbp (an older one may have no benchmark package) with the
    same layers and timing code for both builds."""
    path = os.path.join(os.path.dirname(HERE), "torch_convbp", "benchmark")
    spec = importlib.util.spec_from_file_location("bench", os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    sys.modules["bench"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["bench"])
    return importlib.import_module("bench.layers"), importlib.import_module("bench.steps"), \
        importlib.import_module("bench.timing")


def time_layers(args, out_path):
    """In a child process: torch_convbp's median fwd+bwd seconds for every layer of the suite that
    this build has a function for (a build older than conv3d has no 3-D layers). On CUDA, TF32
    stays off, as in the benchmark's float32 table."""
    import torch
    import torch_convbp

    layers, steps, timing = this_checkouts_benchmark()
    torch.backends.cuda.matmul.allow_tf32 = False
    times = {"module": torch_convbp.__file__, "layers": {}}
    for layer in layers.load_layers(args.suite, args.layers):
        if not hasattr(torch_convbp, f"conv{layers.dims(layer)}d"):
            continue
        batch = layers.batch_of(layer, args.batch)
        x, w = layers.make_operands(layer, batch, args.device, getattr(torch, args.dtype))
        if args.channels_last:
            x, w = (t.detach().to(memory_format=layers.channels_last(t)).requires_grad_() for t in (x, w))
        step = steps.conv_step(layers.functions(layer)[0], x, w, layer, "both")
        times["layers"][layer["name"]] = timing.time_interleaved({"ours": step}, args.rounds)["ours"]
    with open(out_path, "w") as f:
        json.dump(times, f)


def run_build(checkout, args, out_path):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), **FIXED_MALLOC)
    command = [sys.executable, os.path.abspath(__file__), "--child", out_path,
               "--suite", args.suite, "--layers", args.layers, "--dtype", args.dtype,
               "--rounds", str(args.rounds), "--device", args.device]
    if args.batch:
        command += ["--batch", str(args.batch)]
    if args.channels_last:
        command.append("--channels-last")
    subprocess.run(command, env=env, check=True, cwd=tempfile.gettempdir())
    with open(out_path) as f:
        result = json.load(f)
    expected = os.path.join(os.path.abspath(checkout), "torch_convbp")
    if not result["module"].startswith(expected):
        sys.exit(f"compare_builds: {checkout} imported torch_convbp from {result['module']}; "
                 "build it in place there first")
    return result["layers"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="checkout of the old build", required="--child" not in (argv or sys.argv))
    parser.add_argument("--after", default=os.path.dirname(HERE), help="checkout of the new build (this one)")
    parser.add_argument("--suite", default="all")
    parser.add_argument("--layers", default="", help="only the layers whose name contains this")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    parser.add_argument("--batch", type=int, help="every layer's batch (default: the layer's own, else 8)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--channels-last", action="store_true", help="operands in channels_last")
    parser.add_argument("--pairs", type=int, default=3, help="before/after process pairs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        time_layers(args, args.child)
        return
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(args.pairs):
            for name in ("before", "after"):
                path = os.path.join(scratch, f"{name}{pair}.json")
                runs[name].append(run_build(getattr(args, name), args, path))
    both = [layer for layer in runs["after"][0] if layer in runs["before"][0]]
    skipped = set(runs["after"][0]) ^ set(runs["before"][0])
    if skipped:
        print(f"compare_builds: {len(skipped)} layers only one build has, left out: {', '.join(sorted(skipped))}")
    median = {name: {layer: statistics.median(run[layer] for run in rs) for layer in both}
              for name, rs in runs.items()}
    print("| layer | before ms | after ms | after / before | per pair |")
    print("|---|---:|---:|---:|---|")
    ratios = []
    for layer, before in median["before"].items():
        after = median["after"][layer]
        ratios.append(after / before)
        pairs = " ".join(f"{a[layer] / b[layer]:.2f}" for b, a in zip(runs["before"], runs["after"]))
        print(f"| {layer} | {before * 1e3:.2f} | {after * 1e3:.2f} | {after / before:.3f} | {pairs} |")
    print(f"| **geometric mean** | | | **{math.exp(statistics.mean(map(math.log, ratios))):.3f}** | |")


if __name__ == "__main__":
    main()
