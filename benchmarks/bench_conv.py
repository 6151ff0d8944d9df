"""The layer benchmark, run on this checkout's torch_convbp:

    python benchmarks/bench_conv.py [options]      # = python -m torch_convbp bench [options]

What it times, and its options: torch_convbp/benchmark/suite.py (or --help)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_convbp.benchmark.suite import main  # noqa: E402

if __name__ == "__main__":
    main()
