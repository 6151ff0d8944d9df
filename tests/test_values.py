"""Values and first gradients in float64: against F.conv2d and two references of our own."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from cases import CASES, loop_conv2d, shift_and_add_conv2d

TOL = dict(rtol=1e-10, atol=1e-10)
LAYOUTS = ["contiguous", "channels_last", "non_contiguous"]


def relayout(t, layout):
    """The same values in another memory layout."""
    if layout == "channels_last":  # channels_last_3d for volumes
        memory_format = torch.channels_last_3d if t.dim() == 5 else torch.channels_last
        return t.detach().contiguous(memory_format=memory_format).requires_grad_(t.requires_grad)
    if layout == "non_contiguous":  # every other element of a wider tensor, then flipped back
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t.detach()
        return wide[..., ::2].requires_grad_(t.requires_grad)
    return t


def same_memory_format(a, b):
    """Dense in the same memory formats (strides of size-1 dimensions do not matter)."""
    if a.dim() != b.dim():
        return False
    formats = [torch.contiguous_format] + {4: [torch.channels_last], 5: [torch.channels_last_3d]}.get(a.dim(), [])
    return all(a.is_contiguous(memory_format=f) == b.is_contiguous(memory_format=f) for f in formats)


def values_and_grads(fn, x, w, b, grad_seed=1):
    y = fn(x, w, b)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=y.dtype).to(y.device)
    inputs = [t for t in (x, w, b) if t is not None]
    return (y, *torch.autograd.grad(y, inputs, g)) if y.numel() else (y,)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_f_conv2d(case, layout, device):
    x, w, b = case.tensors(device=device, requires_grad=True)
    x, w = relayout(x, layout), relayout(w, layout)
    ours = values_and_grads(lambda *t: torch_convbp.conv2d(*t, **case.args()), x, w, b)
    ref = values_and_grads(lambda *t: F.conv2d(*t, **case.args()), x, w, b)
    assert ours[0].shape == ref[0].shape
    assert same_memory_format(ours[0], ref[0])  # channels_last in, channels_last out
    for a, e in zip(ours, ref):
        torch.testing.assert_close(a, e, **TOL)


@pytest.mark.parametrize("input_layout, weight_layout", [("channels_last", "contiguous"), ("contiguous", "channels_last")])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_output_memory_format_follows_f_conv2d(input_layout, weight_layout, dtype, device):
    """The output is channels_last when the input or the weight is, as F.conv2d's is; on CUDA F
    keeps float64 NCHW (cuDNN runs no channels_last float64), and so do we (seen on an H100)."""
    x = relayout(torch.randn(2, 6, 7, 5, dtype=dtype, device=device), input_layout)
    w = relayout(torch.randn(4, 3, 3, 2, dtype=dtype, device=device), weight_layout)
    ours, ref = torch_convbp.conv2d(x, w, groups=2), F.conv2d(x, w, groups=2)
    if device == "cpu":
        assert ours.is_contiguous(memory_format=torch.channels_last) and not ours.is_contiguous()
    assert same_memory_format(ours, ref)
    torch.testing.assert_close(ours, ref, rtol=1e-5 if dtype == torch.float32 else 1e-10, atol=1e-5 if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_shift_and_add_reference(case, device):
    x, w, b = case.tensors(device=device, requires_grad=True)
    ours = values_and_grads(lambda *t: torch_convbp.conv2d(*t, **case.args()), x, w, b)
    ref = values_and_grads(lambda *t: shift_and_add_conv2d(*t, *case.explicit()), x, w, b)
    for a, e in zip(ours, ref):
        torch.testing.assert_close(a, e, **TOL)


@pytest.mark.parametrize("case", [c for c in CASES if c.batch * c.out_channels <= 12], ids=str)
def test_matches_loop_reference(case):
    x, w, b = case.tensors()
    torch.testing.assert_close(torch_convbp.conv2d(x, w, b, **case.args()), loop_conv2d(x, w, b, *case.explicit()), **TOL)


@pytest.mark.parametrize("case", [c for c in CASES if c.batch > 0][:6], ids=str)
def test_unbatched_input(case, device):
    x, w, b = case.tensors(device=device, requires_grad=True)
    x = x[0].detach().requires_grad_()
    ours = values_and_grads(lambda *t: torch_convbp.conv2d(*t, **case.args()), x, w, b)
    ref = values_and_grads(lambda *t: F.conv2d(*t, **case.args()), x, w, b)
    assert ours[0].dim() == 3
    for a, e in zip(ours, ref):
        torch.testing.assert_close(a, e, **TOL)


def test_empty_batch_gives_empty_output_and_zero_weight_grad(device):
    x = torch.randn(0, 3, 5, 5, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, device=device, requires_grad=True)
    y = torch_convbp.conv2d(x, w, padding=1)
    assert y.shape == (0, 4, 5, 5)
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    assert gx.shape == x.shape and torch.count_nonzero(gw) == 0


@pytest.mark.parametrize("form", [2, (2, 2), [2], [2, 2], torch.Size([2, 2])])
def test_every_argument_form(form):
    x = torch.randn(1, 2, 9, 9, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    ours = torch_convbp.conv2d(x, w, None, form, form, form)
    torch.testing.assert_close(ours, F.conv2d(x, w, None, form, form, form), **TOL)
