"""Native channels_last, first piece: a pointwise (1x1, stride 1, unpadded), ungrouped call whose
operands are channels_last is computed in NHWC, as GEMMs on the tensors' own memory, and returns
channels_last (csrc/pointwise_nhwc.h). Every other call computes in NCHW, as before."""
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


# (name, operands' keyword arguments, stride, padding, groups, whether the NHWC route takes it)
ROUTES = [
    ("pointwise channels_last", {}, 1, 0, 1, True),
    ("batch of one", dict(n=1), 1, 0, 1, True),
    ("one pixel per image", dict(h=1, w=1), 1, 0, 1, False),  # by its strides, not channels_last
    ("contiguous operands", dict(layout=torch.contiguous_format), 1, 0, 1, False),
    ("empty batch", dict(n=0), 1, 0, 1, False),
    ("grouped", {}, 1, 0, 2, False),
    ("strided", {}, 2, 0, 1, False),
    ("padded", {}, 1, 1, 1, False),
    ("3x3", dict(k=3), 1, 1, 1, False),
]


def conv_args(stride, padding, groups):
    return [stride, stride], [padding, padding], [1, 1], groups


@pytest.mark.parametrize("name, kwargs, stride, padding, groups, nhwc", ROUTES, ids=[r[0] for r in ROUTES])
def test_the_route_and_its_fake_kernels(name, kwargs, stride, padding, groups, nhwc, device):
    """The operators return channels_last exactly where the rule says, and opcheck (fake kernels
    included: their strides must match) passes for all three."""
    x, w = operands(groups=groups, device=device, **kwargs)
    args = conv_args(stride, padding, groups)
    layout = CL if nhwc else torch.contiguous_format
    in_layout = lambda t: t.is_contiguous(memory_format=layout) and (not nhwc or not t.is_contiguous())
    y = ops.conv2d(x, w, None, *args)
    g = torch.randn_like(y).contiguous(memory_format=kwargs.get("layout", CL))
    dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
    assert in_layout(y) and in_layout(dx)
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
    assert y.is_contiguous(memory_format=CL)
    g = torch.randn_like(y)
    ours = (y, *torch.autograd.grad(y, (x, w), g))
    y_ref = F.conv2d(x, w, b)
    ref = (y_ref, *torch.autograd.grad(y_ref, (x, w), g))
    y_own = shift_and_add_conv2d(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    own = (y_own, *torch.autograd.grad(y_own, (x, w), g))
    for a, r, o in zip(ours, ref, own):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a, o, rtol=1e-10, atol=1e-10)
    assert ours[1].is_contiguous(memory_format=CL)  # grad-input in the input's format


def test_gradients_of_any_order(device):
    x, w = operands(n=2, c=3, h=3, w=4, cout=2, device=device)
    x.requires_grad_(), w.requires_grad_()
    fn = lambda x, w: torch_convbp.conv2d(x, w)
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


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
