"""Native channels_last. Calls whose operands are channels_last compute in NHWC, with no layout
copy, and return channels_last activations:
- a pointwise (1x1, stride 1, unpadded), ungrouped call: GEMMs on the tensors' own memory
  (csrc/pointwise_nhwc.h);
- a depthwise call (one input channel per group): the depthwise kernels in NHWC, which give
  bitwise the NCHW kernels' results (csrc/cpu/depthwise_nhwc_cpu.cpp, cuda/depthwise_thread.h);
- the forward and the grad-weight of a call with several groups of at most 32 output channels
  (not depthwise), and its grad-input where that is a stride-1 convolution with narrow groups
  too: the direct grouped kernels (csrc/cpu/grouped_nhwc_cpu.cpp, grouped_weight_grad_cpu.cpp,
  cuda/grouped_thread.h);
- every other call whose groups have 16 or more output channels and, with several groups, 16
  or more input channels: the NHWC column matrix [G, P, kh*kw*C/G] (im2col_nhwc, col2im_nhwc) and the same GEMMs as in NCHW, on
  transposed views (csrc/matrices.h).
The others, and calls whose operands are not all channels_last, compute in NCHW
(docs/design.md, "Memory formats")."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from cases import shift_and_add_conv2d

ops = torch.ops.torch_convbp
CL = torch.channels_last


def operands(n=3, c=6, h=5, w=7, cout=4, k=1, groups=1, dtype=torch.float64, device="cpu", layout=CL, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype).to(device).contiguous(memory_format=layout)
    wt = torch.randn(cout, c // groups, k, k, generator=g, dtype=dtype).to(device).contiguous(memory_format=layout)
    return x, wt


def assert_formats(ours, builtin):
    """The output comes in F.conv2d's format: on the CPU a channels_last call gives channels_last,
    on CUDA float64 stays NCHW (cuDNN would not compute it in channels_last) and our rule follows
    (docs/design.md, "Memory formats"). The grad-input comes in the output gradient's format,
    here channels_last (F.conv2d's comes NCHW on CUDA in float64; only torch.autograd.grad shows
    it: .grad of a leaf takes the leaf's layout)."""
    (y, dx), (y_ref, _) = ours[:2], builtin[:2]
    assert y.is_contiguous(memory_format=CL) == y_ref.is_contiguous(memory_format=CL)
    assert y.is_contiguous() == y_ref.is_contiguous()
    assert dx.is_contiguous(memory_format=CL)
    if y.device.type == "cpu":
        assert y.is_contiguous(memory_format=CL)


# (name, operands' keyword arguments, stride, padding, groups, whether the call computes in NHWC:
# the forward and grad-input both, or (forward, grad-input))
ROUTES = [
    ("pointwise channels_last", {}, 1, 0, 1, True),
    ("batch of one", dict(n=1), 1, 0, 1, True),
    ("one pixel per image", dict(h=1, w=1), 1, 0, 1, False),  # by its strides, not channels_last
    ("contiguous operands", dict(layout=torch.contiguous_format), 1, 0, 1, False),
    ("empty batch", dict(n=0), 1, 0, 1, False),
    ("grouped pointwise, 3 channels per group", {}, 1, 0, 2, True),  # the direct grouped kernel
    ("grouped pointwise contiguous", dict(layout=torch.contiguous_format), 1, 0, 2, False),
    ("strided pointwise, 4 output channels", {}, 2, 0, 1, False),
    ("strided pointwise, 16 channels", dict(c=16, cout=16), 2, 0, 1, True),
    ("padded pointwise", dict(c=16, cout=16), 1, 1, 1, True),
    ("3x3", dict(k=3, c=16, cout=16), 1, 1, 1, True),
    ("3x3 strided, 16 channels per group", dict(k=3, c=32, cout=32), 2, 1, 2, True),
    ("3x3, 4 output channels", dict(k=3, c=16), 1, 1, 1, False),
    ("3x3 strided, 3 input channels (an RGB stem)", dict(k=3, c=3, cout=16), 2, 1, 1, True),
    ("3x3 grouped, 3 input channels per group", dict(k=3, cout=32), 1, 1, 2, True),
    ("3x3, 2 channels per group", dict(k=3, cout=6), 1, 1, 3, True),
    # a strided grad-input is no convolution of its own: col2im, in NCHW for narrow groups
    ("3x3 strided, 4 channels per group", dict(k=3, c=8, cout=8), 2, 1, 2, (True, False)),
    # too many output channels per group for the forward's direct kernel; the grad-input's
    # convolution has 3 per group
    ("3x3 grouped, 33 output channels per group", dict(k=3, cout=66), 1, 1, 2, (False, True)),
    ("3x3 grouped, 1 output channel per group", dict(k=3, cout=3), 1, 1, 3, (True, False)),  # dx: depthwise-shaped, NCHW
    ("3x3 contiguous", dict(k=3, c=16, cout=16, layout=torch.contiguous_format), 1, 1, 1, False),
    ("3x3 empty batch", dict(n=0, k=3, c=16, cout=16), 1, 1, 1, False),
    ("depthwise 3x3", dict(k=3, cout=6), 1, 1, 6, True),
    ("depthwise multiplier 2, strided", dict(k=3, cout=12), 2, 1, 6, True),
    ("depthwise contiguous", dict(k=3, cout=6, layout=torch.contiguous_format), 1, 1, 6, False),
    ("depthwise empty batch", dict(n=0, k=3, cout=6), 1, 1, 6, False),
]


def conv_args(stride, padding, groups):
    return [stride, stride], [padding, padding], [1, 1], groups


@pytest.mark.parametrize("name, kwargs, stride, padding, groups, nhwc", ROUTES, ids=[r[0] for r in ROUTES])
def test_the_route_and_its_fake_kernels(name, kwargs, stride, padding, groups, nhwc, device):
    """The operators return channels_last exactly where the rule says, and opcheck (fake kernels
    included: their strides must match) passes for all three."""
    x, w = operands(groups=groups, device=device, **kwargs)
    args = conv_args(stride, padding, groups)
    in_layout = lambda t, nhwc: t.is_contiguous(memory_format=CL if nhwc else torch.contiguous_format) and (
        not nhwc or not t.is_contiguous()
    )
    y = ops.conv2d(x, w, None, *args)
    g = torch.randn_like(y).contiguous(memory_format=kwargs.get("layout", CL))
    dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
    forward_nhwc, input_grad_nhwc = nhwc if isinstance(nhwc, tuple) else (nhwc, nhwc)
    assert in_layout(y, forward_nhwc) and in_layout(dx, input_grad_nhwc)
    opcheck(ops.conv2d.default, (x, w, None, *args))
    opcheck(ops.conv2d_input_grad.default, (g, w, list(x.shape), *args))
    opcheck(ops.conv2d_weight_grad.default, (x, g, list(w.shape), *args))


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("n", [1, 4])
def test_values_and_gradients_against_f_conv2d_and_a_reference_of_our_own(n, bias, device):
    x, w = operands(n=n, c=8, h=6, w=3, cout=5, device=device)
    b = torch.randn(5, dtype=x.dtype, device=device) if bias else None
    x.requires_grad_(), w.requires_grad_()
    y = torch_convbp.conv2d(x, w, b)
    g = torch.randn_like(y).contiguous(memory_format=CL)
    ours = (y, *torch.autograd.grad(y, (x, w), g))
    y_ref = F.conv2d(x, w, b)
    ref = (y_ref, *torch.autograd.grad(y_ref, (x, w), g))
    assert_formats(ours, ref)
    y_own = shift_and_add_conv2d(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    own = (y_own, *torch.autograd.grad(y_own, (x, w), g))
    for a, r, o in zip(ours, ref, own):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a, o, rtol=1e-10, atol=1e-10)


def test_gradients_of_any_order(device):
    x, w = operands(n=2, c=3, h=3, w=4, cout=2, device=device)
    x.requires_grad_(), w.requires_grad_()
    fn = lambda x, w: torch_convbp.conv2d(x, w)
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


# (name, input [N, C, H, W], out channels, kernel, stride, padding, dilation, groups): layers the
# NHWC column matrix serves (16 or more output channels per group; with several groups, 16 or
# more input channels too), each with every operator's route
# (the stride-1 grad-input as a convolution, the strided one through col2im_nhwc)
DENSE = [
    ("3x3 padded", (2, 16, 7, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("asymmetric everything", (2, 32, 9, 8), 32, (3, 2), (2, 1), (1, 0), (1, 2), 2),
    ("grouped dilated", (2, 48, 8, 8), 48, (3, 3), (1, 1), (2, 2), (2, 2), 3),
    ("padding past the reach", (1, 32, 5, 6), 48, (2, 3), (1, 1), (3, 3), (1, 1), 2),
    ("strided pointwise", (2, 16, 6, 6), 24, (1, 1), (2, 2), (0, 0), (1, 1), 1),
    ("grouped pointwise", (3, 64, 5, 7), 64, (1, 1), (1, 1), (0, 0), (1, 1), 4),
    ("stride larger than the kernel", (2, 16, 10, 9), 16, (2, 2), (3, 3), (0, 0), (1, 1), 1),
    # one group and narrow inputs: a kernel row's taps copied as one run, or tap by tap where
    # the width is dilated
    ("RGB stem", (2, 3, 9, 10), 16, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    ("5x5, 6 input channels", (2, 6, 12, 11), 16, (5, 5), (1, 1), (2, 1), (1, 1), 1),
    ("5 input channels, dilated along the width", (2, 5, 8, 9), 16, (3, 3), (1, 2), (1, 2), (1, 2), 1),
]


def dense_operands(shape, cout, kernel, groups, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    w = torch.randn(cout, shape[1] // groups, *kernel, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    return x.contiguous(memory_format=CL), w


def assert_matches_the_references(ours, x, w, b, g, stride, padding, dilation, groups):
    """ours = (y, dx, dw, db) against F.conv2d's and our shift-and-add reference's, in float64, for
    the output gradient g; returns F.conv2d's."""
    y_ref = F.conv2d(x, w, b, stride, padding, dilation, groups)
    ref = (y_ref, *torch.autograd.grad(y_ref, (x, w, b), g))
    pads = (padding[0], padding[0], padding[1], padding[1])
    y_own = shift_and_add_conv2d(x, w, b, stride, pads, dilation, groups)
    own = (y_own, *torch.autograd.grad(y_own, (x, w, b), g))
    for a, r, o in zip(ours, ref, own):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a, o, rtol=1e-10, atol=1e-10)
    return ref


@pytest.mark.parametrize("workspace", ["whole images", "row bands"])
@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups", DENSE, ids=[d[0] for d in DENSE])
def test_dense_and_grouped_layers_in_nhwc(name, shape, cout, kernel, stride, padding, dilation, groups, workspace, device):
    """The three operators against F.conv2d and our shift-and-add reference, in float64, with
    channels_last results; also cut into row bands of one output row by a tiny workspace limit."""
    x, w = dense_operands(shape, cout, kernel, groups, device=device)
    b = torch.randn(cout, dtype=x.dtype, device=device)
    args = (stride, padding, dilation, groups)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    with torch_convbp.workspace_limit(1 if workspace == "row bands" else torch_convbp.get_workspace_limit()):
        y = torch_convbp.conv2d(x, w, b, *args)
        g = torch.randn_like(y).contiguous(memory_format=CL)
        ours = (y, *torch.autograd.grad(y, (x, w, b), g))
    assert_formats(ours, assert_matches_the_references(ours, x, w, b, g, *args))
    assert ours[2].is_contiguous()  # the weight gradient, in the weight's usual format


@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups", DENSE[:2], ids=[d[0] for d in DENSE[:2]])
def test_dense_layers_in_nhwc_have_gradients_of_any_order(name, shape, cout, kernel, stride, padding, dilation, groups, device):
    x, w = dense_operands((1, 16 * groups, 4, 4), 16 * groups, kernel, groups, device=device)
    x.requires_grad_(), w.requires_grad_()
    fn = lambda x, w: torch_convbp.conv2d(x, w, None, stride, padding, dilation, groups)
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dense_layers_in_nhwc_in_low_precision(dtype, device):
    """In half precision the NHWC columns are float32 on a CPU that computes the GEMMs in float32
    (im2col_nhwc converts as it copies, the results pass through staging): right either way."""
    x64, w64 = dense_operands((2, 32, 9, 7), 32, (3, 3), 2, device=device)
    x, w = x64.to(dtype).contiguous(memory_format=CL), w64.to(dtype)
    args = ((2, 1), (1, 1), (1, 1), 2)
    x.requires_grad_(), w.requires_grad_()
    y = torch_convbp.conv2d(x, w, None, *args)
    g = torch.randn_like(y).contiguous(memory_format=CL)
    ours = (y, *torch.autograd.grad(y, (x, w), g))
    x64.requires_grad_(), w64.requires_grad_()
    y64 = F.conv2d(x64, w64, None, *args)
    ref = (y64, *torch.autograd.grad(y64, (x64, w64), g.double()))
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}[dtype]
    for a, r in zip(ours, ref):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), r, rtol=tol, atol=tol * 10)
    assert y.is_contiguous(memory_format=CL) and ours[1].is_contiguous(memory_format=CL)


@pytest.mark.parametrize("grad_layout", [CL, torch.contiguous_format], ids=["channels_last", "contiguous"])
def test_a_mixed_call_falls_back_and_gives_the_same_values(grad_layout, device):
    """A channels_last input with a contiguous output gradient: the weight gradient needs both in
    NHWC, so it takes the NCHW route; the values agree either way."""
    x, w = operands(device=device)
    g = torch.randn(3, 4, 5, 7, dtype=x.dtype, device=device).contiguous(memory_format=grad_layout)
    args = conv_args(1, 0, 1)
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), *args)
    dw_nchw = ops.conv2d_weight_grad(x.contiguous(), g.contiguous(), list(w.shape), *args)
    torch.testing.assert_close(dw, dw_nchw, rtol=1e-12, atol=1e-12)
    dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
    assert dx.is_contiguous(memory_format=CL) == (grad_layout == CL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_low_precision_against_float64(dtype, device):
    """Half precision takes the NHWC route where the GEMMs run in it (a GPU, a CPU with the
    instructions), else the NCHW route in float32; the values are right either way."""
    x64, w64 = operands(n=2, c=32, h=7, w=9, cout=16, device=device)
    x, w = x64.to(dtype).contiguous(memory_format=CL), w64.to(dtype).contiguous(memory_format=CL)
    y = torch_convbp.conv2d(x, w)
    y64 = F.conv2d(x.double(), w.double())
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(y.double(), y64, rtol=tol, atol=tol)
    assert y.dtype == dtype and y.is_contiguous(memory_format=CL)


# (name, input [N, C, H, W], out channels, kernel, stride, padding, dilation, groups, whether the
# grad-input computes in NHWC): layers with narrow groups, whose forward the direct grouped kernel
# computes, and whose grad-input it computes where that is a stride-1 convolution
NARROW_GROUPS = [
    ("4 per group", (2, 16, 9, 10), 16, (3, 3), (1, 1), (1, 1), (1, 1), 4, True),
    ("24 output channels per group from 4", (2, 8, 6, 7), 48, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("asymmetric, dilated", (2, 6, 11, 12), 9, (3, 2), (1, 1), (1, 0), (2, 3), 3, True),
    ("8 per group, strided", (2, 16, 9, 10), 16, (3, 3), (2, 2), (1, 1), (1, 1), 2, False),
    ("padding past the reach", (1, 8, 5, 6), 8, (2, 2), (1, 1), (2, 2), (1, 1), 2, False),
    # the grad-weight's blocks: 2 vectors of output channels, and input channels in blocks of
    # 6 or 8 and the rest in 4, 2, 1 (csrc/cpu/grouped_weight_grad_cpu.cpp)
    ("16 per group, batch of one", (1, 32, 6, 7), 32, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("7 input and 12 output channels per group", (2, 14, 5, 6), 24, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("32 output channels per group from 13, strided", (1, 26, 4, 5), 64, (2, 2), (2, 1), (0, 1), (1, 1), 2, False),
]


@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups, dx_nhwc", NARROW_GROUPS, ids=[c[0] for c in NARROW_GROUPS])
def test_narrow_groups_in_nhwc(name, shape, cout, kernel, stride, padding, dilation, groups, dx_nhwc, device):
    """The three operators against F.conv2d and our shift-and-add reference, in float64: the
    forward in channels_last, the grad-input in channels_last where the direct kernel computes it
    (else through col2im in NCHW), the grad-weight by its direct kernel, and opcheck for each."""
    x, w = dense_operands(shape, cout, kernel, groups, device=device)
    b = torch.randn(cout, dtype=x.dtype, device=device)
    args = (stride, padding, dilation, groups)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    y = torch_convbp.conv2d(x, w, b, *args)
    g = torch.randn_like(y).contiguous(memory_format=CL)
    ours = (y, *torch.autograd.grad(y, (x, w, b), g))
    assert_matches_the_references(ours, x, w, b, g, *args)
    assert y.is_contiguous(memory_format=CL) and not y.is_contiguous()
    dx = ops.conv2d_input_grad(g, w.detach(), list(shape), *args)
    assert dx.is_contiguous(memory_format=CL if dx_nhwc else torch.contiguous_format)
    x, w = x.detach(), w.detach()
    opcheck(ops.conv2d.default, (x, w, None, *args))
    opcheck(ops.conv2d_input_grad.default, (g, w, list(shape), *args))
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), *args)
    direct = torch.empty_like(w)
    ops.grouped_weight_grad(x, g, *args, direct)
    assert torch.equal(dw, direct)  # the route: the direct kernel's bits
    opcheck(ops.conv2d_weight_grad.default, (x, g, list(w.shape), *args))
    opcheck(ops.grouped_conv2d.default, (x, w, *args, torch.empty_like(y)))
    opcheck(ops.grouped_weight_grad.default, (x, g, *args, torch.empty_like(w)))


def test_narrow_groups_have_gradients_of_any_order(device):
    x, w = dense_operands((1, 8, 5, 4), 8, (3, 3), 2, device=device)
    x.requires_grad_(), w.requires_grad_()
    fn = lambda x, w: torch_convbp.conv2d(x, w, None, 1, 1, 1, 2)
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_narrow_groups_in_low_precision(dtype, device):
    """Each sum in float32 (float16 and bfloat16 widened as they are read), rounded once."""
    x64, w64 = dense_operands((2, 64, 7, 9), 64, (3, 3), 8, device=device)
    x, w = x64.to(dtype).contiguous(memory_format=CL), w64.to(dtype)
    args = ((1, 1), (1, 1), (1, 1), 8)
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
    assert dw.dtype == dtype and dw.is_contiguous()
    torch.testing.assert_close(dw.double(), dw64, rtol=tol, atol=tol * 100)  # sums of 126 terms


def grouped_kernels_results(cases):
    """The direct grouped kernels' forward and grad-weight of each (x, w, dy, groups)."""
    results = []
    for x, w, dy, groups in cases:
        args = ((1, 1), (1, 1), (1, 1), groups)
        x, dy = x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL)
        results.append((ops.conv2d(x, w, None, *args), ops.conv2d_weight_grad(x, dy, list(w.shape), *args)))
    return results


def test_the_baseline_code_gives_the_avx2_bits(tmp_path):
    """The direct grouped kernels are compiled for AVX2 and for any x86-64 CPU, and pick one as
    they run; TORCH_CONVBP_NO_AVX2 makes a fresh process take the second (csrc/cpu/vector_ops.h).
    Both round each term once, in the same order, so they give the same bits."""
    cases = []
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for shape, cout, groups in (((2, 16, 9, 10), 16, 4), ((1, 14, 5, 6), 24, 2), ((1, 32, 4, 13), 64, 2)):
            x, w = dense_operands(shape, cout, (3, 3), groups, dtype=dtype)
            dy = torch.randn(shape[0], cout, *shape[2:], dtype=torch.float64).to(dtype)
            cases.append((x, w, dy, groups))
    torch.save(cases, tmp_path / "cases.pt")
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from test_nhwc import grouped_kernels_results; "
        "torch.save(grouped_kernels_results(torch.load(sys.argv[2] + '/cases.pt')), sys.argv[2] + '/results.pt')"
    )
    env = {**os.environ, "TORCH_CONVBP_NO_AVX2": "1"}
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


