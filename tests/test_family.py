"""conv1d, conv_transpose1d and conv_transpose2d on the three operators: values and gradients in
float64 against torch.nn.functional and an independent reference, gradcheck and gradgradcheck,
opcheck of every operator call they make, torch.compile, and what they refuse."""
import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

import torch_convbp
from cases import loop_conv2d
from family_cases import FAMILY_CASES, FamilyCase, loop_conv_transpose2d
from test_values import TOL, relayout, same_memory_format, values_and_grads

NONEMPTY = [c for c in FAMILY_CASES if c.batch != 0]


@pytest.mark.parametrize("layout", ["contiguous", "non_contiguous", "channels_last"])
@pytest.mark.parametrize("case", FAMILY_CASES, ids=str)
def test_matches_torch_nn_functional(case, layout):
    if layout == "channels_last" and (len(case.size) == 1 or case.batch is None):
        pytest.skip("channels_last is a layout of 4-D tensors")
    x, w, b = case.tensors(requires_grad=True)
    x, w = relayout(x, layout), relayout(w, layout)
    ours = values_and_grads(case.ours, x, w, b)
    ref = values_and_grads(case.reference, x, w, b)
    assert ours[0].shape == ref[0].shape
    assert same_memory_format(ours[0], ref[0])
    for a, e in zip(ours, ref):
        torch.testing.assert_close(a, e, **TOL)


def as_2d(case, x, w):
    """A 1-D case's tensors and arguments with a unit height, for the 2-D references."""
    pair = lambda v, unit: (unit, v[0] if isinstance(v, tuple) else v) if len(case.size) == 1 else v
    args = [pair(case.stride, 1), pair(case.padding, 0), pair(case.output_padding, 0), pair(case.dilation, 1)]
    if len(case.size) == 1:
        x, w = x.unsqueeze(-2), w.unsqueeze(-2)
    return x, w, args


@pytest.mark.parametrize("case", [c for c in NONEMPTY if c.batch is not None and not isinstance(c.padding, str)], ids=str)
def test_matches_the_definition(case):
    """Against loops that are neither F nor our operators: the scatter that defines a transposed
    convolution, the sum that defines a convolution."""
    x, w, b = case.tensors()
    x2, w2, (stride, padding, output_padding, dilation) = as_2d(case, x, w)
    if case.transposed:
        expected = loop_conv_transpose2d(x2, w2, b, stride, padding, output_padding, dilation, case.groups)
    else:
        pad = (padding, padding) if isinstance(padding, int) else padding
        pair = lambda v: (v, v) if isinstance(v, int) else v
        expected = loop_conv2d(x2, w2, b, pair(stride), (pad[0], pad[0], pad[1], pad[1]), pair(dilation), case.groups)
    if len(case.size) == 1:
        expected = expected.squeeze(-2)
    torch.testing.assert_close(case.ours(x, w, b), expected, **TOL)


@pytest.mark.parametrize("case", NONEMPTY, ids=str)
def test_gradcheck_and_gradgradcheck(case):
    tensors = [t for t in case.tensors(requires_grad=True) if t is not None]
    fn = lambda x, w, *b: case.ours(x, w, b[0] if b else None)
    assert gradcheck(fn, tensors)
    assert gradgradcheck(fn, tensors)


OPERATORS = ("conv2d", "conv2d_input_grad", "conv2d_weight_grad", "conv3d", "conv3d_input_grad", "conv3d_weight_grad")


