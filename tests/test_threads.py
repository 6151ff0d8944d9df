"""The same bits on any number of CPU threads.

The output, the grad-input and the grad-weight of a call must be bitwise identical whether the call
runs on 1, 2, 3 or 4 threads: the work is cut into chunks, GEMM blocks and weight-gradient partial
sums by the sizes alone, every GEMM is single-threaded, and every sum is taken in a fixed order
(docs/design.md, "The same bits on any thread count"). The threads only decide who runs what.
"""
import contextlib

import pytest
import torch

import torch_convbp
from route_cases import has_microkernel

ops = torch.ops.torch_convbp

THREAD_COUNTS = (1, 2, 3, 4)

# name: (input size, out channels, kernel, stride, padding, dilation, groups, workspace limit)
LAYERS = {
    "many-small-images": ((24, 8, 10, 10), 16, (3, 3), 1, 1, 1, 1, None),
    "one-large-image-in-row-bands": ((1, 4, 96, 80), 8, (3, 3), 1, 1, 1, 1, 60_000),
    "one-image-one-chunk": ((1, 32, 12, 12), 48, (3, 3), 1, 1, 1, 1, None),
    # one chunk whose GEMMs have more rows than columns: cut into row blocks
    "deep-small-images": ((2, 64, 7, 7), 544, (3, 3), 1, 1, 1, 1, None),
    "deep-strided": ((2, 64, 9, 9), 96, (3, 3), 2, 1, 1, 1, None),
    # one chunk of a grouped layer: cut into blocks of whole groups
    "grouped-one-chunk": ((1, 32, 10, 10), 64, (3, 3), 1, 1, 1, 8, None),
    "grouped-strided": ((6, 12, 15, 13), 18, (3, 3), 2, 1, 1, 3, None),
    "strided-row-bands": ((2, 6, 41, 37), 10, (3, 3), 2, 1, 1, 1, 20_000),
    # wide enough groups for the NHWC column matrix (fed channels_last): bands through col2im_nhwc
    "strided-row-bands-16-channels": ((2, 16, 33, 29), 16, (3, 3), 2, 1, 1, 1, 60_000),
    "pointwise": ((8, 32, 14, 14), 64, (1, 1), 1, 0, 1, 1, None),
    "pointwise-wide-images": ((3, 16, 24, 24), 32, (1, 1), 1, 0, 1, 1, None),
    # fed channels_last: a weight gradient [24, 16] too narrow to cut, cut along its 6400 pixels
    "pointwise-narrow-many-pixels": ((4, 16, 40, 40), 24, (1, 1), 1, 0, 1, 1, None),
    "pointwise-strided": ((4, 32, 14, 14), 48, (1, 1), 2, 0, 1, 1, None),
    # fed channels_last: a weight gradient [128, 128] that could be cut into blocks, cut instead
    # along its 8192 pixels (at least 8 times its side), into 8 shares
    "pointwise-long-contraction": ((8, 128, 32, 32), 128, (1, 1), 1, 0, 1, 1, None),
    # the same with more output than input channels: on MKL in float32, each share computes the
    # transposed product [32, 128] (gemm.h)
    "pointwise-long-contraction-tall": ((8, 32, 32, 32), 128, (1, 1), 1, 0, 1, 1, None),
    "dilated-5x5": ((5, 8, 20, 20), 16, (5, 5), 1, 4, 2, 1, None),
    "asymmetric": ((7, 6, 13, 17), 9, (3, 2), (2, 1), (1, 0), (1, 2), 3, None),
    "depthwise": ((6, 16, 15, 13), 32, (3, 3), (2, 1), 1, 1, 16, None),
    "small-workspace": ((10, 8, 12, 12), 12, (3, 3), 1, 1, 1, 1, 4_000),
    # fed channels_last in float32 on a CPU with the GEMM micro-kernel: the implicit route, a
    # GEMM per tap on views (forward and grad-input), in row tiles
    "implicit-row-tiles": ((3, 32, 20, 18), 48, (3, 3), 1, 1, 1, 1, None),
    "implicit-strided-dilated": ((2, 16, 23, 33), 32, (3, 3), 2, 2, 2, 1, None),
}


@contextlib.contextmanager
def threads(count):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


RESULTS = ("output", "grad_input", "grad_weight", "grad_bias")


