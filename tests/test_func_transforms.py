"""torch.func's transforms and forward-mode AD: grad, vjp, jacrev, jacfwd, jvp, hessian, vmap and
dual tensors give what they give on torch.nn.functional, for the whole convolution family."""
import copy
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import torch_convbp
from torch_convbp import _func

# (function, input shape, weight shape, keyword arguments): batched and unbatched, strided,
# padded unevenly by 'same', dilated, grouped, transposed with output_padding, 1-D to 3-D.
CASES = [
    ("conv2d", (2, 4, 7, 6), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)),
    ("conv2d", (3, 5, 5), (4, 3, 2, 3), dict(padding="same")),
    ("conv1d", (2, 3, 9), (4, 3, 3), dict(stride=2, padding=1)),
    ("conv3d", (1, 2, 4, 5, 4), (3, 2, 2, 3, 2), dict(stride=(1, 2, 1), padding=(1, 0, 1))),
    ("conv_transpose2d", (2, 4, 4, 3), (4, 3, 3, 2), dict(stride=2, padding=1, output_padding=1, groups=2)),
    ("conv_transpose1d", (3, 6), (3, 2, 3), dict(stride=3, dilation=2)),
    ("conv_transpose3d", (1, 2, 3, 2, 3), (2, 2, 2, 2, 2), dict(stride=(2, 1, 2))),
]


def _operands(case, dtype=torch.float64, seed=0, device="cpu"):
    function, input_shape, weight_shape, kwargs = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*input_shape, generator=g, dtype=dtype)
    w = torch.randn(*weight_shape, generator=g, dtype=dtype)
    channels = weight_shape[1] * kwargs.get("groups", 1) if function.startswith("conv_transpose") else weight_shape[0]
    b = torch.randn(channels, generator=g, dtype=dtype)
    return x.to(device), w.to(device), b.to(device)


def _both(case):
    """(ours, F's) as functions of (x, w, b)."""
    function, _, _, kwargs = case
    ours, reference = getattr(torch_convbp, function), getattr(F, function)
    return (lambda x, w, b: ours(x, w, b, **kwargs)), (lambda x, w, b: reference(x, w, b, **kwargs))


def _loss(conv):
    return lambda x, w, b: conv(x, w, b).sin().sum()


