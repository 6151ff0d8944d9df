"""The worked example of docs/backprop.md, number for number."""
import torch

import torch_convbp

ops = torch.ops.torch_convbp
X = torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.float64).view(1, 1, 3, 3)
W = torch.tensor([[1.0, 0], [-1, 2]], dtype=torch.float64).view(1, 1, 2, 2)
DY = torch.tensor([[1.0, 0], [0, -1]], dtype=torch.float64).view(1, 1, 2, 2)
ARGS = ((1, 1), (0, 0), (1, 1), 1)


def test_column_matrix():
    cols = X.new_empty(4, 4)
    ops.im2col(X, (2, 2), *ARGS[:3], 0, 2, cols)
    assert cols.tolist() == [[1, 2, 4, 5], [2, 3, 5, 6], [4, 5, 7, 8], [5, 6, 8, 9]]


def test_forward_and_both_gradients():
    assert torch_convbp.conv2d(X, W).view(2, 2).tolist() == [[7, 9], [13, 15]]
    assert ops.conv2d_weight_grad(X, DY, [1, 1, 2, 2], *ARGS).view(2, 2).tolist() == [[-4, -4], [-4, -4]]
    dx = ops.conv2d_input_grad(DY, W, [1, 1, 3, 3], *ARGS).view(3, 3)
    assert dx.tolist() == [[1, 0, 0], [-1, 1, 0], [0, 1, -2]]


def test_input_gradient_is_pad_rotate_convolve():
    dx = ops.conv2d_input_grad(DY, W, [1, 1, 3, 3], *ARGS)
    rotated = W.flip(2, 3)
    assert torch.equal(dx, torch.nn.functional.conv2d(DY, rotated, padding=1))
