"""Route columns in NHWC: layers fed channels_last whose groups have 16 or more output channels
(and, with several groups, 16 or more input channels) compute with the NHWC column matrix
[G, P, kh*kw*C/G] (im2col_nhwc, col2im_nhwc) and the same GEMMs as in NCHW, on transposed views
(csrc/matrices.h): the forward and weight grad through im2col, the stride-1 input grad as a
forward convolution (transposed_columns), the strided one through col2im_nhwc."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from route_cases import (CL, assert_formats, assert_matches_the_references, dense_operands, has_bfloat16_microkernel,
                         microkernel_outruns_mkl)

# (name, input [N, C, H, W], out channels, kernel, stride, padding, dilation, groups): layers the
# NHWC column matrix serves (16 or more output channels per group; with several groups, 16 or
# more input channels too, and more than 32 output channels per group, or the direct grouped
# kernels would take them), each with every operator's route: the stride-1 grad-input as a
# convolution (whose groups must be as wide), the strided one, and that past the kernel's reach,
# through col2im_nhwc (with 16 or more input channels per group, else col2im in NCHW)
DENSE = [
    ("3x3 padded", (2, 16, 7, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("asymmetric everything", (2, 32, 9, 8), 80, (3, 2), (2, 1), (1, 0), (1, 2), 2),
    ("grouped dilated", (2, 99, 6, 6), 99, (3, 3), (1, 1), (2, 2), (2, 2), 3),
    ("padding past the reach", (1, 32, 5, 6), 96, (2, 3), (1, 1), (3, 3), (1, 1), 2),
    ("strided pointwise", (2, 16, 6, 6), 24, (1, 1), (2, 2), (0, 0), (1, 1), 1),
    ("grouped pointwise", (2, 132, 5, 7), 132, (1, 1), (1, 1), (0, 0), (1, 1), 4),
    ("stride larger than the kernel", (2, 16, 10, 9), 16, (2, 2), (3, 3), (0, 0), (1, 1), 1),
    # one group and narrow inputs: a kernel row's taps copied as one run, or tap by tap where
    # the width is dilated
    ("RGB stem", (2, 3, 9, 10), 16, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    ("5x5, 6 input channels", (2, 6, 12, 11), 16, (5, 5), (1, 1), (2, 1), (1, 1), 1),
    ("5 input channels, dilated along the width", (2, 5, 8, 9), 16, (3, 3), (1, 2), (1, 2), (1, 2), 1),
]


def input_grad_route(kernel, stride, padding, dilation, group_inputs):
    """transposed_columns where the grad-input is a stride-1 convolution, else columns (col2im),
    in NHWC only with 16 or more input channels per group (col2im gathers runs that long)."""
    reach = [d * (k - 1) for d, k in zip(dilation, kernel)]
    as_convolution = list(stride) == [1, 1] and all(p <= r for p, r in zip(padding, reach))
    if as_convolution:
        return "transposed_columns/nhwc"
    return "columns/nhwc" if group_inputs >= 16 else "columns/nchw"


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
    # The routes of this call: its output gradient is channels_last, whatever format F.conv2d
    # gives the output (NCHW on CUDA in float64).
    routes = [f"{r.route}/{r.layout}" for r in torch_convbp.explain(x, w, *args, grad_output=g)]
    assert routes == ["columns/nhwc", input_grad_route(kernel, stride, padding, dilation, shape[1] // groups), "columns/nhwc"]
    assert_formats(ours, assert_matches_the_references(ours, x, w, b, g, *args))
    assert ours[2].is_contiguous(memory_format=CL)  # the weight gradient, in the input's format


@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups", DENSE[::4], ids=[d[0] for d in DENSE[::4]])
def test_dense_layers_in_nhwc_have_gradients_of_any_order(name, shape, cout, kernel, stride, padding, dilation, groups, device):
    x, w = dense_operands((1, shape[1], 5, 4), 16, kernel, groups, device=device)
    assert torch_convbp.explain(x, w, stride, padding, dilation, groups)["forward"].layout == "nhwc"
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



# (name, operator, input [N, C, H, W], out channels, kernel, stride, whether it computes in NHWC
# fed NCHW in bfloat16 where the micro-kernel computes bfloat16; more than one tap and 16 or more
# output channels per group, and for the weight gradient 16 or more input channels per group and
# output planes under 1024 pixels (NOTES section 67), for a strided input gradient 32 or more
# input channels per group (section 68)). Stride-1 weight gradients with rows of 14 or more take
# the implicit route instead (tests/test_route_implicit_weight_grad.py), and so do strided input
# gradients of more than one tap where the micro-kernel outruns MKL (tests/test_route_implicit.py).
BFLOAT16_FED_NCHW = [
    ("3x3, 7x7", "weight_grad", (2, 32, 7, 7), 32, 3, 1, True),
    ("3x3 strided, 28x28 out of 56x56", "weight_grad", (1, 16, 56, 56), 32, 3, 2, True),
    ("3x3 strided, 32x32: 1024 pixels", "weight_grad", (1, 16, 64, 64), 16, 3, 2, False),
    ("8 input channels", "weight_grad", (2, 8, 14, 14), 32, 3, 1, False),
    ("strided 1x1", "weight_grad", (2, 32, 14, 14), 32, 1, 2, False),
    ("3x3/2, 32 channels", "input_grad", (2, 32, 14, 14), 16, 3, 2, True),
    ("5x5/2", "input_grad", (1, 48, 12, 12), 32, 5, 2, True),
    ("3x3/2, 16 input channels", "input_grad", (2, 16, 14, 14), 32, 3, 2, False),
    ("strided 1x1", "input_grad", (2, 32, 14, 14), 32, 1, 2, False),
]


@pytest.mark.parametrize("name, operator, shape, cout, kernel, stride, in_nhwc", BFLOAT16_FED_NCHW,
                         ids=[f"{c[1]}: {c[0]}" for c in BFLOAT16_FED_NCHW])
def test_bfloat16_column_route_fed_nchw_takes_nhwc_where_it_pays(name, operator, shape, cout, kernel, stride, in_nhwc):
    """The route's layout by the rule, the value against float64 either way, and the result NCHW
    like the operands."""
    in_nhwc = in_nhwc and has_bfloat16_microkernel()
    x64, w64 = dense_operands(shape, cout, (kernel, kernel), 1)
    x64, padding = x64.contiguous(), kernel // 2
    dy64 = torch.randn(F.conv2d(x64, w64, None, stride, padding).shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x, w, dy = x64.to(torch.bfloat16), w64.to(torch.bfloat16), dy64.to(torch.bfloat16)
    route = torch_convbp.explain(x, w, stride, padding, grad_output=dy)[operator]
    if operator == "input_grad" and kernel > 1 and has_bfloat16_microkernel() and microkernel_outruns_mkl():
        # there the implicit route scatters dY's GEMMs instead (tests/test_route_implicit.py)
        assert route.route == "implicit_nhwc" and route.layout == "nhwc"
    else:
        assert route.route == "columns" and (route.layout == "nhwc") == in_nhwc
    args = ([stride] * 2, [padding] * 2, [1, 1], 1)
    x_ref, w_ref = x.double().requires_grad_(), w.double().requires_grad_()
    F.conv2d(x_ref, w_ref, None, stride, padding).backward(dy.double())
    if operator == "weight_grad":
        op, op_args, ref = torch.ops.torch_convbp.conv2d_weight_grad, (x, dy, list(w.shape), *args), w_ref.grad
    else:
        op, op_args, ref = torch.ops.torch_convbp.conv2d_input_grad, (dy, w, list(x.shape), *args), x_ref.grad
    ours = op(*op_args)
    assert ours.dtype == torch.bfloat16 and ours.is_contiguous()
    opcheck(op.default, op_args)  # the fake kernel gives the same format
    torch.testing.assert_close(ours.double(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
