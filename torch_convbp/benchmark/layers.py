"""The layers the benchmarks time (shapes.json, package data), and their sizes and operands."""
import json
import os

import torch


def load_layers(suite="all", name_filter=""):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes.json")) as f:
        layers = json.load(f)["layers"]
    return [layer for layer in layers if (suite == "all" or suite in layer["suites"]) and name_filter in layer["name"]]


def conv_args(layer):
    return layer["stride"], layer["padding"], layer["dilation"], layer["groups"]


def out_size(layer, size=None):
    size = layer["size"] if size is None else size
    reach = layer["dilation"] * (layer["kernel"] - 1) + 1
    return (size + 2 * layer["padding"] - reach) // layer["stride"] + 1


def make_operands(layer, batch, device, dtype, size=None, requires_grad=True):
    size = layer["size"] if size is None else size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, layer["in_channels"], size, size, generator=g).to(device, dtype)
    w = torch.randn(layer["out_channels"], layer["in_channels"] // layer["groups"], layer["kernel"],
                    layer["kernel"], generator=g).to(device, dtype)
    return x.requires_grad_(requires_grad), w.requires_grad_(requires_grad)


def flops(layer, batch, passes, size=None):
    """2 x the forward's multiply-adds; the backward is twice the forward (grad-input, grad-weight)."""
    k = layer["kernel"]
    fwd = 2 * batch * layer["out_channels"] * out_size(layer, size) ** 2 * (layer["in_channels"] // layer["groups"]) * k * k
    return {"forward": fwd, "backward": 2 * fwd, "both": 3 * fwd}[passes]