def results_of(spec, dtype, channels_last, conv=torch_convbp.conv2d):
    """The output and the three gradients of one layer (a LAYERS-style tuple, of any rank), seeded,
    under the layer's workspace limit; channels_last is the rank's format (4-D or 5-D)."""
    size, out_channels, kernel, stride, padding, dilation, groups, limit = spec
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, generator=g).to(dtype)
    w = torch.randn(out_channels, size[1] // groups, *kernel, generator=g).to(dtype)
    b = torch.randn(out_channels, generator=g).to(dtype)
    if channels_last:
        fmt = torch.channels_last if len(size) == 4 else torch.channels_last_3d
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    with torch_convbp.workspace_limit(limit or torch_convbp.get_workspace_limit()):
        y = conv(x, w, b, stride, padding, dilation, groups)
        grads = torch.autograd.grad(y, (x, w, b), torch.cos(y.double()).to(dtype))
    return (y.detach(), *grads)


def assert_same_bits(runs):
    """runs: thread count -> results; each must equal the one-thread run bit for bit."""
    for count, run in runs.items():
        for name, one, many in zip(RESULTS, runs[1], run):
            assert torch.equal(one, many), (
                f"{name} on {count} threads differs from 1 thread: "
                f"max |diff| {(one.double() - many.double()).abs().max().item():.3g}"
            )


def results(layer, dtype, channels_last):
    return results_of(LAYERS[layer], dtype, channels_last)


@pytest.mark.parametrize("engine", ["mkl", "microkernel"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_same_bits_on_any_thread_count(layer, dtype, channels_last, engine, monkeypatch):
    """On either GEMM engine (TORCH_CONVBP_GEMM: ATen's MKL, or our driver on the micro-kernel
    where this CPU has it)."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", engine)
    runs = {}
    for count in THREAD_COUNTS:
        with threads(count):
            runs[count] = results(layer, dtype, channels_last)
    assert_same_bits(runs)


# Calls with a single unit (one chunk: a deep layer at batch 1), whose GEMMs are cut into blocks
# instead, for up to 16 threads (gemm.h): 16 blocks of 68 output channels (the forward; the
# column matrix they share fits in cache), 16 blocks of one group each, and a forward whose
# shared column matrix (1.27 MiB) does not fit in cache: 4 blocks. Layers the implicit route
# never takes (fewer than 16 input channels per group, or one tap; csrc/route.cpp), nor, fed
# NCHW, the grouped kernels (17 output channels per group), so that their forward is the columns
# route's GEMM.
SINGLE_UNIT_LAYERS = {
    "sixteen-row-blocks": ((1, 15, 7, 7), 1088, (3, 3), 1, 1, 1, 1, None),
    "group-blocks": ((1, 128, 8, 8), 272, (3, 3), 1, 1, 1, 16, None),
    "shared-operand-over-cache": ((1, 2304, 24, 24), 1024, (1, 1), 2, 0, 1, 1, None),
}


@pytest.mark.parametrize("layer", list(SINGLE_UNIT_LAYERS))
def test_a_single_unit_call_has_work_for_many_threads(layer):
    """A many-core machine gets up to 16 pieces of a batch-1 deep layer; the bits stay the same
    on any thread count, more threads than blocks included, and add up to the convolution."""
    runs = {}
    for count in (1, 2, 5, 8, 16, 24):
        with threads(count):
            runs[count] = results_of(SINGLE_UNIT_LAYERS[layer], torch.float32, False)
    assert_same_bits(runs)
    ours = results_of(SINGLE_UNIT_LAYERS[layer], torch.float64, False)
    expected = results_of(SINGLE_UNIT_LAYERS[layer], torch.float64, False, conv=torch.nn.functional.conv2d)
    for name, got, want in zip(RESULTS, ours, expected):
        torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("layer, blocks", [
    ("sixteen-row-blocks", 16),
    ("group-blocks", 16),
    ("shared-operand-over-cache", 4),
])
def test_the_forward_of_a_single_unit_is_cut_into_blocks(layer, blocks):
    """The pieces a many-core machine gets, counted: one GEMM call per block (gemm.h), on either
    GEMM engine."""
    size, out_channels, kernel, stride, padding, dilation, groups, _ = SINGLE_UNIT_LAYERS[layer]
    x, w = torch.randn(size), torch.randn(out_channels, size[1] // groups, *kernel)
    assert torch_convbp.explain(x, w, stride, padding, dilation, groups)["forward"].route == "columns"
    with torch.profiler.profile() as profile:
        torch_convbp.conv2d(x, w, None, stride, padding, dilation, groups)
    gemm_calls = ("aten::addmm_", "torch_convbp::microkernel_gemm")
    assert sum(event.name in gemm_calls for event in profile.events()) == blocks


def test_a_long_contraction_is_cut_into_shares():
    """The channels_last 1x1 weight gradient [128, 128] contracts 8192 pixels: 8 shares of 1024
    (gemm.h), one GEMM call each, where 2 blocks of the result would each read all the pixels."""
    size, out_channels = LAYERS["pointwise-long-contraction"][:2]
    x = torch.randn(size).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(size[0], out_channels, *size[2:]).contiguous(memory_format=torch.channels_last)
    weight_size = [out_channels, size[1], 1, 1]
    with torch.profiler.profile() as profile:
        ops.conv2d_weight_grad(x, dy, weight_size, [1, 1], [0, 0], [1, 1], 1)
    gemm_calls = ("aten::addmm_", "torch_convbp::microkernel_gemm")
    assert sum(event.name in gemm_calls for event in profile.events()) == 8


@pytest.mark.parametrize("engine", ["mkl", "microkernel"])
@pytest.mark.parametrize("out_channels", [128, 16], ids=["tall", "wide"])
def test_the_shares_of_a_long_contraction_sum_to_the_weight_gradient_in_float32(out_channels, engine, monkeypatch):
    """Each share's product, in either form (a tall result's transposed where MKL runs it), adds
    up to the channels_last 1x1 weight gradient: float32 against float64."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", engine)
    size = LAYERS["pointwise-long-contraction-tall"][0]
    x64 = torch.randn(size, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    dy64 = torch.randn(size[0], out_channels, *size[2:], dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    weight_size = [out_channels, size[1], 1, 1]
    got = ops.conv2d_weight_grad(x64.float(), dy64.float(), weight_size, [1, 1], [0, 0], [1, 1], 1)
    want = torch.nn.grad.conv2d_weight(x64, weight_size, dy64)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)


# The implicit route's pieces are its tiles: an output row of one image, one group, up to 256 of
# the group's output channels (csrc/cpu/implicit_nhwc_cpu.cpp), each summed in a fixed order.
IMPLICIT_SINGLE_UNIT_LAYERS = {
    "deep-7x7": ((1, 64, 7, 7), 544, (3, 3), 1, 1, 1, 1, None),
    "groups": ((1, 64, 6, 9), 96, (3, 3), 1, 1, 1, 2, None),
    # 3 input channels: a kernel row's taps in one call
    "rgb-stem": ((2, 3, 23, 21), 64, (7, 7), 2, 3, 1, 1, None),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("layer", list(IMPLICIT_SINGLE_UNIT_LAYERS))
def test_the_implicit_route_has_the_same_bits_on_any_thread_count(layer, channels_last, monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "microkernel")
    spec = IMPLICIT_SINGLE_UNIT_LAYERS[layer]
    size, out_channels, kernel, stride, padding, dilation, groups, _ = spec
    x, w = torch.randn(size), torch.randn(out_channels, size[1] // groups, *kernel)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if not has_microkernel() or torch_convbp.explain(x, w, stride, padding, dilation, groups)["forward"].route != "implicit_nhwc":
        pytest.skip("the implicit route is not taken here (no micro-kernel, or NCHW on a CPU where MKL leads)")
    runs = {}
    for count in (1, 2, 3, 7, 16):
        with threads(count):
            runs[count] = results_of(spec, torch.float32, channels_last)
    assert_same_bits(runs)


def test_float64_too():
    runs = []
    for count in (1, 3):
        with threads(count):
            runs.append(results("many-small-images", torch.float64, False))
    for one, many in zip(*runs):
        assert torch.equal(one, many)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_the_cut_computes_the_convolution(layer, channels_last):
    """The blocks, bands, partial sums and shares that make the bits thread-free still add up to
    the convolution: float64, against F.conv2d's output and gradients."""
    ours = results(layer, torch.float64, channels_last)
    expected = results_of(LAYERS[layer], torch.float64, False, conv=torch.nn.functional.conv2d)
    for name, got, want in zip(RESULTS, ours, expected):
        torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}")
