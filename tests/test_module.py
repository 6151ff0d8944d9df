"""torch_convbp.Conv2d as a drop-in nn.Conv2d, and convert() on a whole model."""
import copy
import io

import pytest
import torch
import torch.nn as nn

import torch_convbp

PADDING_MODES = ["zeros", "reflect", "replicate", "circular"]


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("padding", [1, (2, 1), "same", "valid"])
def test_matches_nn_conv2d(padding_mode, padding, device):
    torch.manual_seed(0)
    kwargs = dict(padding=padding, padding_mode=padding_mode, dilation=(1, 2), groups=2, device=device, dtype=torch.float64)
    ours = torch_convbp.Conv2d(4, 6, (3, 2), **kwargs)
    ref = nn.Conv2d(4, 6, (3, 2), **kwargs)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, 7, 8, dtype=torch.float64, device=device, requires_grad=True)
    y, y_ref = ours(x), ref(x)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, ours.weight, ours.bias), g)
    want = torch.autograd.grad(y_ref, (x, ref.weight, ref.bias), g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_state_dict_round_trips_both_ways():
    ours = torch_convbp.Conv2d(3, 5, 3, stride=2, bias=True)
    ref = nn.Conv2d(3, 5, 3, stride=2, bias=True)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ref.load_state_dict(ours.state_dict())
    ours2 = torch_convbp.Conv2d(3, 5, 3, stride=2)
    ours2.load_state_dict(ref.state_dict())
    for a, b in zip(ours.state_dict().values(), ours2.state_dict().values()):
        assert torch.equal(a, b)
    assert isinstance(ours, nn.Conv2d) and "Conv2d(3, 5" in repr(ours)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def small_resnet():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        BasicBlock(8, 8, 1), BasicBlock(8, 16, 2), BasicBlock(16, 16, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


def test_convert_replaces_every_conv_and_keeps_parameters():
    model = small_resnet()
    params = list(model.parameters())
    converted = torch_convbp.convert(model)
    assert converted is model
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 8 and all(type(m) is torch_convbp.Conv2d for m in convs)
    assert all(a is b for a, b in zip(params, model.parameters()))


def test_converted_model_trains_like_the_original(device):
    torch.manual_seed(0)
    original = small_resnet().double().to(device)
    converted = torch_convbp.convert(copy.deepcopy(original))
    x = torch.randn(4, 3, 12, 12, dtype=torch.float64, device=device)
    target = torch.randint(0, 10, (4,), device=device)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (original, converted)]
    for step in range(4):
        losses = []
        for model, opt in zip((original, converted), opts):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-10, abs=1e-12), step
    for a, b in zip(original.parameters(), converted.parameters()):
        torch.testing.assert_close(a, b)


def test_convert_leaves_other_modules_and_subclasses_that_compute_more_alone():
    class DoubledConv(nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    class PaddedConv(nn.Conv2d):
        def _conv_forward(self, x, weight, bias):
            return super()._conv_forward(nn.functional.pad(x, (1, 1, 1, 1)), weight, bias)

    model = nn.Sequential(DoubledConv(3, 3, 1), PaddedConv(3, 3, 1), nn.Linear(3, 3))
    torch_convbp.convert(model)
    assert [type(m) for m in model] == [DoubledConv, PaddedConv, nn.Linear]


class PlainConv3d(nn.Conv3d):
    """A subclass that keeps nn's computation and adds a method (as torchvision's Conv3DSimple)."""

    @staticmethod
    def depth_stride():
        return 1


class PlainConvTranspose2d(nn.ConvTranspose2d):
    pass


def test_convert_takes_subclasses_that_keep_nn_computation_and_revert_gives_them_back():
    """A subclass overriding neither forward nor _conv_forward becomes a class of its name that is
    both it and torch_convbp's twin: the same values, its own methods, pickled and deep-copied as
    itself; revert() restores the subclass."""
    torch.manual_seed(0)
    model = nn.Sequential(PlainConv3d(2, 4, 3, padding=1), nn.Flatten(1, 2), PlainConvTranspose2d(12, 2, 2, stride=2))
    x = torch.randn(1, 2, 3, 5, 5, dtype=torch.float64)
    model.double()
    expected = model(x)
    params = list(model.parameters())
    torch_convbp.convert(model)
    conv, transposed = model[0], model[2]
    assert isinstance(conv, PlainConv3d) and isinstance(conv, torch_convbp.Conv3d) and type(conv).__name__ == "PlainConv3d"
    assert isinstance(transposed, PlainConvTranspose2d) and isinstance(transposed, torch_convbp.ConvTranspose2d)
    assert conv.depth_stride() == 1 and all(a is b for a, b in zip(params, model.parameters()))
    assert type(torch_convbp.convert(copy.deepcopy(model))[0]) is type(conv)  # one class per subclass
    torch.testing.assert_close(model(x), expected, rtol=1e-12, atol=1e-12)
    assert "torch_convbp" in conv(x.requires_grad_()).grad_fn.name()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for copied in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        assert [type(m) for m in copied] == [type(m) for m in model]
        torch.testing.assert_close(copied(x), expected, rtol=1e-12, atol=1e-12)
    torch_convbp.revert(model)
    assert [type(m) for m in model] == [PlainConv3d, nn.Flatten, PlainConvTranspose2d]
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_convert_takes_every_convolution_of_torchvisions_video_models():
    """r3d_18's 3x3x3 layers are torchvision's Conv3DSimple, a subclass of nn.Conv3d."""
    torchvision = pytest.importorskip("torchvision")
    for name in ("r3d_18", "r2plus1d_18", "mc3_18"):
        model = torch_convbp.convert(getattr(torchvision.models.video, name)())
        convs = [m for m in model.modules() if isinstance(m, nn.Conv3d)]
        assert convs and all(isinstance(m, torch_convbp.Conv3d) for m in convs), name
