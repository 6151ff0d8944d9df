"""The layers the benchmarks time (shapes.json, package data), and their sizes and operands.

A layer is 2-D unless it says "dims": 3; its size, kernel, stride, padding and dilation are each
an int (the same in every spatial dimension) or a list, one per dimension ([D, H, W] for 3-D).
A layer with "transposed": true is a transposed convolution (conv_transpose3d, say): its
in_channels are its input's, and its weight is [in_channels, out_channels/groups, k...]."""
import json
import math
import os

import torch
import torch.nn.functional as F

import torch_convbp

SUITES = ("quick", "resnet18", "resnet50", "mobilenet", "video", "volumes")


def load_layers(suite="all", name_filter=""):
    """The layers of a suite: one of SUITES, "all", "2d" (every 2-D layer) or "3d"."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes.json")) as f:
        layers = json.load(f)["layers"]

    def chosen(layer):
        if suite in ("2d", "3d"):
            return dims(layer) == int(suite[0])
        return suite == "all" or suite in layer["suites"]

    return [layer for layer in layers if chosen(layer) and name_filter in layer["name"]]


DEFAULT_BATCH = 8


def batch_of(layer, batch=None):
    """The batch to time the layer at: `batch` where given, else the layer's own, else 8."""
    return batch or layer.get("batch", DEFAULT_BATCH)


def dims(layer):
    return layer.get("dims", 2)


def spatial(layer, key, value=None):
    """A per-dimension value of the layer (or `value` in its place) as a tuple, one per dimension."""
    value = layer[key] if value is None else value
    return (value,) * dims(layer) if isinstance(value, int) else tuple(value)


def conv_args(layer):
    """stride, padding, dilation (tuples) and groups, as the functions take them."""
    return spatial(layer, "stride"), spatial(layer, "padding"), spatial(layer, "dilation"), layer["groups"]


def functions(layer):
    """(torch_convbp's function, torch.nn.functional's) for the layer, each called as
    f(x, w, bias, stride, padding, dilation, groups)."""
    name = f"conv{dims(layer)}d"
    if not layer.get("transposed"):
        return getattr(torch_convbp, name), getattr(F, name)

    def transposed(module):
        function = getattr(module, f"conv_transpose{dims(layer)}d")
        return lambda x, w, b, stride, padding, dilation, groups: function(x, w, b, stride, padding, 0, groups, dilation)

    return transposed(torch_convbp), transposed(F)


def out_sizes(layer, size=None):
    """The output's spatial sizes for an input of the layer's size (or `size`)."""
    sizes = spatial(layer, "size", size)
    kernel, (stride, padding, dilation, _) = spatial(layer, "kernel"), conv_args(layer)
    if layer.get("transposed"):
        return tuple((s - 1) * t - 2 * p + d * (k - 1) + 1 for s, k, t, p, d in zip(sizes, kernel, stride, padding, dilation))
    return tuple((s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, t, p, d in zip(sizes, kernel, stride, padding, dilation))


def output_pixels(layer, size=None):
    return math.prod(out_sizes(layer, size))


def as_convolution(layer, size=None):
    """(in channels, out channels, output pixels per image) of the convolution whose GEMMs the
    layer runs: the layer itself, or for a transposed layer the convolution it is the input
    gradient of (its output is that convolution's input, its input that convolution's output)."""
    if layer.get("transposed"):
        return layer["out_channels"], layer["in_channels"], math.prod(spatial(layer, "size", size))
    return layer["in_channels"], layer["out_channels"], output_pixels(layer, size)


def make_operands(layer, batch, device, dtype, size=None, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, layer["in_channels"], *spatial(layer, "size", size), generator=g).to(device, dtype)
    kernel = spatial(layer, "kernel")
    if layer.get("transposed"):
        w = torch.randn(layer["in_channels"], layer["out_channels"] // layer["groups"], *kernel, generator=g)
    else:
        w = torch.randn(layer["out_channels"], layer["in_channels"] // layer["groups"], *kernel, generator=g)
    return x.requires_grad_(requires_grad), w.to(device, dtype).requires_grad_(requires_grad)


def flops(layer, batch, passes, size=None):
    """2 x the forward's multiply-adds; the backward is twice the forward (grad-input, grad-weight)."""
    c_in, c_out, pixels = as_convolution(layer, size)
    fwd = 2 * batch * c_out * pixels * (c_in // layer["groups"]) * math.prod(spatial(layer, "kernel"))
    return {"forward": fwd, "backward": 2 * fwd, "both": 3 * fwd}[passes]


def channels_last(t):
    """The memory format of channels last for t's rank: channels_last, or channels_last_3d."""
    return torch.channels_last_3d if t.dim() == 5 else torch.channels_last
