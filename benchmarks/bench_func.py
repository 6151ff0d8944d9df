"""torch.func's per-sample gradients, vmap(grad(loss)), on a converted model against the stock one,
interleaved in one process; and the host time of one tiny layer under vmap(grad), where the
Python autograd Functions' cost (torch_convbp/_func.py) is all there is.

    python benchmarks/bench_func.py [--batch 32] [--size 32] [--rounds 7] [--device cpu] [--json out.json]

The model: three 3x3 convolutions (3>32, 32>64 stride 2, 64>64) with ReLUs, average pooling and a
linear layer, float32. Each example's gradient of every parameter, the batch mapped by vmap."""
import argparse
import copy
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's build
import torch_convbp  # noqa: E402
from torch_convbp.benchmark.environment import environment, environment_line, machine_description  # noqa: E402
from torch_convbp.benchmark.timing import time_interleaved  # noqa: E402


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


def per_sample_gradients(model, images, labels):
    """A step computing each example's gradients of every parameter."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(params, image, label):
        return F.cross_entropy(functional_call(model, params, (image[None],)), label[None])

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))
    return lambda: per_example(params, images, labels)


def tiny_layer(conv, device):
    """vmap(grad) of one 2>2 3x3 convolution of 4x4 images, batch 4: host time only."""
    images, weight = torch.randn(4, 2, 4, 4, device=device), torch.randn(2, 2, 3, 3, device=device)
    per_example = vmap(grad(lambda w, image: conv(image[None], w, padding=1).sum()), in_dims=(None, 0))
    return lambda: per_example(weight, images)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if min(args.batch, args.rounds) < 1 or args.size < 4:
        p.error("--batch and --rounds must be at least 1, --size at least 4")
    torch.manual_seed(0)
    stock = small_cnn().to(args.device)
    converted = torch_convbp.convert(copy.deepcopy(stock))
    images = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    labels = torch.randint(0, 10, (args.batch,), device=args.device)
    expected, got = per_sample_gradients(stock, images, labels)(), per_sample_gradients(converted, images, labels)()
    worst = max(((got[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-30)).item() for k in got)
    model = time_interleaved({"stock": per_sample_gradients(stock, images, labels),
                              "torch_convbp": per_sample_gradients(converted, images, labels)}, args.rounds)
    tiny = time_interleaved({"stock": tiny_layer(F.conv2d, args.device),
                             "torch_convbp": tiny_layer(torch_convbp.conv2d, args.device)}, args.rounds)
    env = environment(args.device, torch.float32)
    print(f"# {machine_description(args.device)}, torch {torch.__version__}")
    print(f"# {environment_line(env)}")
    print("| vmap(grad(loss)) | stock ms | torch_convbp ms | torch_convbp / stock |")
    print("|---|---:|---:|---:|")
    rows = [(f"small CNN, batch {args.batch}, {args.size}x{args.size}", model), ("one tiny layer (host time)", tiny)]
    for name, t in rows:
        print(f"| {name} | {t['stock'] * 1e3:.2f} | {t['torch_convbp'] * 1e3:.2f} | {t['torch_convbp'] / t['stock']:.2f} |")
    print(f"Per-sample gradients agree with the stock model's to {worst:.1e} (largest difference over the largest "
          f"value, per parameter).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_description(args.device), "torch": torch.__version__,
                       "threads": torch.get_num_threads(), "environment": env, "args": vars(args),
                       "largest_relative_difference": worst,
                       "rows": [{"case": name, "stock_ms": t["stock"] * 1e3, "torch_convbp_ms": t["torch_convbp"] * 1e3,
                                 "ratio": t["torch_convbp"] / t["stock"]} for name, t in rows]}, f, indent=1)
    return worst, rows


if __name__ == "__main__":
    main()