class OperatorCalls(TorchDispatchMode):
    """Records the convolution operators' calls (below autograd, with the arguments they got)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "torch_convbp" and func._opname in OPERATORS:
            self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", NONEMPTY, ids=str)
def test_opcheck_every_operator_call(case):
    """The new argument forms (unit heights, transposed sizes) reach the operators; each call
    the forward and backward make passes opcheck: schema, fake kernel, autograd registration."""
    x, w, b = case.tensors(requires_grad=True)
    with OperatorCalls() as recorder:
        y = case.ours(x, w, b)
        torch.autograd.grad(y, (x, w), torch.ones_like(y))
    assert {func._opname for func, _ in recorder.calls} >= {"conv2d_input_grad", "conv2d_weight_grad"}
    for func, args in recorder.calls:
        args = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
        opcheck(func, args)


@pytest.mark.parametrize("function", ["conv1d", "conv_transpose1d", "conv_transpose2d"])
def test_torch_compile_fullgraph(function):
    case = next(c for c in NONEMPTY if c.function == function and c.groups > 1)
    x, w, b = case.tensors(requires_grad=True)
    compiled = torch.compile(lambda x, w, b: case.ours(x, w, b), fullgraph=True, backend="aot_eager")
    y, y_eager = compiled(x, w, b), case.ours(x, w, b)
    torch.testing.assert_close(y, y_eager, **TOL)
    g = torch.randn_like(y)
    for a, e in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(y_eager, (x, w, b), g)):
        torch.testing.assert_close(a, e, **TOL)


x4, wt = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3)  # transposed weight [C_in, C_out/groups, kh, kw]
x3, w3 = torch.randn(2, 4, 9), torch.randn(6, 2, 3)


@pytest.mark.parametrize(
    "call, f_refuses_too, error, match",
    [
        ("conv_transpose2d(x4, wt, stride=2, output_padding=2)", True, RuntimeError, "output_padding must be smaller than either stride or dilation"),
        ("conv_transpose2d(x4, wt, output_padding=-1)", True, RuntimeError, "output_padding must be non-negative"),
        ("conv_transpose2d(x4, wt, padding=-1)", True, RuntimeError, "padding and output_padding must be non-negative"),
        ("conv_transpose2d(x4, wt, stride=0)", True, RuntimeError, "stride and dilation must be positive"),
        ("conv_transpose2d(x4, wt, dilation=(1, 0))", True, RuntimeError, "stride and dilation must be positive"),
        ("conv_transpose2d(x4, wt, groups=3)", True, RuntimeError, "must be divisible by groups"),
        ("conv_transpose2d(x4, wt, groups=0)", True, RuntimeError, "groups must be positive"),
        ("conv_transpose2d(x4[:, :3], wt)", True, RuntimeError, "to have 4 channels .* but got 3 channels"),
        ("conv_transpose2d(x4, wt, padding=4)", True, RuntimeError, r"output size per channel \(-1 x -1\) must be positive"),
        ("conv_transpose2d(x4, wt, torch.randn(4))", True, RuntimeError, r"expected bias of size \[3\]"),
        ("conv_transpose2d(x4, wt, torch.randn(3).double())", True, RuntimeError, "must have the same dtype and device"),
        ("conv_transpose2d(x4, wt.double())", True, RuntimeError, "must have the same dtype"),
        ("conv_transpose2d(x4[None], wt)", True, RuntimeError, r"expected 3D \(unbatched\) or 4D \(batched\) input"),
        ("conv_transpose2d(x4, wt[0])", True, RuntimeError, "expected a 4-D weight"),
        ("conv_transpose2d(x4, wt, output_padding=(0, 0, 0))", True, ValueError, "output_padding to be a single integer value or a list of 2"),
        ("conv_transpose2d(x4, wt, padding='same')", False, ValueError, "padding to be a single integer value"),
        ("conv_transpose2d(x4, wt, groups=1.0)", False, ValueError, "groups to be an integer"),
        ("conv_transpose1d(x4, wt)", True, RuntimeError, r"expected 2D \(unbatched\) or 3D \(batched\) input"),
        ("conv_transpose1d(x3, w3.transpose(0, 1), stride=2, output_padding=2)", True, RuntimeError, "output_padding must be smaller"),
        ("conv1d(x4, w3)", True, RuntimeError, r"expected 2D \(unbatched\) or 3D \(batched\) input"),
        ("conv1d(x3, wt)", True, RuntimeError, "expected a 3-D weight"),
        ("conv1d(x3, w3, groups=3)", True, RuntimeError, "to have 6 channels, but got 4"),
        ("conv1d(x3, w3, stride=(1, 1))", True, ValueError, "stride to be a single integer value or a list of 1"),
        ("conv1d(x3, w3, groups=2, stride=2, padding='same')", True, ValueError, "'same' is not supported for strided"),
        ("conv1d(x3, w3, groups=2, padding='full')", False, ValueError, "invalid padding string 'full'"),
        ("conv1d(x3, w3, groups=2, dilation=5)", True, RuntimeError, "smaller than the dilated kernel"),
    ],
    ids=lambda v: v if isinstance(v, str) and "(" in v else "",
)
def test_refused_with_a_clear_message(call, f_refuses_too, error, match):
    scope = dict(torch=torch, x4=x4, wt=wt, x3=x3, w3=w3)
    with pytest.raises(error, match=match):
        eval("torch_convbp." + call, dict(scope, torch_convbp=torch_convbp))
    if f_refuses_too:  # torch.nn.functional refuses it too (in its own words, or with a TypeError)
        with pytest.raises(Exception):
            eval("F." + call, dict(scope, F=F))


def test_an_output_padding_at_or_past_the_stride_is_allowed_below_the_dilation():
    """F allows output_padding >= stride where it is below the dilation; no convolution of that
    padding maps the output back onto the input's size, and the extra rows are the ones no kernel
    tap reaches. (Covered in the matrix too: output-padding-below-dilation, -past-padding.)"""
    x = torch.randn(1, 1, 3, 3, dtype=torch.float64)
    w = torch.randn(1, 1, 3, 3, dtype=torch.float64)
    for padding in (0, 1, 2, 3):
        args = dict(stride=1, padding=padding, output_padding=1, dilation=2)
        torch.testing.assert_close(torch_convbp.conv_transpose2d(x, w, **args), F.conv_transpose2d(x, w, **args), **TOL)


def test_conv_transpose2d_is_the_input_gradient_of_conv2d():
    """The docs' claim, as an identity: <conv2d(x, W), g> = <x, conv_transpose2d(g, W)>."""
    case = FamilyCase("adjoint", "conv_transpose2d", 2, 6, (4, 5), 4, (3, 2), stride=(2, 1), padding=1, groups=2)
    g, w, _ = case.tensors()
    x = torch.randn(2, 4, 7, 4, dtype=torch.float64)  # conv2d(x, w) has g's size with these arguments
    y = torch_convbp.conv2d(x, w, None, stride=(2, 1), padding=1, groups=2)
    assert y.shape == g.shape
    transposed = torch_convbp.conv_transpose2d(g, w, None, stride=(2, 1), padding=1, groups=2, output_padding=0)
    torch.testing.assert_close((y * g).sum(), (x * transposed).sum(), **TOL)
