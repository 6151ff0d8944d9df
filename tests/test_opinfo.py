"""A second opinion: PyTorch's own test inputs for the convolution family (the OpInfo sample and
error inputs of op_db). Every sample gives F's value and gradients; every error input F refuses
is refused by us too, with a message of ours."""
import pytest
import torch

import torch_convbp

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

FUNCTIONS = ["conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d"]
OPINFOS = {name: next(o for o in op_db if o.name == f"nn.functional.{name}") for name in FUNCTIONS}


def samples(name):
    return list(OPINFOS[name].sample_inputs("cpu", torch.float64, requires_grad=True))


def describe(sample):
    return f"{list(sample.input.shape)} {[list(a.shape) if isinstance(a, torch.Tensor) else a for a in sample.args]} {sample.kwargs}"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_sample_input_matches_f(name):
    ours, theirs = getattr(torch_convbp, name), OPINFOS[name].op
    cases = samples(name)
    assert cases
    for sample in cases:
        args = (sample.input, *sample.args)
        y, y_ref = ours(*args, **sample.kwargs), theirs(*args, **sample.kwargs)
        assert y.shape == y_ref.shape, describe(sample)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10, msg=describe(sample))
        if y.numel():
            inputs = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
            g = torch.randn_like(y)
            for a, e in zip(torch.autograd.grad(y, inputs, g), torch.autograd.grad(y_ref, inputs, g)):
                torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=describe(sample))


@pytest.mark.parametrize("name", [n for n in FUNCTIONS if OPINFOS[n].error_inputs_func is not None])
def test_every_error_input_is_refused(name):
    ours = getattr(torch_convbp, name)
    errors = list(OPINFOS[name].error_inputs("cpu"))
    assert errors
    for error in errors:
        sample = error.sample_input
        with pytest.raises((RuntimeError, ValueError), match="torch_convbp"):
            ours(sample.input, *sample.args, **sample.kwargs)
