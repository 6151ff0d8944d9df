"""Route grouped: layers fed channels_last with several groups of at most 32 output channels
(not depthwise, as ResNeXt's 3x3 layers) compute their forward and weight grad, and their input
grad where it is a stride-1 convolution with narrow groups too, with direct kernels
(csrc/cpu/grouped_forward_cpu.cpp, grouped_weight_grad_cpu.cpp, cuda/grouped_thread.h): no
column matrix, no GEMM, the same bits on CPU and CUDA."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from route_cases import CL, assert_formats, assert_matches_the_references, dense_operands

ops = torch.ops.torch_convbp

# (name, input [N, C, H, W], out channels, kernel, stride, padding, dilation, groups, the
# grad-input's route): layers with narrow groups, whose forward the direct grouped kernel
# computes, and whose grad-input it computes where that is a stride-1 convolution (else col2im,
# in NCHW where the groups are narrower than 16 channels)
NARROW_GROUPS = [
    ("4 per group", (2, 16, 9, 10), 16, (3, 3), (1, 1), (1, 1), (1, 1), 4, "grouped/nhwc"),
    # half a vector of float64 per group, an odd number of groups: summed across the groups
    ("three groups of 2", (2, 6, 7, 8), 6, (3, 3), (1, 1), (1, 1), (1, 1), 3, "grouped/nhwc"),
    ("24 output channels per group from 4", (2, 8, 6, 7), 48, (3, 3), (1, 1), (1, 1), (1, 1), 2, "grouped/nhwc"),
    ("asymmetric, dilated", (2, 6, 11, 12), 9, (3, 2), (1, 1), (1, 0), (2, 3), 3, "grouped/nhwc"),
    ("8 per group, strided", (2, 16, 9, 10), 16, (3, 3), (2, 2), (1, 1), (1, 1), 2, "columns/nchw"),
    ("padding past the reach", (1, 8, 5, 6), 8, (2, 2), (1, 1), (2, 2), (1, 1), 2, "columns/nchw"),
    # the grad-weight's blocks: 2 vectors of output channels, and input channels in blocks of
    # 6 or 8 and the rest in 4, 2, 1 (csrc/cpu/grouped_weight_grad_cpu.cpp)
    ("16 per group, batch of one", (1, 32, 6, 7), 32, (3, 3), (1, 1), (1, 1), (1, 1), 2, "grouped/nhwc"),
    ("7 input and 12 output channels per group", (2, 14, 5, 6), 24, (3, 3), (1, 1), (1, 1), (1, 1), 2, "grouped/nhwc"),
    ("32 output channels per group from 13, strided", (1, 26, 4, 5), 64, (2, 2), (2, 1), (0, 1), (1, 1), 2, "columns/nchw"),
]


@pytest.mark.parametrize(
    "name, shape, cout, kernel, stride, padding, dilation, groups, dx_route", NARROW_GROUPS, ids=[c[0] for c in NARROW_GROUPS]
)
def test_narrow_groups_in_nhwc(name, shape, cout, kernel, stride, padding, dilation, groups, dx_route, device):
    """The three operators against F.conv2d and our shift-and-add reference, in float64, with
    channels_last results: the forward and grad-weight by the direct kernels (the grad-weight
    bitwise the direct kernel's), the grad-input by them where it is a stride-1 convolution of
    narrow groups, and opcheck for each."""
    x, w = dense_operands(shape, cout, kernel, groups, device=device)
    b = torch.randn(cout, dtype=x.dtype, device=device)
    args = (stride, padding, dilation, groups)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    y = torch_convbp.conv2d(x, w, b, *args)
    g = torch.randn_like(y).contiguous(memory_format=CL)
    ours = (y, *torch.autograd.grad(y, (x, w, b), g))
    # The routes of this call, whose output gradient is channels_last (F.conv2d's output is NCHW
    # on CUDA in float64, so explain's default gradient would be too).
    routes = [f"{r.route}/{r.layout}" for r in torch_convbp.explain(x, w, *args, grad_output=g)]
    assert routes == ["grouped/nhwc", dx_route, "grouped/nhwc"]
    assert_formats(ours, assert_matches_the_references(ours, x, w, b, g, *args))
    assert not ours[1].is_contiguous()
    x, w = x.detach(), w.detach()
    opcheck(ops.conv2d.default, (x, w, None, *args))
    opcheck(ops.conv2d_input_grad.default, (g, w, list(shape), *args))
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), *args)
    direct = torch.empty_like(w)
    ops.grouped_weight_grad(x, g, *args, direct)
    assert torch.equal(dw, direct)  # the route: the direct kernel's bits
    opcheck(ops.conv2d_weight_grad.default, (x, g, list(w.shape), *args))
    # the kernel's output in NHWC, whatever format F.conv2d gave y (NCHW on CUDA in float64)
    opcheck(ops.grouped_conv2d.default, (x, w, *args, torch.empty_like(y, memory_format=CL)))
    opcheck(ops.grouped_weight_grad.default, (x, g, *args, torch.empty_like(w)))


# (name, input [N, C, H, W], out channels, kernel, stride, padding, groups, the three routes in
# float32, the operators on the grouped kernels in bfloat16) fed NCHW on the CPU: the grouped
# kernels through layout copies where they outran the NCHW routes (csrc/route.cpp,
# grouped_pays_layout). In float32 the forward and the stride-1 input gradient where the
# convolution computed has at most 16 output channels per group, the weight gradient where the
# input's planes have at most 1024 pixels; in bfloat16 the weight gradient of at most 8 output
# channels per group, the others of at most 4 on planes of at most 1024 pixels.
GROUPED, COLUMNS, TRANSPOSED = "grouped/nhwc", "columns/nchw", "transposed_columns/nchw"
NCHW_NARROW_GROUPS = [
    ("4 per group", (2, 16, 9, 10), 16, (3, 3), (1, 1), (1, 1), 4, (GROUPED, GROUPED, GROUPED), "yyy"),
    ("16 per group, asymmetric", (1, 32, 6, 7), 32, (3, 2), (1, 1), (1, 0), 2, (GROUPED, GROUPED, GROUPED), "nnn"),
    ("32 output channels per group from 8", (2, 16, 6, 7), 64, (3, 3), (1, 1), (1, 1), 2, (COLUMNS, GROUPED, GROUPED), "nnn"),
    ("8 per group, strided", (2, 16, 9, 10), 16, (3, 3), (2, 2), (1, 1), 2, (GROUPED, COLUMNS, GROUPED), "nny"),
    ("8 per group, planes over 1024 pixels", (1, 16, 33, 32), 16, (3, 3), (1, 1), (1, 1), 2, (GROUPED, GROUPED, COLUMNS), "nny"),
    ("4 per group, planes over 1024 pixels", (1, 8, 33, 32), 8, (3, 3), (1, 1), (1, 1), 2, (GROUPED, GROUPED, COLUMNS), "nny"),
    # the input gradient's convolution has one input channel per group: a depthwise multiplier's
    ("2 input channels per group, 1 output", (1, 12, 8, 9), 6, (3, 3), (1, 1), (1, 1), 6, (GROUPED, TRANSPOSED, GROUPED), "yny"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "name, shape, cout, kernel, stride, padding, groups, routes, bfloat16_grouped",
    NCHW_NARROW_GROUPS,
    ids=[c[0] for c in NCHW_NARROW_GROUPS],
)
def test_narrow_groups_fed_nchw_take_the_grouped_kernels_through_copies(
    name, shape, cout, kernel, stride, padding, groups, routes, bfloat16_grouped, dtype
):
    """The routes, NCHW results, values against float64 F.conv2d, and the bits of the grouped
    kernels: an operator on that route gives exactly what it gives fed channels_last. Empty
    batches keep the other routes."""
    x, w = dense_operands(shape, cout, kernel, groups, dtype=dtype)
    x = x.contiguous()
    args = (stride, padding, (1, 1), groups)
    y = ops.conv2d(x, w, None, *args)
    g = torch.randn(y.shape, dtype=torch.float64).to(dtype)
    explained = [f"{r.route}/{r.layout}" for r in torch_convbp.explain(x, w, *args, grad_output=g)]
    if dtype == torch.float32:
        assert explained == list(routes)
    else:
        assert [r == GROUPED for r in explained] == [c == "y" for c in bfloat16_grouped]
    ours = (y, ops.conv2d_input_grad(g, w, list(shape), *args), ops.conv2d_weight_grad(x, g, list(w.shape), *args))
    x64, w64, g64 = x.double(), w.double(), g.double()
    expected = (
        F.conv2d(x64, w64, None, *args),
        torch.nn.grad.conv2d_input(list(shape), w64, g64, *args),
        torch.nn.grad.conv2d_weight(x64, list(w.shape), g64, *args),
    )
    xc, gc = x.contiguous(memory_format=CL), g.contiguous(memory_format=CL)
    fed_channels_last = (
        ops.conv2d(xc, w, None, *args),
        ops.conv2d_input_grad(gc, w, list(shape), *args),
        ops.conv2d_weight_grad(xc, gc, list(w.shape), *args),
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, route, got, want, cl in zip(("forward", "input grad", "weight grad"), explained, ours, expected, fed_channels_last):
        assert got.is_contiguous() and got.dtype == dtype, name  # NCHW operands, NCHW results
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 50, msg=lambda m: f"{name}: {m}")
        if route == GROUPED:
            assert torch.equal(got, cl), name
    opcheck(ops.conv2d.default, (x, w, None, *args))
    opcheck(ops.conv2d_input_grad.default, (g, w, list(shape), *args))
    opcheck(ops.conv2d_weight_grad.default, (x, g, list(w.shape), *args))
    empty = torch_convbp.explain(x[:0], w, *args, grad_output=g[:0])
    assert "grouped" not in {r.route for r in empty}


def test_narrow_groups_have_gradients_of_any_order(device):
    x, w = dense_operands((1, 8, 5, 4), 8, (3, 3), 2, device=device)
    x.requires_grad_(), w.requires_grad_()
    fn = lambda x, w: torch_convbp.conv2d(x, w, None, 1, 1, 1, 2)
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


@pytest.mark.parametrize("groups", [8, 16], ids=["8 per group", "4 per group"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_narrow_groups_in_low_precision(dtype, groups, device):
    """Each sum in float32 (float16 and bfloat16 widened as they are read), rounded once; groups
    of 4 are summed two groups a vector on the CPU."""
    x64, w64 = dense_operands((2, 64, 7, 9), 64, (3, 3), groups, device=device)
    x, w = x64.to(dtype).contiguous(memory_format=CL), w64.to(dtype)
    args = ((1, 1), (1, 1), (1, 1), groups)
    y = torch_convbp.conv2d(x, w, None, *args)
    g = torch.randn_like(y).contiguous(memory_format=CL)
    dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), *args)
    y64 = F.conv2d(x.double(), w.double(), None, *args)
    dx64 = torch.nn.grad.conv2d_input(list(x.shape), w.double(), g.double(), *args)
    dw64 = torch.nn.grad.conv2d_weight(x.double(), list(w.shape), g.double(), *args)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for a, r in ((y, y64), (dx, dx64)):
        assert a.dtype == dtype and a.is_contiguous(memory_format=CL)
        torch.testing.assert_close(a.double(), r, rtol=tol, atol=tol * 10)
    assert dw.dtype == dtype and dw.is_contiguous(memory_format=CL)  # the input's format
    torch.testing.assert_close(dw.double(), dw64, rtol=tol, atol=tol * 100)  # sums of 126 terms


def grouped_kernels_results(cases):
    """The direct grouped kernels' forward and grad-weight of each (x, w, dy, groups)."""
    results = []
    for x, w, dy, groups in cases:
        args = ((1, 1), (1, 1), (1, 1), groups)
        x, dy = x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL)
        results.append((ops.conv2d(x, w, None, *args), ops.conv2d_weight_grad(x, dy, list(w.shape), *args)))
    return results


