"""A gradient penalty (as in WGAN-GP): it needs the gradient of a gradient, i.e. double backward
through the convolutions. Computed with nn.Conv2d and with torch_convbp, in float64, and compared.

    python examples/gradient_penalty.py
"""
import copy

import torch
import torch.nn as nn

import torch_convbp


def critic():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.Tanh(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2), nn.Tanh(),
        nn.Conv2d(32, 32, 3, padding=2, dilation=2), nn.Tanh(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1),
    ).double()


def penalty_and_grads(model, x):
    """The penalty E[(|d critic / d x| - 1)^2] and its gradient with respect to every weight."""
    x = x.clone().requires_grad_()
    (grad_x,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)  # first backward
    penalty = ((grad_x.flatten(1).norm(dim=1) - 1) ** 2).mean()
    # backward of the backward (the last bias does not change d critic / d x: its gradient is 0)
    grads = torch.autograd.grad(penalty, list(model.parameters()), materialize_grads=True)
    return penalty, grads


def main():
    torch.manual_seed(0)
    reference = critic()
    ours = torch_convbp.convert(copy.deepcopy(reference))
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    p_ref, g_ref = penalty_and_grads(reference, x)
    p_ours, g_ours = penalty_and_grads(ours, x)
    worst = max((a - b).abs().max().item() for a, b in zip(g_ours, g_ref))
    print(f"gradient penalty: nn.Conv2d {p_ref.item():.12f}, torch_convbp {p_ours.item():.12f}")
    print(f"its gradients w.r.t. all {len(g_ref)} parameter tensors agree to {worst:.1e}")
    assert abs(p_ref.item() - p_ours.item()) < 1e-10 and worst < 1e-9
    print("ok: double backward through torch_convbp matches nn.Conv2d")


if __name__ == "__main__":
    main()
