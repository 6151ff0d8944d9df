"""Conv1d, Conv3d, ConvTranspose1d, ConvTranspose2d and ConvTranspose3d as drop-ins for their nn
classes, and convert() / revert() on a model that holds every convolution class."""
import pytest
import torch
import torch.nn as nn

import torch_convbp

F64 = dict(dtype=torch.float64)


def assert_same_values_and_grads(ours, ref, x, **forward_kwargs):
    y, y_ref = ours(x, **forward_kwargs), ref(x, **forward_kwargs)
    assert y.shape == y_ref.shape
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    params = [p for p in (ours.weight, ours.bias) if p is not None]
    params_ref = [p for p in (ref.weight, ref.bias) if p is not None]
    for a, e in zip(torch.autograd.grad(y, [x, *params], g), torch.autograd.grad(y_ref, [x, *params_ref], g)):
        torch.testing.assert_close(a, e)


def twin(ours_class, nn_class, *args, **kwargs):
    """A torch_convbp module and an nn module with the same state."""
    ours = ours_class(*args, **kwargs, **F64)
    ref = nn_class(*args, **kwargs, **F64)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [2, (1,), "same", "valid"])
def test_conv1d_matches_nn(padding_mode, padding):
    torch.manual_seed(0)
    ours, ref = twin(torch_convbp.Conv1d, nn.Conv1d, 4, 6, 3, padding=padding, padding_mode=padding_mode,
                     dilation=2, groups=2)
    for x in (torch.randn(2, 4, 11, **F64), torch.randn(4, 11, **F64)):  # batched and unbatched
        assert_same_values_and_grads(ours, ref, x.requires_grad_())


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [(2, 1, 0), "same", "valid"])
def test_conv3d_matches_nn(padding_mode, padding):
    torch.manual_seed(0)
    ours, ref = twin(torch_convbp.Conv3d, nn.Conv3d, 4, 6, (3, 2, 3), padding=padding, padding_mode=padding_mode,
                     dilation=(1, 2, 1), groups=2)
    for x in (torch.randn(2, 4, 5, 6, 4, **F64), torch.randn(4, 5, 6, 4, **F64)):  # batched and unbatched
        assert_same_values_and_grads(ours, ref, x.requires_grad_())


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_matches_nn(dims, bias):
    torch.manual_seed(0)
    classes = {1: (torch_convbp.ConvTranspose1d, nn.ConvTranspose1d), 2: (torch_convbp.ConvTranspose2d, nn.ConvTranspose2d),
               3: (torch_convbp.ConvTranspose3d, nn.ConvTranspose3d)}
    ours, ref = twin(*classes[dims], 4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=1, bias=bias)
    size = (5,) * dims
    for x in (torch.randn(2, 4, *size, **F64), torch.randn(4, *size, **F64)):
        assert_same_values_and_grads(ours, ref, x.requires_grad_())


@pytest.mark.parametrize("output_size", [[11, 11], [12, 12], [11, 12], [2, 6, 12, 11], [6, 12, 11]])
def test_conv_transpose_output_size(output_size):
    """forward(input, output_size) picks the output_padding that reaches the size, as nn does
    (with the batch and channel dimensions in output_size, or without)."""
    torch.manual_seed(0)
    ours, ref = twin(torch_convbp.ConvTranspose2d, nn.ConvTranspose2d, 4, 6, 3, stride=2, groups=2)
    x = torch.randn(2, 4, 5, 5, **F64, requires_grad=True)
    if len(output_size) == 3:
        x = x[0].detach().requires_grad_()
    assert_same_values_and_grads(ours, ref, x, output_size=output_size)
    assert list(ours(x, output_size=output_size).shape[-2:]) == output_size[-2:]


def test_conv_transpose3d_output_size():
    ours, ref = twin(torch_convbp.ConvTranspose3d, nn.ConvTranspose3d, 3, 2, 3, stride=(2, 3, 1))
    x = torch.randn(2, 3, 3, 4, 5, **F64, requires_grad=True)
    for size in ([7, 12, 7], [8, 14, 7], [2, 2, 8, 13, 7]):
        assert_same_values_and_grads(ours, ref, x, output_size=size)
        assert list(ours(x, output_size=size).shape[-3:]) == size[-3:]


def test_conv_transpose1d_output_size():
    ours, ref = twin(torch_convbp.ConvTranspose1d, nn.ConvTranspose1d, 3, 2, 4, stride=3)
    x = torch.randn(2, 3, 6, **F64, requires_grad=True)
    for size in (19, 20, 21):
        assert_same_values_and_grads(ours, ref, x, output_size=[size])


def test_an_unreachable_output_size_is_refused_as_nn_refuses_it():
    ours = torch_convbp.ConvTranspose2d(4, 6, 3, stride=2)
    x = torch.randn(2, 4, 5, 5)
    with pytest.raises(ValueError, match=r"requested an output size of \[10, 10\], but valid sizes range from \[11, 11\] to \[12, 12\]"):
        ours(x, output_size=[10, 10])
    with pytest.raises(ValueError, match=r"requested an output size of \[13, 11\]"):
        ours(x, output_size=[13, 11])


