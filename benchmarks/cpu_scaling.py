"""CPU scaling: torch_convbp against the built-in (oneDNN) at several thread counts, so that a
many-core machine shows whether our fixed pieces of work (NOTES section 35) leave cores idle.

    python benchmarks/cpu_scaling.py --threads 1 2 4 8 16 --suite quick --model resnet50 --json out.json

For each thread count (torch.set_num_threads): each layer of the suite, forward + backward, NCHW
and channels_last operands, ours and the built-in interleaved (medians); then, with --model, a
training step of the torchvision model, stock and converted, NCHW. The JSON is rewritten after
every measurement, so a run stopped by a time limit keeps what it measured.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_convbp.benchmark.environment import environment, machine_description  # noqa: E402
from torch_convbp.benchmark.layers import batch_of, load_layers  # noqa: E402
from torch_convbp.benchmark.steps import candidate_steps  # noqa: E402
from torch_convbp.benchmark.timing import time_interleaved  # noqa: E402

TIMED = {"torch_convbp": "ours_nchw", "builtin": "builtin_nchw",
         "torch_convbp_channels_last": "ours_channels_last", "builtin_channels_last": "builtin_channels_last"}


def time_layer(layer, args):
    steps = candidate_steps(layer, batch_of(layer, args.batch), "both", "cpu", torch.float32)
    seconds = time_interleaved({name: steps[name] for name in TIMED}, args.rounds)
    row = {"layer": layer["name"], **{f"{TIMED[k]}_ms": v * 1e3 for k, v in seconds.items()}}
    row["ratio_nchw"] = seconds["torch_convbp"] / seconds["builtin"]
    row["ratio_channels_last"] = seconds["torch_convbp_channels_last"] / seconds["builtin_channels_last"]
    return row


def time_model(name, args):
    import torchvision

    from torch_convbp.benchmark import models

    model_args = argparse.Namespace(device="cpu", batch=args.batch, size=224, rounds=args.rounds,
                                    clip_batch=2, clip_size=[16, 112])
    return models.time_model(torchvision, name, "nchw", model_args)


def geomean(values):
    return statistics.geometric_mean(values) if values else float("nan")


def print_summary(result):
    print(f"\n{result['machine']}, torch {result['torch']}, {result['date']}: fwd+bwd, batch "
          f"{result['args']['batch']}, float32, median of {result['args']['rounds']} interleaved rounds")
    print("| threads | layers: ours / oneDNN, NCHW (geomean) | fed channels_last | "
          "ours, speed-up over 1 thread | oneDNN, speed-up | model / stock |")
    print("|---:|---:|---:|---:|---:|---:|")
    base = {}
    for t, entry in result["by_threads"].items():
        rows = entry["layers"]
        ours = sum(r["ours_nchw_ms"] for r in rows)
        builtin = sum(r["builtin_nchw_ms"] for r in rows)
        base.setdefault("ours", ours)
        base.setdefault("builtin", builtin)
        model = f"{entry['model']['ratio']:.2f}" if "model" in entry else "-"
        print(f"| {t} | {geomean([r['ratio_nchw'] for r in rows]):.2f} | "
              f"{geomean([r['ratio_channels_last'] for r in rows]):.2f} | {base['ours'] / ours:.2f} | "
              f"{base['builtin'] / builtin:.2f} | {model} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--suite", default="quick")
    p.add_argument("--layers", default="", help="only the layers whose name contains this")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", help="also a training step of this torchvision model (resnet50, say)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    result = {"machine": machine_description("cpu"), "torch": torch.__version__,
              "date": datetime.date.today().isoformat(), "args": vars(args),
              "environment": environment("cpu", torch.float32), "by_threads": {}}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    layers = load_layers(args.suite, args.layers)
    if not layers:
        sys.exit(f"no layer of suite {args.suite!r} has {args.layers!r} in its name")
    for threads in args.threads:
        torch.set_num_threads(threads)
        entry = result["by_threads"].setdefault(str(threads), {"layers": []})
        for layer in layers:
            entry["layers"].append(time_layer(layer, args))
            print(f"{threads} threads: {entry['layers'][-1]}", file=sys.stderr, flush=True)
            save()
        if args.model:
            entry["model"] = time_model(args.model, args)
            print(f"{threads} threads: {entry['model']}", file=sys.stderr, flush=True)
            save()
    print_summary(result)
    return result


if __name__ == "__main__":
    main()
