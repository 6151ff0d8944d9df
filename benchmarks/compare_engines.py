"""torch_convbp's time per layer on each GEMM engine, against oneDNN, in one process, interleaved.

    python benchmarks/compare_engines.py [--suite quick] [--layers NAME] [--dtype float32] [--rounds 5]

The engines (TORCH_CONVBP_GEMM, csrc/gemm_choice.h): "mkl" runs every GEMM on ATen's (MKL) and
takes no micro-kernel route, which is this code's route on a CPU where the micro-kernel is not
preferred; "auto" is the default rule. Each layer's forward + backward runs on both, and on oneDNN
(the built-in F.conv2d), fed NCHW and fed channels_last, round after round; the table gives each
engine's median over oneDNN's fed the same format, and their geometric means."""
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

ENGINES = ("mkl", "auto")
FORMATS = ("nchw", "channels_last")


@contextlib.contextmanager
def engine(name):
    before = os.environ.get("TORCH_CONVBP_GEMM")
    os.environ["TORCH_CONVBP_GEMM"] = name
    try:
        yield
    finally:
        if before is None:
            del os.environ["TORCH_CONVBP_GEMM"]
        else:
            os.environ["TORCH_CONVBP_GEMM"] = before


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="quick")
    parser.add_argument("--layers", default="")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print(f"{machine_description('cpu')}, torch {torch.__version__}\n{environment_line(environment('cpu', dtype))}")
    print(f"{'layer':<32}" + "".join(f" {f + ' ' + e:>20}" for f in FORMATS for e in ENGINES))
    ratios = {(f, e): [] for f in FORMATS for e in ENGINES}
    for layer in L.load_layers(args.suite, args.layers):
        if L.dims(layer) != 2:
            continue
        x, w = L.make_operands(layer, L.batch_of(layer, args.batch), "cpu", dtype)
        operands = {"nchw": (x, w), "channels_last": S.channels_last_copies(x, w)}
        ours, builtin = L.functions(layer)
        steps = {}
        for fmt, (a, b) in operands.items():
            for name in ENGINES:
                steps[f"{fmt} {name}"] = S.conv_step(ours, a, b, layer, "both", lambda name=name: engine(name))
            steps[f"{fmt} onednn"] = S.conv_step(builtin, a, b, layer, "both")
        times = T.time_interleaved(steps, args.rounds)
        row = []
        for fmt in FORMATS:
            for name in ENGINES:
                ratio = times[f"{fmt} {name}"] / times[f"{fmt} onednn"]
                ratios[(fmt, name)].append(ratio)
                row.append(f"{ratio:20.2f}")
        print(f"{layer['name']:<32}" + " ".join(row), flush=True)
    print(f"{'geometric mean':<32}" + " ".join(f"{statistics.geometric_mean(r):20.3f}" for r in ratios.values()))
    return ratios


if __name__ == "__main__":
    main()
