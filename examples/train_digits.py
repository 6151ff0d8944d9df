"""Train a LeNet-style network on scikit-learn's handwritten digits (8x8 images, 10 classes; the
data ships inside scikit-learn, nothing is downloaded), once with nn.Conv2d and once after
torch_convbp.convert(), from the same initial weights. Prints both loss curves and accuracies.

    pip install scikit-learn && python examples/train_digits.py
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import torch_convbp


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x8 -> 4x4
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4 -> 2x2
        nn.Flatten(), nn.Linear(16 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def data():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(y), generator=g)
    split = int(0.8 * len(y))
    return (x[order[:split]], y[order[:split]]), (x[order[split:]], y[order[split:]])


def train(model, train_set, test_set, epochs=15, batch=64):
    torch.manual_seed(1)  # the same batches for both runs
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = train_set
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(y))
        total = 0.0
        for i in range(0, len(y), batch):
            idx = order[i : i + batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(y))
    with torch.no_grad():
        accuracy = (model(test_set[0]).argmax(1) == test_set[1]).float().mean().item()
    return losses, accuracy


def main():
    torch.manual_seed(0)
    reference = lenet()
    converted = torch_convbp.convert(copy.deepcopy(reference))
    train_set, test_set = data()
    print(f"digits: {len(train_set[1])} training and {len(test_set[1])} test images, 8x8, 10 classes")
    results = {name: train(model, train_set, test_set) for name, model in (("nn.Conv2d", reference), ("torch_convbp", converted))}
    print(f"\n{'epoch':>5} | {'nn.Conv2d loss':>14} | {'torch_convbp loss':>17}")
    for epoch, (a, b) in enumerate(zip(results["nn.Conv2d"][0], results["torch_convbp"][0]), 1):
        print(f"{epoch:>5} | {a:>14.4f} | {b:>17.4f}")
    for name, (losses, accuracy) in results.items():
        print(f"{name:>13}: test accuracy {accuracy:.1%}")
    gap = max(abs(a - b) for a, b in zip(results["nn.Conv2d"][0], results["torch_convbp"][0]))
    print(f"largest difference between the two loss curves: {gap:.2e} (float32 rounding only)")


if __name__ == "__main__":
    main()
