"""The host time of a step: a convolution so small that nearly all of its time is fixed cost (the
work the CPU does to issue a call, which a GPU layer waits for when it is small), ours against
F.conv2d, and the ATen operations one call makes.

    python -m torch_convbp host                  # the tiny convolution of benchmarks/NOTES.md
    python -m torch_convbp host --rounds 9 --json host.json

Timed on the CPU, one thread, interleaved rounds, medians (timing.py). A step is the forward and
a backward with a given output gradient, as a layer inside a model sees it. The operation counts
come from torch.profiler, per operator: `views` make no data (view, select, transpose, ...),
`allocations` make empty tensors, and `would launch` are the operations that compute, each of
which is a kernel launch on a GPU (an operation inside another one that computes, such as the
copy inside a clone, is counted once). The same code runs on both devices but for the GEMM's
and kernels' own insides, so the counts are those of a CUDA call too.
"""
import argparse
import json

import torch
import torch.nn.functional as F

import torch_convbp

from .timing import time_interleaved

# The convolution of benchmarks/NOTES.md sections 15, 16 and 32: a 1x2x4x4 input, a 3x3 kernel.
INPUT, WEIGHT, PADDING = (1, 2, 4, 4), (3, 2, 3, 3), 1

VIEWS = {"view", "as_strided", "select", "narrow", "slice", "transpose", "t", "permute", "expand", "unsqueeze",
         "squeeze", "movedim", "reshape", "alias", "_reshape_alias", "flatten", "unflatten", "detach",
         "contiguous", "to", "resolve_conj", "resolve_neg", "view_as", "expand_as", "unfold"}
ALLOCATIONS = {"empty", "empty_strided", "empty_like"}
# Operations that only wrap others (their insides are counted).
WRAPPERS = {"clone", "_to_copy", "zeros", "zeros_like", "ones_like", "new_zeros", "new_empty", "zero_"}


def operands(requires_grad):
    torch.manual_seed(0)
    x = torch.randn(INPUT, requires_grad=requires_grad)
    w = torch.randn(WEIGHT, requires_grad=requires_grad)
    b = torch.randn(WEIGHT[0], requires_grad=requires_grad)
    return x, w, b


def steps():
    """The timed calls: for ours and F.conv2d, a whole step, its forward alone and its backward
    alone (the forward's graph kept for repeated backwards)."""
    x, w, b = operands(requires_grad=True)
    grad = torch.randn(INPUT[0], WEIGHT[0], INPUT[2], INPUT[3])
    out = {}
    for name, conv in (("torch_convbp", torch_convbp.conv2d), ("builtin", F.conv2d)):
        y = conv(x, w, b, padding=PADDING)
        out[f"{name}_step"] = lambda conv=conv: conv(x, w, b, padding=PADDING).backward(grad)
        out[f"{name}_forward"] = lambda conv=conv: conv(x, w, b, padding=PADDING)
        out[f"{name}_backward"] = lambda y=y: torch.autograd.backward(y, grad, retain_graph=True)
    return out


def count_operations(call):
    """The ATen operations a call makes below our operators, by kind: {"calls", "views",
    "allocations", "wrappers" (operations that only call others, counted too), "would_launch",
    "launches" (their names, in order)}."""
    from torch.profiler import profile

    call()  # once before, so that nothing is first-time work
    with profile() as prof:
        call()
    events = sorted((e for e in prof.events() if _is_operation(e) and not _is_operator(e)),
                    key=lambda e: e.time_range.start)
    counts = {"calls": len(events), "views": 0, "allocations": 0, "wrappers": 0, "would_launch": 0, "launches": []}
    for event in events:
        name = _short_name(event)
        if name in VIEWS:
            counts["views"] += 1
        elif name in ALLOCATIONS:
            counts["allocations"] += 1
        elif name in WRAPPERS:
            counts["wrappers"] += 1
        elif _computes(event) and not _inside_computing(event):
            counts["would_launch"] += 1
            counts["launches"].append(name)
    return counts


def _is_operation(event):
    return event.name.startswith("aten::") or event.name.startswith("torch_convbp::")


def _is_operator(event):
    """One of our convolution operators, which the counts are of."""
    return event.name.startswith("torch_convbp::conv")


def _short_name(event):
    return event.name.split("::", 1)[1] if event.name.startswith("aten::") else event.name


def _computes(event):
    name = _short_name(event)
    return _is_operation(event) and not _is_operator(event) and name not in VIEWS | ALLOCATIONS | WRAPPERS


def _inside_computing(event):
    """Whether an enclosing operation computes already (this one is then part of its launch)."""
    parent = event.cpu_parent
    while parent is not None:
        if _computes(parent):
            return True
        parent = parent.cpu_parent
    return False


def operator_calls():
    """Each of our three operators, called once as the backward calls it (no graph recorded)."""
    x, w, b = operands(requires_grad=False)
    grad = torch.randn(INPUT[0], WEIGHT[0], INPUT[2], INPUT[3])
    ops, one = torch.ops.torch_convbp, [1, 1]
    return {
        "conv2d": lambda: ops.conv2d(x, w, b, one, [PADDING] * 2, one, 1),
        "conv2d_input_grad": lambda: ops.conv2d_input_grad(grad, w, list(INPUT), one, [PADDING] * 2, one, 1),
        "conv2d_weight_grad": lambda: ops.conv2d_weight_grad(x, grad, list(WEIGHT), one, [PADDING] * 2, one, 1),
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torch_convbp host", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds; medians are reported")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = time_interleaved(steps(), args.rounds, min_seconds=0.2)
        counts = {name: count_operations(call) for name, call in operator_calls().items()}
    finally:
        torch.set_num_threads(threads)
    us = {name: s * 1e6 for name, s in seconds.items()}
    print(f"Host time, one thread, a {'x'.join(map(str, INPUT))} input and a {'x'.join(map(str, WEIGHT))} weight "
          f"(medians of {args.rounds} interleaved rounds):")
    print(f"{'':10s} {'torch_convbp':>13s} {'F.conv2d':>9s} {'ratio':>6s}")
    for part in ("step", "forward", "backward"):
        ours, builtin = us[f"torch_convbp_{part}"], us[f"builtin_{part}"]
        print(f"{part:10s} {ours:10.1f} us {builtin:6.1f} us {ours / builtin:6.2f}")
    print("\nATen operations per call of each operator (each computing one is a kernel launch on a GPU):")
    for name, c in counts.items():
        print(f"  {name:20s} {c['calls']:3d} calls: {c['views']:2d} views, {c['allocations']} allocations, "
              f"{c['would_launch']} launches ({', '.join(c['launches'])})")
    result = {"microseconds": us, "step_ratio": us["torch_convbp_step"] / us["builtin_step"],
              "operations": counts, "input": INPUT, "weight": WEIGHT, "rounds": args.rounds}
    if args.json:
        from .environment import environment

        result["environment"] = environment("cpu", torch.float32)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result