@pytest.mark.parametrize("switch", ["TORCH_CONVBP_NO_AVX2", "TORCH_CONVBP_NO_AVX512", "TORCH_CONVBP_NO_BFLOAT16_PAIRS"])
def test_every_compiled_version_gives_the_same_bits(tmp_path, switch):
    """The direct grouped kernels are compiled for AVX-512 (64-byte vectors), for AVX2 and for any
    x86-64 CPU (32-byte vectors), and pick one as they run; TORCH_CONVBP_NO_AVX2 makes a fresh
    process take the last, TORCH_CONVBP_NO_AVX512 the AVX2 one (csrc/cpu/vector_ops.h), and
    TORCH_CONVBP_NO_BFLOAT16_PAIRS sums bfloat16 terms one an instruction where a CPU with
    AVX512_BF16 sums them two (Avx512PairOps; odd channel counts end in half a pair). All round
    each term once, in the same order, whatever their vectors' width and whether they sum group by
    group or across the groups, so they give the same bits. (On a CPU without AVX-512 the second
    compares the AVX2 code with itself, and without AVX512_BF16 the third the same code.)"""
    cases = []
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for shape, cout, groups in (
            ((2, 16, 9, 10), 16, 4),
            ((1, 14, 5, 6), 24, 2),
            ((1, 32, 4, 13), 64, 2),
            ((1, 6, 5, 9), 6, 3),
            ((2, 64, 7, 7), 64, 4),
            ((1, 56, 4, 12), 16, 2),
            ((2, 12, 6, 7), 16, 4),
            ((1, 5, 5, 6), 20, 5),
        ):
            x, w = dense_operands(shape, cout, (3, 3), groups, dtype=dtype)
            dy = torch.randn(shape[0], cout, *shape[2:], dtype=torch.float64).to(dtype)
            cases.append((x, w, dy, groups))
    torch.save(cases, tmp_path / "cases.pt")
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from test_route_grouped import grouped_kernels_results; "
        "torch.save(grouped_kernels_results(torch.load(sys.argv[2] + '/cases.pt')), sys.argv[2] + '/results.pt')"
    )
    env = {**os.environ, switch: "1"}
    subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__), str(tmp_path)], env=env, check=True)
    baseline = torch.load(tmp_path / "results.pt")
    for ours, theirs in zip(grouped_kernels_results(cases), baseline):
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)


