"""The benchmark commands run end to end (on a small layer, one round): every pass, every section,
the JSON and the plot (torch_convbp/benchmark/; benchmarks/bench_conv.py and bench_models.py are
their front ends for a checkout)."""
import importlib.util
import json
import os

import pytest
import torch

import torch_convbp
from torch_convbp.benchmark import layers, models, steps, suite


def test_every_layer_is_well_formed():
    suite_layers = layers.load_layers("all")
    assert len({layer["name"] for layer in suite_layers}) == len(suite_layers) >= 15
    for layer in suite_layers:
        assert layer["in_channels"] % layer["groups"] == 0 and layer["out_channels"] % layer["groups"] == 0
        assert all(n > 0 for n in layers.out_sizes(layer))
        assert set(layer["suites"]) <= set(layers.SUITES)
        x, w = layers.make_operands(layer, 1, "meta", torch.float32)
        y = layers.functions(layer)[1](x, w, None, *layers.conv_args(layer))  # F's own size
        assert list(y.shape) == [1, layer["out_channels"], *layers.out_sizes(layer)]
    assert {layers.dims(layer) for layer in suite_layers} == {2, 3}
    assert len(layers.load_layers("2d")) + len(layers.load_layers("3d")) == len(suite_layers)


@pytest.mark.parametrize("passes", ["forward", "backward", "both"])
def test_layer_table(passes, capsys):
    result = suite.main(["--device", "cpu", "--suite", "all", "--layers", "512 @7", "--batch", "1",
                              "--rounds", "1", "--passes", passes, "--quiet"])
    (row,) = result["rows"]
    for candidate in (*steps.CANDIDATES, "builtin_channels_last", "torch_convbp_channels_last"):
        assert row[f"{candidate}_ms"] > 0
    assert "builtin_deterministic_ms" not in row  # a GPU-only variant
    assert row["vs_builtin"] == pytest.approx(row["torch_convbp_ms"] / row["builtin_ms"])
    assert row["vs_builtin_channels_last"] == pytest.approx(row["torch_convbp_ms"] / row["builtin_channels_last_ms"])
    assert row["channels_last_vs_builtin_channels_last"] == pytest.approx(
        row["torch_convbp_channels_last_ms"] / row["builtin_channels_last_ms"])
    assert result["ceilings"]["square_gemm_gflops"] > 0
    assert all(row["square_gemm_gflops"] > 0 and row["of_peak"] > 0 for row in result["rows"])
    assert "| resnet18 3x3 512 @7 |" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["r3d_18 3x3x3 512 @2x7", "unet3d up 2x2x2/2"])
