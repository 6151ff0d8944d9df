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
    the grad-weight operator only; and torch.autograd.grad asked for some of the operands computes
    theirs only, as F.conv2d's node does."""
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
    x_, w_, b = x.clone().requires_grad_(), w.clone().requires_grad_(), torch.zeros(4, requires_grad=True)
    loss = torch_convbp.conv2d(x_, w_, b).sum()
    for inputs, expected in (((x_,), ["conv2d_input_grad"]), ((w_,), ["conv2d_weight_grad"]), ((b,), []),
                             ((x_, w_), ["conv2d_input_grad", "conv2d_weight_grad"])):
        with RecordOperators() as recorded:
            grads = torch.autograd.grad(loss, inputs, retain_graph=True)
        assert recorded.calls == expected
        assert all(g.shape == i.shape for g, i in zip(grads, inputs))


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


def test_the_operators_own_nodes_refuse_forward_mode_tangents_by_name():
    """The operators' C++ autograd is reverse mode only: a dual tensor passed to torch.ops is
    refused, not dropped (torch_convbp.conv2d and the rest take the Python Functions under a dual
    level instead: tests/test_func_transforms.py)."""
    import torch.autograd.forward_ad as fwAD

    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="forward-mode AD is not implemented on the operator.*torch_convbp.conv2d"):
            torch.ops.torch_convbp.conv2d(dual, w, None, [1, 1], [0, 0], [1, 1], 1)


# ---- The nodes behave as every autograd node does ------------------------------------------------

def _recorded_calls():
    """(name, a function of fresh leaves returning (result, leaves)) for each operator with a node."""
    ops = torch.ops.torch_convbp
    args2, args3 = ([1, 2], [1, 0], [1, 1], 1), ([1, 1, 2], [0, 1, 0], [1, 1, 1], 1)

    def leaves(*shapes):
        return [torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in shapes]

    def conv2d():
        x, w, b = leaves((2, 3, 7, 6), (4, 3, 3, 2), (4,))
        return torch_convbp.conv2d(x, w, b, stride=(1, 2), padding=(1, 0)), (x, w, b)

    def conv3d():
        x, w, b = leaves((1, 2, 4, 5, 6), (3, 2, 2, 3, 2), (3,))
        return torch_convbp.conv3d(x, w, b, stride=(1, 1, 2), padding=(0, 1, 0)), (x, w, b)

    def conv2d_input_grad():
        g, w = leaves((2, 4, 7, 3), (4, 3, 3, 2))
        return ops.conv2d_input_grad(g, w, [2, 3, 7, 6], *args2), (g, w)

    def conv2d_weight_grad():
        x, g = leaves((2, 3, 7, 6), (2, 4, 7, 3))
        return ops.conv2d_weight_grad(x, g, [4, 3, 3, 2], *args2), (x, g)

    def conv3d_input_grad():
        g, w = leaves((1, 3, 3, 5, 3), (3, 2, 2, 3, 2))
        return ops.conv3d_input_grad(g, w, [1, 2, 4, 5, 6], *args3), (g, w)

    def conv3d_weight_grad():
        x, g = leaves((1, 2, 4, 5, 6), (1, 3, 3, 5, 3))
        return ops.conv3d_weight_grad(x, g, [3, 2, 2, 3, 2], *args3), (x, g)

    return {
        "Conv2dBackward": conv2d, "Conv3dBackward": conv3d,
        "Conv2dInputGradBackward": conv2d_input_grad, "Conv2dWeightGradBackward": conv2d_weight_grad,
        "Conv3dInputGradBackward": conv3d_input_grad, "Conv3dWeightGradBackward": conv3d_weight_grad,
    }


RECORDED = _recorded_calls()


@pytest.mark.parametrize("node", RECORDED)
def test_each_node_is_named_and_has_an_edge_per_tensor_operand(node):
    result, leaves = RECORDED[node]()
    assert result.grad_fn.name() == f"torch_convbp::{node}"
    edges = [fn for fn, _ in result.grad_fn.next_functions]
    assert len(edges) == len(leaves) and all(type(fn).__name__ == "AccumulateGrad" for fn in edges)
    assert [fn.variable for fn in edges] == list(leaves)


@pytest.mark.parametrize("node", RECORDED)
def test_a_second_backward_needs_retain_graph(node):
    """Without retain_graph the node's saved tensors are released and a second backward is refused;
    with it, the second backward adds the same gradients again."""
    result, leaves = RECORDED[node]()
    result.sum().backward(retain_graph=True)
    first = [t.grad.clone() for t in leaves]
    result.sum().backward()
    assert all(torch.equal(t.grad, 2 * g) for t, g in zip(leaves, first))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        result.sum().backward()


def test_an_operand_changed_in_place_after_the_forward_is_refused():
    """The node's saved tensors are checked against their version counters, as ATen's are."""
    x, w = torch.randn(1, 2, 5, 5, requires_grad=True), torch.randn(3, 2, 3, 3, requires_grad=True)
    h = x * 2
    y = torch_convbp.conv2d(h, w)
    h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_saved_tensor_hooks_see_what_the_node_saves():
    """torch.autograd.graph.saved_tensors_hooks (activation offloading, checkpointing) packs the
    node's two saved tensors, the input and the weight, and unpacks them in the backward."""
    x, w = torch.randn(2, 2, 5, 5, requires_grad=True), torch.randn(3, 2, 3, 3, requires_grad=True)
    packed, unpacked = [], []

    def pack(t):
        packed.append(t)
        return t.clone()

    def unpack(t):
        unpacked.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = torch_convbp.conv2d(x, w)
    y.sum().backward()
    assert len(packed) == 2 and packed[0] is x and packed[1] is w and len(unpacked) == 2
    expected = torch.autograd.grad(torch.nn.functional.conv2d(x, w).sum(), (x, w))
    torch.testing.assert_close((x.grad, w.grad), expected)


def test_an_undefined_incoming_gradient_gives_none_as_for_f_conv2d():
    """A node whose result gets no gradient (a zero one, undefined) computes none, as ATen's
    convolution node does: the leaves' .grad stay None, not zeros."""

    class DropsItsFirstInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, dropped, kept):
            return kept.clone()

        @staticmethod
        def backward(ctx, grad):
            return None, grad

    for conv in (torch_convbp.conv2d, torch.nn.functional.conv2d):
        x, w = torch.randn(1, 2, 5, 5, requires_grad=True), torch.randn(3, 2, 3, 3, requires_grad=True)
        kept = torch.randn(3, requires_grad=True)
        DropsItsFirstInput.apply(conv(x, w), kept).sum().backward()
        assert x.grad is None and w.grad is None and torch.equal(kept.grad, torch.ones(3)), conv


def test_torch_func_transforms_that_differentiate_refuse_the_operators_own_nodes():
    """torch.func's grad and vjp see through Python autograd Functions only: the operators' C++
    node, called through torch.ops, is refused with torch's message, never differentiated wrongly
    (torch_convbp.conv2d and the rest take the Python Functions there:
    tests/test_func_transforms.py)."""
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda x: torch.ops.torch_convbp.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1).sum())(x)