# (name, input [N, C, H, W], multiplier, kernel, stride, padding, dilation)
DEPTHWISE = [
    ("3x3", (2, 8, 9, 7), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("asymmetric, multiplier 2", (2, 3, 9, 8), 2, (3, 2), (2, 1), (0, 2), (2, 1)),
    ("5x5 stride 2", (3, 16, 12, 11), 1, (5, 5), (2, 2), (2, 2), (1, 1)),
    ("more positions than lanes", (1, 24, 5, 70), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("batch of one, 1x1 kernel", (1, 40, 4, 4), 1, (1, 1), (1, 1), (0, 0), (1, 1)),
    # output planes of 256 pixels or more: on the CPU, NCHW operands take the NCHW kernels (smaller
    # planes go to the NHWC ones through copies), so these compare the two sets of kernels
    ("large planes", (2, 8, 20, 20), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("large planes, multiplier 2, stride 2", (2, 6, 33, 34), 2, (3, 3), (2, 2), (1, 1), (1, 1)),
    # rows whose inner pixels share their terms (one list per residue of the stride), and rows
    # with no inner pixel at all
    ("wide rows, strided and dilated along them", (1, 18, 14, 40), 1, (3, 3), (1, 2), (1, 3), (1, 2)),
    ("stride 3, multiplier 2, wide rows", (1, 8, 24, 50), 2, (3, 4), (1, 3), (1, 2), (1, 1)),
    ("rows narrower than the kernel's reach", (2, 16, 60, 3), 1, (3, 5), (1, 1), (1, 3), (1, 1)),
]


def depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, device):
    n, c, h, w = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    weight = torch.randn(c * multiplier, 1, *kernel, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    out_shape = F.conv2d(x.double(), weight.double(), None, stride, padding, dilation, c).shape
    dy = torch.randn(*out_shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    return x, weight, dy


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE, ids=[d[0] for d in DEPTHWISE])
def test_depthwise_in_nhwc_gives_the_nchw_bits(name, shape, multiplier, kernel, stride, padding, dilation, dtype, device):
    """The NHWC depthwise kernels sum every entry in the NCHW kernels' order: the three operators
    give bitwise the same values in both formats, and channels_last results."""
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, device)
    args = (list(stride), list(padding), list(dilation), shape[1])
    nchw = (ops.conv2d(x, weight, None, *args), ops.conv2d_input_grad(dy, weight, list(shape), *args),
            ops.conv2d_weight_grad(x, dy, list(weight.shape), *args))
    x_cl, dy_cl = x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL)
    nhwc = (ops.conv2d(x_cl, weight, None, *args), ops.conv2d_input_grad(dy_cl, weight, list(shape), *args),
            ops.conv2d_weight_grad(x_cl, dy_cl, list(weight.shape), *args))
    for a, e in zip(nhwc, nchw):
        assert torch.equal(a, e)
    assert nhwc[0].is_contiguous(memory_format=CL) and nhwc[1].is_contiguous(memory_format=CL)
    if shape[2] * shape[3] > 1:  # not also contiguous
        assert not nhwc[0].is_contiguous() and not nhwc[1].is_contiguous()


@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE[:3], ids=[d[0] for d in DEPTHWISE[:3]])
def test_depthwise_values_and_gradients_of_any_order(name, shape, multiplier, kernel, stride, padding, dilation, device):
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, torch.float64, device)
    x, dy = x.contiguous(memory_format=CL).requires_grad_(), dy.contiguous(memory_format=CL)
    weight.requires_grad_()
    b = torch.randn(weight.shape[0], dtype=x.dtype, device=device, requires_grad=True)
    args = (stride, padding, dilation, shape[1])
    y = torch_convbp.conv2d(x, weight, b, *args)
    ours = (y, *torch.autograd.grad(y, (x, weight, b), dy))
    assert_formats(ours, assert_matches_the_references(ours, x, weight, b, dy, *args))
    small = (x[:1, :, :5, :6].detach().clone().requires_grad_(), weight)
    fn = lambda x, w: torch_convbp.conv2d(x, w, None, *args)
    assert torch.autograd.gradcheck(fn, small)
    assert torch.autograd.gradgradcheck(fn, small)


def test_the_depthwise_kernels_refuse_mixed_layouts(device):
    x, weight, dy = depthwise_operands((2, 4, 5, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1), torch.float32, device)
    out = torch.empty_like(dy)
    with pytest.raises(RuntimeError, match="both contiguous or both channels_last"):
        ops.depthwise_conv2d(x.contiguous(memory_format=CL), weight, [1, 1], [1, 1], [1, 1], out)
    with pytest.raises(RuntimeError, match="expected a contiguous weight"):
        ops.depthwise_conv2d(x, weight.transpose(2, 3), [1, 1], [1, 1], [1, 1], out)
