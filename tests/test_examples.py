"""The examples run and say what the README says they say."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_gradient_penalty_matches_nn_conv2d():
    assert "ok: double backward through torch_convbp matches nn.Conv2d" in run_example("gradient_penalty.py")


def test_digits_trains_like_nn_conv2d():
    pytest.importorskip("sklearn")
    out = run_example("train_digits.py")
    accuracies = [float(line.split("accuracy")[1].strip(" %")) for line in out.splitlines() if "test accuracy" in line]
    assert len(accuracies) == 2 and min(accuracies) > 90 and accuracies[0] == accuracies[1], out
