"""The transposing copy, target[b, j, i] = source[b, i, j]: how an operand or a result changes
between NCHW and channels_last inside the operators (csrc/layout.cpp). A copy moves bits: every
dtype, every size around the kernel's tiles (64 source rows by 32 columns) and its squares of
registers, views with gaps between rows, and the operators' results through it are bitwise those
of the operands already in the route's layout."""
import pytest
import torch
from torch.library import opcheck

import torch_convbp

ops = torch.ops.torch_convbp

# [B, R, C]: smaller than a tile, a tile's edge, across tile edges, one long and one short side;
# whole squares of registers (8 x 8 16-bit elements, 4 x 4 of 32 bits, 2 x 2 of 64) with and
# without edges beside them
SIZES = [(1, 1, 1), (2, 5, 7), (1, 32, 32), (1, 64, 32), (3, 33, 65), (2, 65, 33), (1, 129, 31),
         (2, 3, 500), (2, 500, 3), (1, 64, 1000),
         (1, 8, 8), (2, 9, 17), (1, 16, 40), (1, 7, 24)]
DTYPES = [torch.bool, torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.float64, torch.int64]


def filled(size, dtype, device="cpu"):
    values = torch.randn(size, device=device) * 100
    return (values > 0) if dtype == torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_copies_every_element_to_its_transposed_place(size, dtype, device):
    source = filled(size, dtype, device)
    target = torch.empty(size[0], size[2], size[1], dtype=dtype, device=device)
    ops.transpose_copy(source, target)
    assert torch.equal(target, source.transpose(1, 2))


@pytest.mark.parametrize("size", [(2, 33, 40), (3, 70, 5)], ids=str)
def test_views_with_gaps_between_rows_and_matrices(size, device):
    """Rows and matrices need not be packed: only each row's elements must be adjacent."""
    b, r, c = size
    source = torch.randn(b + 1, r + 3, c + 5, device=device)[1:, 2 : r + 2, 3 : c + 3]
    target_memory = torch.full((b, c + 2, r + 7), float("nan"), device=device)
    target = target_memory[:, 1 : c + 1, 4 : r + 4]
    ops.transpose_copy(source, target)
    assert torch.equal(target, source.transpose(1, 2))
    untouched = target_memory.clone()
    untouched[:, 1 : c + 1, 4 : r + 4] = float("nan")
    assert untouched.isnan().all()  # nothing written outside the view


def test_opcheck(device):
    source = torch.randn(2, 40, 33, device=device)
    opcheck(ops.transpose_copy.default, (source, torch.empty(2, 33, 40, device=device)))


@pytest.mark.parametrize(
    "source, target, match",
    [
        (torch.randn(2, 4, 5), torch.empty(2, 4, 5), r"expected a target of size \[2, 5, 4\]"),
        (torch.randn(4, 5), torch.empty(5, 4), r"expected a 3-D source \[B, R, C\]"),
        (torch.randn(2, 4, 5), torch.empty(2, 5, 4, dtype=torch.float64), "must have the same dtype"),
        (torch.randn(2, 5, 4).transpose(1, 2), torch.empty(2, 5, 4), "source's rows contiguous"),
        (torch.randn(2, 4, 5), torch.empty(2, 4, 5).transpose(1, 2), "target's rows contiguous"),
        (torch.randn(2, 4, 5, dtype=torch.complex128), torch.empty(2, 5, 4, dtype=torch.complex128), "elements of 16 bytes"),
    ],
    ids=["target-size", "rank", "dtype", "source-rows", "target-rows", "16-byte-elements"],
)
def test_the_kernel_and_its_fake_refuse_alike(source, target, match):
    for device in ("cpu", "meta"):
        with pytest.raises(RuntimeError, match=match):
            ops.transpose_copy(source.to(device), target.to(device))


def test_an_expanded_target_is_refused_by_the_kernel_and_its_fake():
    for device in ("cpu", "meta"):
        target = torch.empty(2, 1, 4, device=device).expand(2, 5, 4)  # one row, seen five times
        with pytest.raises(RuntimeError, match="the target has elements that share memory"):
            ops.transpose_copy(torch.randn(2, 4, 5, device=device), target)


def test_a_target_sharing_the_sources_memory_is_refused():
    memory = torch.randn(2, 6, 6)
    for source, target in ((memory, memory),  # a transposition in place would read what it wrote
                           (memory[:, :, :3], memory[:, :3, :])):  # a part of one in the other
        with pytest.raises(RuntimeError, match="the source and the target share memory"):
            ops.transpose_copy(source, target)


# Calls whose route computes in NCHW although the operands are channels_last, so that the operands
# and the results take the transposing copy: (input size, weight size, groups, stride). The
# depthwise volume is bfloat16 (in float32 and float64 the CPU's depthwise kernels of volumes
# compute it in its own format: csrc/route.cpp), and strided in depth.
THROUGH_COPIES = {
    "depthwise-volume": ((2, 32, 4, 9, 8), (32, 1, 3, 3, 3), 32, (2, 1, 1)),
    "narrow-groups-volume": ((2, 48, 3, 8, 7), (48, 4, 3, 3, 3), 12, (1, 2, 2)),
    "narrow-groups-strided-image": ((3, 64, 11, 13), (320, 8, 3, 3), 8, 2),
}


