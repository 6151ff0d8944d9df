"""Route pointwise_nhwc: a 1x1, stride-1, unpadded, ungrouped convolution of channels_last
operands is three GEMMs on the tensors' own memory (csrc/pointwise_nhwc.cpp), with no layout copy
and channels_last results."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from cases import shift_and_add_conv2d
from route_cases import CL, assert_formats, operands


def test_the_route(device):
    x, w = operands(n=4, c=8, h=6, w=3, cout=5, device=device)
    # A channels_last output gradient, as the backward of this call gets on the CPU (on CUDA in
    # float64 the output, and so explain's default gradient, is NCHW, as F.conv2d's).
    g = torch.empty(4, 5, 6, 3, dtype=x.dtype, device=device, memory_format=CL)
    assert {r.route for r in torch_convbp.explain(x, w, grad_output=g)} == {"pointwise_nhwc"}


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