def test_volume_layers_time_their_own_functions(name):
    """A 3-D layer, and a transposed one, through every candidate: torch_convbp's conv3d or
    conv_transpose3d against F's, F's without oneDNN (slow_conv3d, slow_conv_transpose3d), and
    the bare GEMMs of the same sizes."""
    result = suite.main(["--device", "cpu", "--suite", "3d", "--layers", name, "--batch", "1", "--rounds", "1",
                         "--passes", "forward", "--quiet"])
    (row,) = result["rows"]
    assert row["batch"] == 1
    for candidate in (*steps.CANDIDATES, "builtin_channels_last", "torch_convbp_channels_last"):
        assert row[f"{candidate}_ms"] > 0
    layer = layers.load_layers("3d", name)[0]
    assert row["torch_convbp_gflops"] == pytest.approx(layers.flops(layer, 1, "forward") / row["torch_convbp_ms"] / 1e6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_rows_have_the_deterministic_variant_and_peak_memory():
    result = suite.main(["--device", "cuda", "--suite", "all", "--layers", "512 @7", "--batch", "2", "--rounds", "1",
                              "--quiet"])
    (row,) = result["rows"]
    assert row["builtin_deterministic_ms"] > 0
    for candidate in ("torch_convbp", "torch_convbp_channels_last", "builtin", "builtin_channels_last",
                      "builtin_deterministic", "aten_im2col"):
        assert row[f"{candidate}_peak_mib"] > 0  # at least the output and the gradients


def test_memory_scaling_json_and_plot(tmp_path):
    """The plot needs matplotlib, an optional dependency; the rest runs without it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        matplotlib = None
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    suite.main(["--device", "cpu", "--suite", "all", "--layers", "dw 3x3 128", "--batch", "1", "--rounds", "1",
                     "--memory", "--memory-batches", "1", "2", "--scaling", "--scaling-layer", "512 @7",
                     "--scaling-batches", "1", "2", "--scaling-sizes", "7", "--json", str(out_json),
                     "--quiet"] + (["--plot", str(out_png)] if matplotlib else []))
    saved = json.loads(out_json.read_text())
    assert [r["batch"] for r in saved["memory"]] == [1, 2]
    assert all(r["default_peak_mib"] <= r["default_limit_mib"] and r["tight_peak_mib"] <= r["tight_limit_mib"]
               for r in saved["memory"])
    assert [(r["axis"], r["batch"], r["size"]) for r in saved["scaling"]] == [("batch", 1, 7), ("batch", 2, 7), ("size", 1, 7)]
    if matplotlib:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_benchmark_runs_or_says_torchvision_is_missing(tmp_path, capsys):
    args = ["--device", "cpu", "--models", "resnet18", "r3d_18", "--batch", "2", "--size", "64", "--clip-batch", "1",
            "--clip-size", "4", "32", "--rounds", "1", "--json", str(tmp_path / "models.json")]
    plotting = importlib.util.find_spec("matplotlib") is not None
    if plotting:
        args += ["--plot", str(tmp_path / "models.png")]
    models.main(args)
    out = capsys.readouterr().out
    try:
        import torchvision  # noqa: F401
    except ImportError:
        assert "torchvision is not installed" in out and "skipped" in out
        return
    result = json.loads((tmp_path / "models.json").read_text())
    assert [(r["model"], r["format"], r["input"]) for r in result["rows"]] == [
        ("resnet18", "nchw", "64x64"), ("resnet18", "channels_last", "64x64"), ("r3d_18", "nchw", "4x32x32"),
        ("r3d_18", "channels_last", "4x32x32")]
    assert all(r["stock_ms"] > 0 and r["torch_convbp_ms"] > 0 for r in result["rows"])
    assert "| resnet18 | channels_last | 2 | 64x64 |" in out and "| r3d_18 | channels_last | 1 | 4x32x32 |" in out
    assert not plotting or (tmp_path / "models.png").stat().st_size > 0


def test_model_benchmark_refuses_an_unknown_model():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pytest.skip("torchvision is not installed")
    with pytest.raises(SystemExit, match="no model"):
        models.main(["--models", "resnet_nonexistent"])


@pytest.mark.parametrize("command, args", [(models.main, ["--models", "resnet18"]),
                                           (suite.main, ["--device", "cpu", "--layers", "resnet18 3x3 512"])],
                         ids=["models", "suite"])
def test_plot_without_matplotlib_is_refused_before_timing(command, args, capsys):
    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed")
    with pytest.raises(SystemExit):
        command(args + ["--plot", "out.png"])
    out = capsys.readouterr()
    assert "--plot needs matplotlib" in out.err and "|" not in out.out  # refused, nothing timed


def test_cuda_graphs_mode_is_refused_off_a_gpu(capsys):
    with pytest.raises(SystemExit):
        suite.main(["--device", "cpu", "--layers", "resnet18 3x3 512", "--cuda-graphs"])
    assert "--cuda-graphs needs --device cuda" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graphs_mode_times_every_candidate_captured(capsys):
    result = suite.main(["--device", "cuda", "--layers", "resnet18 3x3 512", "--batch", "2", "--rounds", "1",
                         "--cuda-graphs", "--quiet"])
    (row,) = result["rows"]
    assert row["torch_convbp_ms"] > 0 and row["builtin_ms"] > 0 and "torch_convbp_peak_mib" not in row
    assert "captured in a CUDA graph" in capsys.readouterr().out


def test_host_time_command_times_both_and_counts_each_operators_launches(tmp_path, capsys):
    """The tiny convolution's step (ours against F.conv2d) and the ATen operations of each
    operator: a forward call launches its im2col, one GEMM and the bias add, nothing else."""
    from torch_convbp.benchmark import host

    out = tmp_path / "host.json"
    result = host.main(["--rounds", "1", "--json", str(out)])
    assert set(result["microseconds"]) == {f"{who}_{part}" for who in ("torch_convbp", "builtin")
                                           for part in ("step", "forward", "backward")}
    assert all(us > 0 for us in result["microseconds"].values())
    ops = result["operations"]
    # ATen's GEMM on any CPU: the tiny convolution's results are 3 channels wide, too thin for the
    # micro-kernel driver (csrc/gemm_choice.cpp, gemm_engine); a product this small calls ATen's
    # BLAS straight, without at::addmm_ (csrc/cpu/blas_gemm_cpu.cpp), on a GPU it is at::addmm_
    gemm = "torch_convbp::blas_gemm"
    assert ops["conv2d"]["launches"] == ["torch_convbp::im2col", gemm, "add_"]
    assert ops["conv2d_weight_grad"]["launches"] == ["torch_convbp::im2col", gemm]
    # the stride-1 input gradient: its weight (18 elements per output channel) outnumbers its output
    # gradient (16), so on the CPU the GEMM reads the weight as it is, then col2im (csrc/route.cpp,
    # input_grad_pays_col2im), with no flipped copy of the weight and no im2col of dY. Its product,
    # [18, 16], is wide enough for the micro-kernel driver: it runs there where such float32 GEMMs
    # do (AMD CPUs: gemm_engine)
    on_driver = torch_convbp.gemm_engine(torch.float32, result=(18, 16)) == "microkernel"
    wide_gemm = "torch_convbp::microkernel_gemm" if on_driver else gemm
    assert ops["conv2d_input_grad"]["launches"] == [wide_gemm, "torch_convbp::col2im"]
    for counts in ops.values():
        assert counts["calls"] == counts["views"] + counts["allocations"] + counts["wrappers"] + counts["would_launch"]
    assert json.loads(out.read_text())["environment"]
    assert f"launches (torch_convbp::im2col, {gemm}, add_)" in capsys.readouterr().out


def load_script(name):
    """A script of benchmarks/ (not part of the package) as a module."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_scaling_times_every_thread_count_and_keeps_what_it_measured(tmp_path, capsys):
    out = tmp_path / "scaling.json"
    result = load_script("cpu_scaling").main(["--threads", "1", "2", "--suite", "all", "--layers", "512 @7",
                                              "--batch", "1", "--rounds", "1", "--json", str(out)])
    assert list(result["by_threads"]) == ["1", "2"]
    for entry in result["by_threads"].values():
        (row,) = entry["layers"]
        assert row["layer"] == "resnet18 3x3 512 @7"
        assert all(row[f"{who}_{fmt}_ms"] > 0 for who in ("ours", "builtin") for fmt in ("nchw", "channels_last"))
    assert json.loads(out.read_text())["by_threads"] == result["by_threads"]
    assert "| 2 |" in capsys.readouterr().out


def test_per_sample_gradient_benchmark_agrees_with_the_stock_model_and_keeps_its_times(tmp_path, capsys):
    out = tmp_path / "func.json"
    worst, rows = load_script("bench_func").main(["--batch", "3", "--size", "8", "--rounds", "1", "--json", str(out)])
    assert worst < 1e-4
    assert [r["case"] for r in json.loads(out.read_text())["rows"]] == [name for name, _ in rows]
    assert all(t["stock"] > 0 and t["torch_convbp"] > 0 for _, t in rows)
    assert "| small CNN, batch 3, 8x8 |" in capsys.readouterr().out


def test_cpu_scaling_refuses_a_filter_that_leaves_no_layer():
    with pytest.raises(SystemExit, match="no layer"):
        load_script("cpu_scaling").main(["--layers", "no such layer"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_the_layer_profile_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        load_script("profile_layers").main(["--layers", "dw"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_layer_profile_lists_each_formats_kernels(capsys):
    load_script("profile_layers").main(["--layers", "576 @14", "--batch", "2", "--steps", "1"])
    out = capsys.readouterr().out
    assert "mobilenet dw 3x3 576 @14, nchw" in out and "mobilenet dw 3x3 576 @14, channels_last" in out
    assert "depthwise_weight_grad" in out


def test_results_name_the_cpu_by_family_model_and_caches(tmp_path):
    from torch_convbp.benchmark.environment import cpu_identity, environment_line

    cpuinfo = tmp_path / "cpuinfo"
    block = "processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: {model}\n" \
            "model name\t: Intel(R) Xeon(R) Processor @ 2.80GHz\nstepping\t: 6\n\n"
    # the first processor's block is the one read
    cpuinfo.write_text(block.format(n=0, model=106) + block.format(n=1, model=85))
    caches = tmp_path / "cache"
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1280K")]):
        (caches / f"index{index}").mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (caches / f"index{index}" / name).write_text(f"{value}\n")
    identity = cpu_identity(str(cpuinfo), str(caches))
    assert identity == {"vendor": "GenuineIntel", "family": 6, "model": 106, "stepping": 6,
                        "caches": {"L1d": "48K", "L1i": "32K", "L2": "1280K"}}
    assert cpu_identity(str(tmp_path / "absent"), str(tmp_path / "absent")) == {
        "vendor": None, "family": None, "model": None, "stepping": None, "caches": {}}
    env = {"torch_convbp": {"version": "0.1.0", "commit": None}, "cpu": identity, "cpu_flags": ["avx512f"],
           "aten_cpu_capability": "AVX512", "onednn": "3.12.0", "mkl": "2024.2", "gemm_dtype": "float32",
           "settings": {}}
    assert "CPU family 6 model 106, L2 1280K a core; ISA: avx512f" in environment_line(env)
    # results written before the CPU was recorded still print
    assert "ISA: avx512f" in environment_line({**env, "cpu": None})
