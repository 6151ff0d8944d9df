"""torch_convbp.Conv2d as a drop-in nn.Conv2d, and convert() on a whole model."""
import copy

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


def test_convert_leaves_other_modules_and_subclasses_alone():
    class MyConv(nn.Conv2d):
        pass

    model = nn.Sequential(MyConv(3, 3, 1), nn.Linear(3, 3))
    torch_convbp.convert(model)
    assert type(model[0]) is MyConv and type(model[1]) is nn.Linear