def test_the_grouped_kernel_refuses_what_it_cannot_compute(device):
    x, w = dense_operands((2, 8, 5, 5), 8, (3, 3), 2, device=device)
    out = torch.empty(2, 8, 5, 5, dtype=x.dtype, device=device).contiguous(memory_format=CL)
    args = ([1, 1], [1, 1], [1, 1], 2)
    with pytest.raises(RuntimeError, match="both channels_last"):
        ops.grouped_conv2d(x.contiguous(), w, *args, out)
    with pytest.raises(RuntimeError, match="expected a contiguous weight"):
        ops.grouped_conv2d(x, w.transpose(2, 3), *args, out)
    with pytest.raises(RuntimeError, match=r"expected output of size \[2, 8, 5, 5\]"):
        ops.grouped_conv2d(x, w, *args, out[:, :, :4])
    with pytest.raises(RuntimeError, match="expected input of size"):
        ops.grouped_conv2d(x, w, [1, 1], [1, 1], [1, 1], 4, out)
    dw = torch.empty_like(w)
    with pytest.raises(RuntimeError, match="both channels_last"):
        ops.grouped_weight_grad(x, out.contiguous(), *args, dw)
    with pytest.raises(RuntimeError, match="expected a contiguous weight"):
        ops.grouped_weight_grad(x, out, *args, dw.transpose(2, 3))
    with pytest.raises(RuntimeError, match=r"expected output of size \[2, 8, 5, 5\]"):
        ops.grouped_weight_grad(x, out[:, :, :4], *args, dw)
    with pytest.raises(RuntimeError, match="same dtype"):
        ops.grouped_weight_grad(x, out, *args, dw.float())
