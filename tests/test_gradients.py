"""gradcheck and gradgradcheck: first and second derivatives in every input, on the case matrix."""
import contextlib

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import torch_convbp
from cases import CASES

GRAD_CASES = [c for c in CASES if c.batch > 0]


def conv_fn(case):
    return lambda x, w, *b: torch_convbp.conv2d(x, w, *b, **case.args())


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradcheck(case, device):
    tensors = [t for t in case.tensors(device=device, requires_grad=True) if t is not None]
    assert gradcheck(conv_fn(case), tensors)


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradgradcheck(case, device):
    tensors = [t for t in case.tensors(device=device, requires_grad=True) if t is not None]
    assert gradgradcheck(conv_fn(case), tensors)


@pytest.mark.parametrize("case", GRAD_CASES[:4], ids=str)
def test_gradient_operators_are_twice_differentiable(case, device):
    """The grad-input and grad-weight operators themselves, through gradgradcheck (third order
    of the convolution)."""
    stride, pads, dilation, groups = case.explicit()
    if pads[0] != pads[1] or pads[2] != pads[3]:
        pytest.skip("the operators take symmetric padding")
    args = (stride, (pads[0], pads[2]), dilation, groups)
    x, w, _ = case.tensors(device=device, requires_grad=True)
    ops = torch.ops.torch_convbp
    g = torch.randn_like(ops.conv2d(x, w, None, *args)).requires_grad_()
    assert gradgradcheck(lambda g, w: ops.conv2d_input_grad(g, w, list(x.shape), *args), (g, w))
    assert gradgradcheck(lambda x, g: ops.conv2d_weight_grad(x, g, list(w.shape), *args), (x, g))


def test_only_needed_gradients_are_computed():
    """With a frozen weight, backward calls the grad-input operator only; with a frozen input,
    the grad-weight operator only."""
    from torch.utils._python_dispatch import TorchDispatchMode

    operators = {"conv2d", "conv2d_input_grad", "conv2d_weight_grad"}

    class RecordOperators(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "torch_convbp" and func._opname in operators:
                self.calls.append(func._opname)
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    for frozen_weight, expected in ((True, ["conv2d_input_grad"]), (False, ["conv2d_weight_grad"])):
        x_, w_ = x.clone().requires_grad_(frozen_weight), w.clone().requires_grad_(not frozen_weight)
        y = torch_convbp.conv2d(x_, w_)
        with RecordOperators() as recorded:
            y.sum().backward()
        assert recorded.calls == expected


@pytest.mark.parametrize("no_graph", ["no_grad", "nothing_requires_grad"])
def test_without_a_graph_the_operators_record_no_node_and_compute_the_same(no_graph):
    """Where autograd has nothing to record, each operator runs straight below the Autograd key
    (no node: host time, benchmarks/NOTES.md section 32), with the same bits."""
    ops, args = torch.ops.torch_convbp, ([1, 2], [1, 0], [1, 1], 1)
    x, w, g = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 2), torch.randn(2, 4, 7, 3)
    x.requires_grad_(), g.requires_grad_()
    recorded = [ops.conv2d(x, w, None, *args), ops.conv2d_input_grad(g, w, list(x.shape), *args),
                ops.conv2d_weight_grad(x, g, list(w.shape), *args)]
    x, g = x.detach(), g.detach()
    with torch.no_grad() if no_graph == "no_grad" else contextlib.nullcontext():
        plain = [ops.conv2d(x, w, None, *args), ops.conv2d_input_grad(g, w, list(x.shape), *args),
                 ops.conv2d_weight_grad(x, g, list(w.shape), *args)]
    for with_node, without in zip(recorded, plain):
        assert with_node.grad_fn is not None and without.grad_fn is None and not without.requires_grad
        assert torch.equal(with_node.detach(), without)


def test_forward_mode_tangents_are_refused_by_name():
    """The operators' autograd is reverse mode only: a dual tensor is refused, not dropped."""
    import torch.autograd.forward_ad as fwAD

    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="jvp is not implemented"):
            torch_convbp.conv2d(dual, w)
