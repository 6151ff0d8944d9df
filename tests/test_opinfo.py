"""A second opinion: PyTorch's own test inputs for the convolution family (the OpInfo sample and
error inputs of op_db, and the ModuleInfo inputs of module_db). Every sample gives F's (or nn's)
value and gradients; every error input F refuses is refused by us too, with a message of ours."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_convbp

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402

FUNCTIONS = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]
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


MODULES = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


@pytest.mark.parametrize("name", MODULES)
def test_every_module_input_matches_nn(name):
    """module_db's constructor and forward inputs: the nn module, and a converted copy of it."""
    info = next(m for m in module_db if m.module_cls is getattr(nn, name))
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float64, requires_grad=True, training=True)
    assert inputs
    for module_input in inputs:
        constructor, forward = module_input.constructor_input, module_input.forward_input
        reference = info.module_cls(*constructor.args, **constructor.kwargs).double()
        ours = torch_convbp.convert(copy.deepcopy(reference))
        assert type(ours) is getattr(torch_convbp, name)
        y, y_ref = ours(*forward.args, **forward.kwargs), reference(*forward.args, **forward.kwargs)
        what = f"{name}{constructor.args} {constructor.kwargs} on {[list(a.shape) for a in forward.args]}"
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10, msg=what)
        g = torch.randn_like(y)
        grads = torch.autograd.grad(y, [*forward.args, *ours.parameters()], g)
        grads_ref = torch.autograd.grad(y_ref, [*forward.args, *reference.parameters()], g)
        for a, e in zip(grads, grads_ref):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=what)
