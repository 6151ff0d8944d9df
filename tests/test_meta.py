"""Meta tensors (sizes, no values) and the kinds of tensor torch_convbp does not compute on.

On the meta device every function and module of the family gives what torch.nn.functional gives:
the output's shape, dtype and memory format, and gradients through autograd; so shape inference,
FLOP counters and models built under torch.device("meta") before to_empty() work. Nested, sparse
and quantized tensors, and devices without kernels, are refused by name."""
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_convbp
from torch_convbp._args import check_tensor

META = dict(device="meta")
CL = torch.channels_last

# (name, function, F's twin, input size, weight size, keyword arguments)
CALLS = [
    ("conv2d", torch_convbp.conv2d, F.conv2d, (2, 4, 9, 8), (6, 2, 3, 2), dict(stride=(2, 1), padding=1, groups=2)),
    ("conv2d same, dilated", torch_convbp.conv2d, F.conv2d, (2, 4, 9, 8), (6, 4, 4, 3), dict(padding="same", dilation=2)),
    ("conv2d unbatched", torch_convbp.conv2d, F.conv2d, (4, 9, 8), (6, 4, 3, 3), dict(padding=1)),
    ("conv1d", torch_convbp.conv1d, F.conv1d, (2, 4, 17), (6, 4, 5), dict(stride=2, padding=2)),
    ("conv_transpose2d", torch_convbp.conv_transpose2d, F.conv_transpose2d, (2, 6, 5, 4), (6, 3, 3, 3),
     dict(stride=2, padding=1, output_padding=1)),
    ("conv_transpose1d", torch_convbp.conv_transpose1d, F.conv_transpose1d, (2, 6, 7), (6, 2, 4), dict(stride=3, groups=2)),
    ("conv3d", torch_convbp.conv3d, F.conv3d, (2, 4, 5, 9, 8), (6, 2, 3, 3, 2), dict(stride=(1, 2, 1), padding=1, groups=2)),
    ("conv3d same", torch_convbp.conv3d, F.conv3d, (2, 4, 5, 9, 8), (6, 4, 2, 3, 3), dict(padding="same")),
    ("conv_transpose3d", torch_convbp.conv_transpose3d, F.conv_transpose3d, (2, 6, 3, 5, 4), (6, 3, 2, 3, 3),
     dict(stride=2, padding=1, output_padding=1)),
]


@pytest.mark.parametrize("layout", [torch.contiguous_format, CL], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("name, ours, theirs, input_size, weight_size, kwargs", CALLS, ids=[c[0] for c in CALLS])
def test_functions_on_meta_tensors_give_what_f_gives(name, ours, theirs, input_size, weight_size, kwargs, dtype, layout):
    x = torch.empty(input_size, dtype=dtype, **META)
    w = torch.empty(weight_size, dtype=dtype, **META)
    if x.dim() == 5 and layout == CL:
        x, w = x.contiguous(memory_format=torch.channels_last_3d), w.contiguous(memory_format=torch.channels_last_3d)
    elif x.dim() == 4:
        x, w = x.contiguous(memory_format=layout), w.contiguous(memory_format=layout)
    x.requires_grad_(), w.requires_grad_()
    y, y_ref = ours(x, w, **kwargs), theirs(x, w, **kwargs)
    assert (y.shape, y.dtype, y.device, y.stride()) == (y_ref.shape, y_ref.dtype, y_ref.device, y_ref.stride())
    grads = torch.autograd.grad(y.sum(), (x, w))
    grads_ref = torch.autograd.grad(y_ref.sum(), (x, w))
    for g, g_ref in zip(grads, grads_ref):
        assert (g.shape, g.dtype, g.device) == (g_ref.shape, g_ref.dtype, g_ref.device)


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular"])
def test_modules_built_on_the_meta_device(padding_mode):
    pairs = [(torch_convbp.Conv2d, nn.Conv2d, (2, 4, 9, 8)), (torch_convbp.Conv1d, nn.Conv1d, (2, 4, 9))]
    if padding_mode == "zeros":
        pairs += [(torch_convbp.ConvTranspose2d, nn.ConvTranspose2d, (2, 4, 9, 8)),
                  (torch_convbp.ConvTranspose1d, nn.ConvTranspose1d, (2, 4, 9))]
    with torch.device("meta"):
        for ours, stock, size in pairs:
            kwargs = dict(stride=2, padding=1, padding_mode=padding_mode)
            x = torch.empty(size)
            y, y_ref = ours(4, 6, 3, **kwargs)(x), stock(4, 6, 3, **kwargs)(x)
            assert y.shape == y_ref.shape and y.device.type == "meta"


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(4, 2, 1), nn.Flatten(), nn.Linear(2 * 16 * 16, 3),
    )


def test_a_converted_model_built_on_meta_then_materialized_trains():
    """Built and converted without memory, its output shape inferred on meta; then to_empty() on
    the CPU, initialized, and a real training step."""
    with torch.device("meta"):
        model = torch_convbp.convert(make_model())
        assert model(torch.empty(5, 3, 16, 16)).shape == (5, 3)
    model = model.to_empty(device="cpu")
    torch.manual_seed(0)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    x, target = torch.randn(5, 3, 16, 16), torch.randint(0, 3, (5,))
    loss = F.cross_entropy(model(x), target)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_converted_torchvision_model_on_meta():
    torchvision = pytest.importorskip("torchvision")
    with torch.device("meta"):
        model = torch_convbp.convert(torchvision.models.resnet18())
        assert model(torch.empty(2, 3, 64, 64)).shape == (2, 1000)
    model = model.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    model(torch.randn(2, 3, 64, 64)).sum().backward()


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_nested_sparse_and_quantized_tensors_are_refused_by_name():
    w = torch.randn(4, 3, 3, 3)
    nested = torch.nested.nested_tensor([torch.randn(3, 8, 8), torch.randn(3, 6, 6)])
    with pytest.raises(RuntimeError, match="input is a nested tensor"):
        torch_convbp.conv2d(nested, w)
    with pytest.raises(RuntimeError, match="input must be a dense .strided. tensor, got layout torch.sparse_coo"):
        torch_convbp.conv2d(torch.randn(1, 3, 8, 8).to_sparse(), w)
    with pytest.raises(RuntimeError, match="weight must be a dense .strided. tensor, got layout torch.sparse_coo"):
        torch_convbp.conv1d(torch.randn(1, 3, 8), torch.randn(4, 3, 2).to_sparse())
    quantized = torch.quantize_per_tensor(torch.randn(1, 3, 8, 8), 0.1, 0, torch.quint8)
    with pytest.raises(RuntimeError, match=r"input is quantized \(torch.quint8\).*dequantize"):
        torch_convbp.conv2d(quantized, w)
    with pytest.raises(RuntimeError, match="bias is quantized"):
        torch_convbp.conv_transpose2d(torch.randn(1, 4, 5, 5), w, torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8))


def test_a_device_without_kernels_is_refused_by_name():
    """Checked on a stand-in: no such device is at hand here."""
    stand_in = types.SimpleNamespace(is_nested=False, layout=torch.strided, is_quantized=False,
                                     is_cpu=False, is_cuda=False, device=torch.device("mps"))
    with pytest.raises(RuntimeError, match="input is on device 'mps', where torch_convbp has no kernels"):
        check_tensor("torch_convbp.conv2d", "input", stand_in)
