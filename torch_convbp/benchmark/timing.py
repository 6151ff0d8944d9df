"""How the benchmarks time: interleaved rounds and their medians, a progress line, and the
machine's ceilings (a square GEMM and a large copy) measured the same way."""
import statistics
import sys
import time

import torch
from torch.utils import benchmark

import torch_convbp


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
