"""Route depthwise: one input channel per group (any channel multiplier) computes with the direct
depthwise kernels, in NCHW or, for channels_last operands, in NHWC (csrc/cpu/depthwise_nhwc_cpu.cpp,
cuda/depthwise_thread.h). Both layouts sum every entry in the same order, so they give bitwise
the same results, on both devices. On the CPU output planes under 256 pixels compute in NHWC for
NCHW operands too, through layout copies."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from route_cases import CL, assert_formats, assert_matches_the_references

ops = torch.ops.torch_convbp

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
    give bitwise the same values in both formats, and channels_last results. On the CPU, NCHW
    calls with output planes of 256 pixels or more take the NCHW kernels (smaller ones the NHWC
    kernels, through copies), so those cases compare the two sets of kernels."""
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, device)
    args = (list(stride), list(padding), list(dilation), shape[1])
    small_planes = dy.shape[2] * dy.shape[3] < 256 and device == "cpu"  # NHWC, through copies
    layouts = {r.layout for r in torch_convbp.explain(x, weight, *args, grad_output=dy) if r.route == "depthwise"}
    assert layouts == {"nhwc" if small_planes else "nchw"}
    nchw = (ops.conv2d(x, weight, None, *args), ops.conv2d_input_grad(dy, weight, list(shape), *args),
            ops.conv2d_weight_grad(x, dy, list(weight.shape), *args))
    x_cl, dy_cl = x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL)
    nhwc = (ops.conv2d(x_cl, weight, None, *args), ops.conv2d_input_grad(dy_cl, weight, list(shape), *args),
            ops.conv2d_weight_grad(x_cl, dy_cl, list(weight.shape), *args))
    assert {r.layout for r in torch_convbp.explain(x_cl, weight, *args, grad_output=dy_cl)} == {"nhwc"}
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
