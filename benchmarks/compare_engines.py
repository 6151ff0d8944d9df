"""torch_convbp's time per layer under each value of a setting, against the built-in convolution,
in one process, interleaved.

    python benchmarks/compare_engines.py [--suite quick] [--layers NAME] [--dtype float32] [--rounds 5]
        [--device cpu|cuda] [--variable TORCH_CONVBP_GEMM --values mkl auto]

By default the setting is the GEMM engine (TORCH_CONVBP_GEMM, csrc/gemm_choice.h): "mkl" runs every
GEMM on ATen's (MKL) and takes no micro-kernel route, which is this code's route on a CPU where the
micro-kernel is not preferred; "auto" is the default rule. Any other switch read on every call
works the same way (TORCH_CONVBP_POINTWISE_WEIGHT_GRAD=columns|by_images on a GPU, say). Each layer's forward
+ backward runs under each value, and on the built-in F.conv2d (oneDNN on the CPU, cuDNN on a
GPU), fed NCHW and fed channels_last, round after round; the table gives each value's median over
the built-in's fed the same format, and their geometric means."""
import argparse
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's build
from torch_convbp.benchmark import layers as L  # noqa: E402
from torch_convbp.benchmark import steps as S  # noqa: E402
from torch_convbp.benchmark import timing as T  # noqa: E402
from torch_convbp.benchmark.environment import environment, environment_line, machine_description  # noqa: E402

FORMATS = ("nchw", "channels_last")


@contextlib.contextmanager
def setting(variable, value):
    before = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[variable]
        else:
            os.environ[variable] = before


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="quick")
    parser.add_argument("--layers", default="")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--variable", default="TORCH_CONVBP_GEMM", help="the environment variable compared")
    parser.add_argument("--values", nargs="+", default=["mkl", "auto"])
    args = parser.parse_args(argv)
    dtype, device, values = getattr(torch, args.dtype), args.device, args.values
    print(f"{machine_description(device)}, torch {torch.__version__}\n{environment_line(environment(device, dtype))}")
    print(f"{args.variable}: each value's time over the built-in's, fed the same format")
    print(f"{'layer':<32}" + "".join(f" {f + ' ' + e:>20}" for f in FORMATS for e in values))
    ratios = {(f, e): [] for f in FORMATS for e in values}
    for layer in L.load_layers(args.suite, args.layers):
        x, w = L.make_operands(layer, L.batch_of(layer, args.batch), device, dtype)
        operands = {"nchw": (x, w), "channels_last": S.channels_last_copies(x, w)}
        ours, builtin = L.functions(layer)
        steps = {}
        for fmt, (a, b) in operands.items():
            for value in values:
                steps[f"{fmt} {value}"] = S.conv_step(
                    ours, a, b, layer, "both", lambda value=value: setting(args.variable, value)
                )
            steps[f"{fmt} builtin"] = S.conv_step(builtin, a, b, layer, "both")
        times = T.time_interleaved(steps, args.rounds)
        row = []
        for fmt in FORMATS:
            for value in values:
                ratio = times[f"{fmt} {value}"] / times[f"{fmt} builtin"]
                ratios[(fmt, value)].append(ratio)
                row.append(f"{ratio:20.2f}")
        ms = " ".join(f"{fmt} {name} {1e3 * times[f'{fmt} {name}']:.3f}" for fmt in FORMATS for name in (*values, "builtin"))
        print(f"{layer['name']:<32}" + " ".join(row) + f"   ms: {ms}", flush=True)
    print(f"{'geometric mean':<32}" + " ".join(f"{statistics.geometric_mean(r):20.3f}" for r in ratios.values()))
    return ratios


if __name__ == "__main__":
    main()
