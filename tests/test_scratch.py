"""Scratch memory kept between calls (csrc/scratch.h): on the CPU, the column matrices, staging,
flipped weights, partial sums and layout copies of a call come from a pool of blocks that
earlier calls freed, at most min(workspace limit, 256 MiB) of them kept; results never do."""
import pytest
import torch

import torch_convbp

CL = torch.channels_last

# (name, input, weight, stride, padding, groups, input format): routes that use each kind of scratch
CALLS = [
    ("columns, several chunks", (6, 16, 20, 20), (24, 16, 3, 3), 1, 1, 1, torch.contiguous_format),
    ("strided: col2im", (4, 16, 15, 15), (32, 16, 3, 3), 2, 1, 1, torch.contiguous_format),
    ("channels_last columns", (4, 16, 12, 12), (24, 16, 3, 3), 2, 0, 1, CL),
    ("implicit or NHWC columns", (2, 32, 14, 14), (32, 32, 3, 3), 1, 1, 1, CL),
    # NCHW operands of small depthwise planes compute in NHWC: the result is a copy
    ("depthwise through NHWC", (3, 32, 7, 7), (32, 1, 3, 3), 1, 1, 32, torch.contiguous_format),
    ("deep, one chunk", (2, 256, 5, 5), (256, 256, 3, 3), 1, 1, 1, torch.contiguous_format),
]


def step(shape, weight, stride, padding, groups, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).contiguous(memory_format=fmt).requires_grad_()
    w = torch.randn(weight, generator=g).requires_grad_()
    y = torch_convbp.conv2d(x, w, None, stride, padding, 1, groups)
    dx, dw = torch.autograd.grad(y, (x, w), torch.randn(y.shape, generator=g))
    return y.detach(), dx, dw


@pytest.mark.parametrize("name, shape, weight, stride, padding, groups, fmt", CALLS, ids=[c[0] for c in CALLS])
def test_results_stay_theirs_while_later_calls_reuse_the_pool(name, shape, weight, stride, padding, groups, fmt):
    """The output and gradients of a call keep their values through later calls of every kind,
    which take and give back pool blocks: no result is pool memory."""
    results = step(shape, weight, stride, padding, groups, fmt)
    kept = [r.clone() for r in results]
    for other in CALLS:
        step(*other[1:], seed=1)
        step(shape, weight, stride, padding, groups, fmt, seed=2)
    for before, now in zip(kept, results):
        assert torch.equal(before, now)


def test_the_pool_keeps_blocks_within_its_bound_and_gives_them_back():
    torch_convbp.release_scratch()
    step(*CALLS[0][1:])
    assert torch_convbp.pooled_scratch() > 0
    assert 0 < torch_convbp.release_scratch() and torch_convbp.pooled_scratch() == 0
    with torch_convbp.workspace_limit(300_000):  # the pool keeps no more than the limit
        for call in CALLS:
            step(*call[1:])
            assert torch_convbp.pooled_scratch() <= 300_000
    torch_convbp.release_scratch()


def test_calls_give_the_same_bits_with_a_warm_pool_and_an_empty_one():
    torch_convbp.release_scratch()
    cold = step(*CALLS[1][1:])
    warm = step(*CALLS[1][1:])
    for a, b in zip(cold, warm):
        assert torch.equal(a, b)