THROUGH_COPIES_CASES = [(call, dtype) for call in THROUGH_COPIES for dtype in (torch.float32, torch.bfloat16, torch.float64)
                        if call != "depthwise-volume" or dtype == torch.bfloat16]


@pytest.mark.parametrize("call, dtype", THROUGH_COPIES_CASES, ids=[f"{c}-{d}" for c, d in THROUGH_COPIES_CASES])
def test_channels_last_operands_give_the_bits_of_contiguous_ones(call, dtype):
    """A route that computes in NCHW copies channels_last operands in and its results back: the
    output and the gradients are bitwise those of the same call fed contiguous operands."""
    input_size, weight_size, groups, stride = THROUGH_COPIES[call]
    conv = torch_convbp.conv3d if len(input_size) == 5 else torch_convbp.conv2d
    fmt = torch.channels_last_3d if len(input_size) == 5 else torch.channels_last
    g = torch.Generator().manual_seed(0)
    x = torch.randn(input_size, generator=g).to(dtype)
    w = torch.randn(weight_size, generator=g).to(dtype)
    routes = torch_convbp.explain(x.contiguous(memory_format=fmt), w, stride=stride, padding=1, groups=groups)
    assert all(routes[op].layout == "nchw" for op in ("forward", "input_grad", "weight_grad")), routes

    def run(memory_format):
        xs, ws = (t.contiguous(memory_format=memory_format).requires_grad_() for t in (x, w))
        y = conv(xs, ws, stride=stride, padding=1, groups=groups)
        return (y, *torch.autograd.grad(y, (xs, ws), torch.cos(y.double()).to(dtype)))

    plain, relaid = run(torch.contiguous_format), run(fmt)
    for name, a, b in zip(("output", "grad_input", "grad_weight"), plain, relaid):
        assert torch.equal(a, b), name
    assert all(t.is_contiguous(memory_format=fmt) for t in relaid[:2])  # copied back to the operands' format


# The weight's transposing copy, target[g, b, a, t] = source[g, a, b, t] (reverse_taps: the taps
# reversed): the input gradient's weight (csrc/conv2d.cpp, flipped_transposed_weight) and the
# implicit route's tap matrices. [G, A, B, taps]: a 3x3 and a 1x1 kernel, one channel, sizes
# across the 32 x 32 tiles and the squares of registers.
TAP_SIZES = [(1, 1, 1, 1), (2, 5, 7, 9), (1, 33, 40, 9), (3, 8, 1, 4), (1, 1, 70, 25), (2, 64, 48, 1)]


def target_in_order(size, order, dtype, device):
    """A [G, B, A, taps] target laid out in memory as [G] + `order` of (b, a, t)."""
    g, a, b, t = size
    logical = {"b": b, "a": a, "t": t}
    memory = torch.full([g] + [logical[d] for d in order], float("nan"), device=device).to(dtype)
    return memory.permute(0, *(1 + order.index(d) for d in "bat"))


@pytest.mark.parametrize("reverse_taps", [False, True], ids=["taps-kept", "taps-reversed"])
@pytest.mark.parametrize("order", ["bat", "bta", "tab", "tba", "abt"], ids=lambda o: "memory-" + o)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("size", TAP_SIZES, ids=str)
def test_the_weights_transposing_copy_writes_every_element_to_its_place(size, dtype, order, reverse_taps, device):
    source = filled(size, dtype, device)
    target = target_in_order(size, order, dtype, device)
    ops.transpose_taps(source, target, reverse_taps)
    expected = source.transpose(1, 2)
    assert torch.equal(target, expected.flip(3) if reverse_taps else expected)


def test_the_weights_transposing_copy_opcheck(device):
    source = torch.randn(2, 6, 5, 9, device=device)
    for reverse_taps in (False, True):
        opcheck(ops.transpose_taps.default, (source, torch.empty(2, 5, 6, 9, device=device), reverse_taps))


@pytest.mark.parametrize(
    "source, target, match",
    [
        (torch.randn(2, 4, 5, 3), torch.empty(2, 4, 5, 3), r"expected a target of size \[2, 5, 4, 3\]"),
        (torch.randn(4, 5, 3), torch.empty(5, 4, 3), r"expected a contiguous 4-D source \[G, A, B, taps\]"),
        (torch.randn(2, 5, 4, 3).transpose(1, 2), torch.empty(2, 5, 4, 3), "expected a contiguous 4-D source"),
        (torch.randn(2, 4, 5, 3), torch.empty(2, 5, 4, 3, dtype=torch.float64), "must have the same dtype"),
        (torch.randn(1, 2, 2, 1, dtype=torch.complex128), torch.empty(1, 2, 2, 1, dtype=torch.complex128), "elements of 16 bytes"),
    ],
    ids=["target-size", "rank", "source-strides", "dtype", "16-byte-elements"],
)
def test_the_weights_transposing_copy_and_its_fake_refuse_alike(source, target, match):
    for device in ("cpu", "meta"):
        with pytest.raises(RuntimeError, match=match):
            ops.transpose_taps(source.to(device), target.to(device), True)


def test_the_weights_transposing_copy_refuses_an_expanded_target_as_its_fake_does():
    for device in ("cpu", "meta"):
        target = torch.empty(2, 1, 4, 3, device=device).expand(2, 5, 4, 3)  # one row, seen five times
        with pytest.raises(RuntimeError, match="the target has elements that share memory"):
            ops.transpose_taps(torch.randn(2, 4, 5, 3, device=device), target, True)