def _assert_close(got, expected):
    for g, e in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_grad_and_vjp_match_torch_nn_functional(case, device):
    ours, reference = _both(case)
    operands = _operands(case, device=device)
    _assert_close(grad(_loss(ours), argnums=(0, 1, 2))(*operands), grad(_loss(reference), argnums=(0, 1, 2))(*operands))
    out, pullback = vjp(ours, *operands)
    expected_out, expected_pullback = vjp(reference, *operands)
    cotangent = torch.randn_like(out)
    _assert_close((out, pullback(cotangent)), (expected_out, expected_pullback(cotangent)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_jacobians_forward_and_reverse_match_torch_nn_functional(case):
    ours, reference = _both(case)
    operands = _operands(case)
    for jacobian in (jacrev, jacfwd):
        _assert_close(jacobian(ours, argnums=(0, 1, 2))(*operands), jacobian(reference, argnums=(0, 1, 2))(*operands))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_jvp_and_dual_tensors_match_torch_nn_functional(case):
    ours, reference = _both(case)
    operands = _operands(case)
    tangents = _operands(case, seed=1)
    _assert_close(jvp(ours, operands, tangents), jvp(reference, operands, tangents))
    # Tangents on some operands only: the others' are none, not zeros.
    for carried in range(3):
        with fwAD.dual_level():
            duals = [fwAD.make_dual(o, t) if i == carried else o for i, (o, t) in enumerate(zip(operands, tangents))]
            got = fwAD.unpack_dual(ours(*duals))
            expected = fwAD.unpack_dual(reference(*duals))
        _assert_close((got.primal, got.tangent), (expected.primal, expected.tangent))


@pytest.mark.parametrize("case", CASES[:5:2], ids=lambda c: c[0])
def test_hessian_matches_torch_nn_functional(case):
    """Forward over reverse: the jvp of the backward's operators."""
    ours, reference = _both(case)
    x, w, b = _operands(case)
    _assert_close(hessian(_loss(ours), argnums=1)(x, w, b), hessian(_loss(reference), argnums=1)(x, w, b))


# in_dims of (x, w, b): each operand mapped or shared, the mapped dimension not always the first.
IN_DIMS = [(0, None, None), (None, 0, None), (None, None, 0), (1, 0, None), (0, 2, 0)]


@pytest.mark.parametrize("in_dims", IN_DIMS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_vmap_folds_the_mapping_into_the_operators(case, in_dims, device):
    """Mapped operands give F's results, computed by the operators on a larger batch or more groups
    (no per-mapping loop: torch's fallback would warn)."""
    ours, reference = _both(case)
    mapped = [torch.stack([o * (1 + k) for k in range(3)], dim=d) if d is not None else o
              for o, d in zip(_operands(case, device=device), in_dims)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = vmap(ours, in_dims=in_dims)(*mapped)
    _assert_close(got, vmap(reference, in_dims=in_dims)(*mapped))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_per_sample_gradients_match_torch_nn_functional(case, device):
    """vmap(grad(...)) over the batch: each example's weight and bias gradient, the weight gradient
    computed as one of B groups."""
    function, input_shape, _, _ = case
    if len(input_shape) == len(_operands(case)[1].shape) - 1:
        pytest.skip("an unbatched case")
    ours, reference = _both(case)
    x, w, b = _operands(case, device=device)

    def per_sample(conv):
        def loss(w, b, example):
            return conv(example.unsqueeze(0), w, b).sin().sum()
        return vmap(grad(loss, argnums=(0, 1)), in_dims=(None, None, 0))(w, b, x)

    got = per_sample(ours)
    _assert_close(got, per_sample(reference))
    assert got[0].shape == (x.shape[0], *w.shape)


def test_per_sample_gradients_of_a_converted_model_match_the_stock_model():
    torch.manual_seed(0)
    stock = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, stride=2, groups=4),
        torch.nn.ReLU(), torch.nn.ConvTranspose2d(8, 2, 2, stride=2), torch.nn.Flatten(), torch.nn.LazyLinear(5),
    ).double()
    x, y = torch.randn(4, 3, 10, 10, dtype=torch.float64), torch.randint(0, 5, (4,))
    stock(x)  # materialises the lazy layer
    converted = torch_convbp.convert(copy.deepcopy(stock))
    assert any(type(m).__module__.startswith("torch_convbp") for m in converted.modules())

    def per_sample(model):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(params, example, label):
            return F.cross_entropy(functional_call(model, params, (example.unsqueeze(0),)), label.unsqueeze(0))
        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)

    _assert_close(per_sample(converted), per_sample(stock))


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c[0])
def test_gradcheck_forward_mode_and_batched_gradients(case):
    """gradcheck's forward-mode and vmapped-backward checks, and gradgradcheck forward over reverse."""
    ours, _ = _both(case)
    operands = [t.requires_grad_() for t in _operands(case)]
    assert gradcheck(ours, operands, check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True)
    assert gradgradcheck(ours, operands, check_fwd_over_rev=True, check_batched_grad=True)


def test_eager_calls_keep_the_operators_own_nodes():
    """Outside the transforms a call costs no Python autograd Function: its node is the C++ one."""
    x, w = torch.randn(1, 2, 5, 5, requires_grad=True), torch.randn(3, 2, 3, 3)
    assert not _func.transforms_active()
    assert type(torch_convbp.conv2d(x, w).grad_fn).__name__ != "ConvolutionBackward"
    assert "torch_convbp" in torch_convbp.conv2d(x, w).grad_fn.name()
    with fwAD.dual_level():
        assert _func.transforms_active()
        assert "torch_convbp" not in torch_convbp.conv2d(x, w).grad_fn.name()


def test_a_transform_compiled_by_torch_compile_is_refused_by_torchs_message():
    """Dynamo traces the functions' torch.ops calls, whose C++ nodes torch.func cannot see through:
    refused with torch's message, never a wrong gradient."""
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    per_sample = vmap(grad(lambda w, e: torch_convbp.conv2d(e[None], w).sum()), in_dims=(None, 0))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="functorch transforms"):
        torch.compile(per_sample, backend="eager")(w, x)
