"""python -m torch_convbp, the command line of an installed package: the main job (a self-check and a
timing table), the benchmarks, and which route a convolution takes. CI also runs it from a wheel
installed into a fresh environment (tools/check_wheel.sh)."""
import subprocess
import sys

import pytest

import torch_convbp
from torch_convbp.__main__ import main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("check", "bench", "models", "explain", "--version"):
        assert f"python -m torch_convbp {command}" in out


def test_version_names_the_build(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert f"torch_convbp {torch_convbp.__version__}" in out and f"torch {torch_convbp._C.built_with_torch}" in out


def test_explain_prints_the_routes(capsys):
    assert main(["explain", "--input", "2", "16", "9", "9", "--weight", "32", "16", "3", "3", "--stride", "2",
                 "--padding", "1", "--channels-last"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["forward", "input_grad", "weight_grad"]
    assert "col2im" in lines[1]
    assert main(["explain", "--input", "16", "50", "--weight", "16", "1", "5", "--groups", "16", "--padding", "same"]) == 0
    assert "depthwise" in capsys.readouterr().out


def test_explain_refuses_a_bad_convolution():
    with pytest.raises(RuntimeError, match="expected input of size"):
        main(["explain", "--input", "2", "16", "9", "9", "--weight", "32", "8", "3", "3"])


def test_the_main_job_checks_and_times_from_outside_the_tree(tmp_path):
    """In a fresh process, started away from the checkout: the package finds its layer list
    (package data) and prints its table."""
    run = subprocess.run([sys.executable, "-m", "torch_convbp", "check", "--layers", "512 @7", "--batch", "1",
                          "--rounds", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Self-check passed." in run.stdout and "| resnet18 3x3 512 @7 |" in run.stdout


def test_bench_takes_the_benchmarks_options(tmp_path, capsys):
    assert main(["bench", "--suite", "all", "--layers", "dw 3x3 576", "--batch", "1", "--rounds", "1", "--quiet",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert "| mobilenet dw 3x3 576 @14 |" in capsys.readouterr().out and (tmp_path / "r.json").exists()