def test_conv_transpose_padding_modes_are_nn_s():
    """nn supports only 'zeros' for transposed convolutions, and so do we (nn's constructor)."""
    with pytest.raises(ValueError, match='Only "zeros" padding mode is supported'):
        torch_convbp.ConvTranspose2d(4, 6, 3, padding_mode="reflect")
    module = torch_convbp.ConvTranspose1d(4, 6, 3)
    module.padding_mode = "circular"  # set after construction: forward refuses it too
    with pytest.raises(ValueError, match='Only "zeros" padding mode is supported for ConvTranspose1d'):
        module(torch.randn(1, 4, 5))


@pytest.mark.parametrize("ours_class, nn_class", [
    (torch_convbp.Conv1d, nn.Conv1d), (torch_convbp.ConvTranspose1d, nn.ConvTranspose1d),
    (torch_convbp.ConvTranspose2d, nn.ConvTranspose2d), (torch_convbp.Conv3d, nn.Conv3d),
    (torch_convbp.ConvTranspose3d, nn.ConvTranspose3d)])
def test_state_dict_and_repr_are_nn_s(ours_class, nn_class):
    ours, ref = ours_class(3, 6, 3, stride=2, groups=3), nn_class(3, 6, 3, stride=2, groups=3)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    assert isinstance(ours, nn_class) and repr(ours).replace(ours_class.__name__, "") == repr(ref).replace(nn_class.__name__, "")


class EveryClass(nn.Module):
    """An encoder-decoder over 1-D, 2-D and 3-D signals, with every convolution class."""

    def __init__(self):
        super().__init__()
        self.encode1d = nn.Conv1d(2, 4, 3, stride=2, padding=1)
        self.decode1d = nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1, output_padding=1)
        self.encode2d = nn.Conv2d(3, 8, 3, stride=2, padding=1, padding_mode="reflect")
        self.decode2d = nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1, groups=1)
        self.keep = type("MyConv", (nn.Conv2d,), {})(3, 3, 1)  # a subclass: its forward may do more
        self.encode3d = nn.Conv3d(2, 4, (3, 3, 3), stride=(1, 2, 2), padding=1, groups=2)
        self.decode3d = nn.ConvTranspose3d(4, 2, 2, stride=(1, 2, 2), padding=(1, 0, 0))

    def forward(self, signal, image, volume):
        return (self.decode1d(torch.relu(self.encode1d(signal))), self.keep(self.decode2d(torch.relu(self.encode2d(image)))),
                self.decode3d(torch.relu(self.encode3d(volume))))

    CONVERTED = ("encode1d", "decode1d", "encode2d", "decode2d", "encode3d", "decode3d")

    @staticmethod
    def inputs(batch, **kwargs):
        g = torch.Generator().manual_seed(batch)
        return (torch.randn(batch, 2, 16, generator=g, **kwargs), torch.randn(batch, 3, 8, 8, generator=g, **kwargs),
                torch.randn(batch, 2, 4, 6, 6, generator=g, **kwargs))


def test_convert_and_revert_swap_every_class_and_keep_the_parameters():
    torch.manual_seed(0)
    model = EveryClass().double()
    inputs = EveryClass.inputs(2, **F64)
    expected = model(*inputs)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    assert torch_convbp.convert(model) is model
    assert [type(getattr(model, name)) for name in EveryClass.CONVERTED] == [
        torch_convbp.Conv1d, torch_convbp.ConvTranspose1d, torch_convbp.Conv2d, torch_convbp.ConvTranspose2d,
        torch_convbp.Conv3d, torch_convbp.ConvTranspose3d]
    assert type(model.keep).__name__ == "MyConv"
    assert all(a is b for a, b in zip(model.parameters(), params))
    for a, e in zip(model(*inputs), expected):
        torch.testing.assert_close(a, e)
    sum(y.square().sum() for y in model(*inputs)).backward()
    optimizer.step()  # the optimizer built before convert() updates the same Parameters

    assert torch_convbp.revert(model) is model
    assert [type(getattr(model, name)) for name in EveryClass.CONVERTED] == [
        nn.Conv1d, nn.ConvTranspose1d, nn.Conv2d, nn.ConvTranspose2d, nn.Conv3d, nn.ConvTranspose3d]
    assert all(a is b for a, b in zip(model.parameters(), params))
    reverted = model(*inputs)
    torch_convbp.convert(model)
    for a, e in zip(model(*inputs), reverted):
        torch.testing.assert_close(a, e)


def test_a_converted_model_compiles_with_fullgraph():
    torch.manual_seed(0)
    model = torch_convbp.convert(EveryClass().double())
    inputs = EveryClass.inputs(2, **F64)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for a, e in zip(compiled(*inputs), model(*inputs)):
        torch.testing.assert_close(a, e)
    sum(y.sum() for y in compiled(*inputs)).backward()
    assert model.decode2d.weight.grad is not None and model.encode3d.weight.grad is not None
