"""python -m torch_convbp: the command line of an installed torch_convbp.

    python -m torch_convbp                  # check: a self-check against F.conv2d, then a timing
                                            #   table of a few layers on this machine
    python -m torch_convbp check --layers "3x3 64" --rounds 1     # a smaller, faster table
    python -m torch_convbp bench [options]  # the layer benchmark (python -m torch_convbp bench --help)
    python -m torch_convbp models [options] # whole torchvision models (needs torchvision)
    python -m torch_convbp host             # the host time of a tiny convolution's step, and the
                                            #   ATen operations (GPU launches) of each operator
    python -m torch_convbp explain --input 8 64 56 56 --weight 64 64 3 3 --padding 1 --channels-last
                                            # which route each operator takes, and why
    python -m torch_convbp --version        # the version, and what it was built with
"""
import argparse
import sys
import time

import torch

import torch_convbp

COMMANDS = ("check", "bench", "models", "host", "explain")


def version():
    cuda = "with CUDA kernels" if torch_convbp.CUDA_KERNELS else "without CUDA kernels"
    archs = torch_convbp._C.built_for_cuda_archs
    built = f"built against torch {torch_convbp._C.built_with_torch}, {cuda}"
    return f"torch_convbp {torch_convbp.__version__}, {built}" + (f" for {archs}" if archs else "")


def check(argv):
    from ._self_check import self_check
    from .benchmark import suite
    from .benchmark.report import geomean

    p = argparse.ArgumentParser(prog="python -m torch_convbp check", description="A self-check against "
                                "F.conv2d, then a timing table (fwd+bwd, float32) of a few layers on this machine.")
    p.add_argument("--suite", default="quick", help="the layers to time (see `bench --help`); default: quick")
    p.add_argument("--layers", default="", help="only the layers whose name contains this")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    args = p.parse_args(argv)
    print(version())
    passed = self_check()
    print(f"\nTiming, forward + backward, float32, batch {args.batch}...")
    start = time.time()
    rows = suite.main(["--suite", args.suite, "--layers", args.layers, "--batch", str(args.batch), "--quiet",
                       "--rounds", str(args.rounds)])["rows"]
    builtin = "cuDNN" if torch.cuda.is_available() else "oneDNN"
    print(f"\nIn short: on these layers torch_convbp takes {geomean(r['vs_builtin'] for r in rows):.2f}x the time of "
          f"{builtin} (geometric mean) and {geomean(r['vs_aten_im2col'] for r in rows):.2f}x that of ATen's own "
          f"im2col path, measured in {time.time() - start:.0f} s.")
    print("Self-check " + ("passed." if passed else "FAILED."))
    return 0 if passed else 1


def explain(argv):
    p = argparse.ArgumentParser(prog="python -m torch_convbp explain",
                                description="Which route each operator of a convolution takes, and why (nothing is computed).")
    p.add_argument("--input", type=int, nargs="+", required=True, metavar="N", help="the input's size: N C H W, C H W, or N C L")
    p.add_argument("--weight", type=int, nargs="+", required=True, metavar="N", help="the weight's size: Cout Cin/G kH kW")
    p.add_argument("--stride", type=int, nargs="+", default=[1])
    p.add_argument("--padding", nargs="+", default=["0"], help="ints, or 'same' or 'valid'")
    p.add_argument("--dilation", type=int, nargs="+", default=[1])
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float64", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--channels-last", action="store_true", help="the input (and weight) in channels_last")
    args = p.parse_args(argv)
    padding = args.padding[0] if args.padding[0] in ("same", "valid") else [int(v) for v in args.padding]
    options = dict(dtype=getattr(torch, args.dtype), device=args.device)
    x, w = torch.empty(args.input, **options), torch.empty(args.weight, **options)
    if args.channels_last and x.dim() == 4:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    print(torch_convbp.explain(x, w, args.stride, padding, args.dilation, args.groups))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    if command == "bench":
        from .benchmark import suite

        suite.main(argv[1:])
        return 0
    if command == "models":
        from .benchmark import models

        models.main(argv[1:])
        return 0
    if command == "host":
        from .benchmark import host

        host.main(argv[1:])
        return 0
    if command == "explain":
        return explain(argv[1:])
    if command is None and argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if command is None and argv and argv[0] == "--version":
        print(version())
        return 0
    return check(argv[1:] if command == "check" else argv)


if __name__ == "__main__":
    sys.exit(main())
