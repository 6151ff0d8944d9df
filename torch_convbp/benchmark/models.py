"""Whole torchvision models: a training step of the converted model over the stock one's.

    python -m torch_convbp models                                   # all models, both formats
    python -m torch_convbp models --models resnet18 --formats channels_last --batch 8
    python -m torch_convbp models --models r3d_18 r2plus1d_18 --clip-batch 2   # video models
    python -m torch_convbp models --json models.json --plot models.png
    (benchmarks/bench_models.py takes the same options)

A training step is forward, cross-entropy loss, backward and an SGD step, on random images (for
the video models of torchvision.models.video, clips of 16 frames of 112x112) and labels. For
each model and memory format (NCHW, channels_last: the model and its input both converted with
.to(memory_format=...), channels_last_3d for the video models), the stock model (oneDNN on CPU, cuDNN on GPU) and a
torch_convbp.convert()ed copy with the same weights are timed round after round, interleaved, and
the medians are reported with their ratio (below 1: the converted model is faster).

Needs torchvision; without it the command says so and exits (the layer benchmark does not need
it).
"""
import argparse
import copy
import datetime
import json
import sys

import torch
import torch.nn.functional as F

import torch_convbp

from .environment import environment, environment_line, machine_description
from .report import check_plotting, finish_ratio_plot
from .timing import time_interleaved

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "resnext50_32x4d", "r3d_18", "r2plus1d_18")
FORMATS = ("nchw", "channels_last")
CLASSES = 1000


def is_video(torchvision, name):
    return hasattr(torchvision.models.video, name)


def memory_format(fmt, video):
    """The format's torch.memory_format for images, or for clips (5-D: channels_last_3d)."""
    if fmt == "nchw":
        return torch.contiguous_format
    return torch.channels_last_3d if video else torch.channels_last


def constructor(torchvision, name):
    return getattr(torchvision.models.video if is_video(torchvision, name) else torchvision.models, name)


def training_step(model, images, labels):
    """One SGD step of `model` on (images, labels)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    return step


def model_pair(torchvision, name, memory_format, device):
    """The stock model and its converted twin, same weights, in the memory format."""
    torch.manual_seed(0)
    stock = constructor(torchvision, name)(weights=None, num_classes=CLASSES).to(device, memory_format=memory_format)
    converted = torch_convbp.convert(copy.deepcopy(stock))
    return stock.train(), converted.train()


def time_model(torchvision, name, fmt, args):
    video = is_video(torchvision, name)
    stock, converted = model_pair(torchvision, name, memory_format(fmt, video), args.device)
    g = torch.Generator().manual_seed(0)
    batch = args.clip_batch if video else args.batch
    size = (3, *args.clip_size, args.clip_size[-1]) if video else (3, args.size, args.size)
    images = torch.randn(batch, *size, generator=g)
    images = images.to(args.device, memory_format=memory_format(fmt, video))
    labels = torch.randint(0, CLASSES, (batch,), generator=g).to(args.device)
    steps = {"stock": training_step(stock, images, labels),
             "torch_convbp": training_step(converted, images, labels)}
    times = time_interleaved(steps, args.rounds, min_seconds=0)
    return {"model": name, "format": fmt, "batch": batch, "input": "x".join(map(str, size[1:])),
            "stock_ms": times["stock"] * 1e3,
            "torch_convbp_ms": times["torch_convbp"] * 1e3,
            "ratio": times["torch_convbp"] / times["stock"]}


def print_table(result, file=None):
    a = result["args"]
    print(f"\n{result['machine']}, torch {result['torch']}, torchvision {result['torchvision']}, "
          f"{result['date']}: {a['device']}, training step (forward, loss, backward, SGD), median of "
          f"{a['rounds']} interleaved rounds.", file=file)
    if "environment" in result:
        print(environment_line(result["environment"]), file=file)
    print("| model | format | batch | input | stock ms | torch_convbp ms | torch_convbp / stock |", file=file)
    print("|---|---|---:|---|---:|---:|---:|", file=file)
    for r in result["rows"]:
        print(f"| {r['model']} | {r['format']} | {r['batch']} | {r['input']} | {r['stock_ms']:.0f} | "
              f"{r['torch_convbp_ms']:.0f} | {r['ratio']:.2f} |", file=file)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, a = result["rows"], result["args"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    formats = list(dict.fromkeys(r["format"] for r in rows))
    ratio = {(r["model"], r["format"]): r["ratio"] for r in rows}
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(models) + 1.6))
    height = 0.8 / len(formats)
    for i, fmt in enumerate(formats):
        ax.barh([j + i * height for j in range(len(models))],
                [ratio.get((m, fmt), float("nan")) for m in models], height, label=fmt)
    finish_ratio_plot(
        fig, ax, path, [j + height * (len(formats) - 1) / 2 for j in range(len(models))], models,
        "converted model's step time / stock model's (left of 1: torch_convbp is faster)",
        f"Training step, images: batch {a['batch']}, {a['size']}x{a['size']}; clips: batch {a['clip_batch']}, "
        f"{'x'.join(map(str, a['clip_size']))}; {a['device']}\n{result['machine']}, {result['date']}")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME",
                   help=f"torchvision model names (default: {' '.join(MODELS)})")
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--batch", type=int, default=8, help="images per step of the image models")
    p.add_argument("--size", type=int, default=224, help="image height and width")
    p.add_argument("--clip-batch", type=int, default=2, help="clips per step of the video models")
    p.add_argument("--clip-size", type=int, nargs=2, default=[16, 112], metavar=("FRAMES", "SIZE"),
                   help="frames per clip and their height and width (default 16 112)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", help="write a PNG plot here")
    args = p.parse_args(argv)
    if min(args.batch, args.clip_batch, args.rounds, *args.clip_size) < 1 or args.size < 32:
        p.error("--batch, --clip-batch, --clip-size and --rounds must be at least 1, --size at least 32")
    check_plotting(p, args)
    return args


def main(argv=None):
    args = parse(argv)
    try:
        import torchvision
    except ImportError:
        print("torch_convbp models: torchvision is not installed, so there are no models to time; "
              "skipped. (pip install torchvision matching your torch; the layer benchmark "
              "runs without it.)")
        return
    unknown = [m for m in args.models if not (hasattr(torchvision.models, m) or is_video(torchvision, m))]
    if unknown:
        sys.exit(f"torch_convbp models: torchvision {torchvision.__version__} has no model {unknown}")
    rows = []
    for name in args.models:
        for fmt in args.formats:
            print(f"timing {name} {fmt} ...", file=sys.stderr, flush=True)
            rows.append(time_model(torchvision, name, fmt, args))
    result = {"machine": machine_description(args.device), "torch": torch.__version__,
              "torchvision": torchvision.__version__, "date": datetime.date.today().isoformat(),
              "args": vars(args), "environment": environment(args.device, torch.float32), "rows": rows}
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(result, args.plot)

