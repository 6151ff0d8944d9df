"""Whole torchvision models, run on this checkout's torch_convbp:

    python benchmarks/bench_models.py [options]    # = python -m torch_convbp models [options]

What it times, and its options: torch_convbp/benchmark/models.py (or --help)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_convbp.benchmark.models import main  # noqa: E402

if __name__ == "__main__":
    main()
