"""The CUDA kernels' arithmetic, run on the CPU, no GPU needed.

Each CUDA kernel is a thin loop over host-and-device functions (csrc/cuda/*_thread.h). The harness
(tests/cuda_harness/harness.cpp, built here with the host compiler) runs those functions for every
(block, thread) of the launch grid, in 32-bit and in 64-bit indices, and the results must equal
the CPU kernels' bit for bit: the same index decomposition, bounds, summation order and dtype
conversions as the GPU will run. The launch arithmetic is checked at the 2^31 boundary."""
import math
import os

import pytest
import torch
from torch.utils import cpp_extension

import torch_convbp  # noqa: F401  (the CPU kernels to compare with)
from torch_convbp._build_flags import shared_libstdcxx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ops = torch.ops.torch_convbp
INT32_MAX = 2**31 - 1
HALF_TYPES = (torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """Builds the harness with the host compiler (about a minute) and returns its operators."""
    build = tmp_path_factory.mktemp("cuda_harness")
    cpp_extension.load(
        name="torch_convbp_cuda_harness",
        sources=[os.path.join(ROOT, "tests", "cuda_harness", "harness.cpp"), os.path.join(ROOT, "csrc", "checks.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc")],
        extra_cflags=["-O1"],
        extra_ldflags=shared_libstdcxx(),
        build_directory=str(build),
        is_python_module=False,
    )
    return torch.ops.torch_convbp_cuda_harness


def assert_bitwise_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16}[actual.element_size()]
    mismatched = (actual.view(as_int) != expected.view(as_int)).sum().item()
    assert mismatched == 0, f"{mismatched} of {actual.numel()} entries differ in their bits"


def randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# (name, images [N, C, H, W] or [N, C, D, H, W], kernel, stride, padding, dilation, output rows:
# None = all, else (start, count); for volumes a row is one row of one depth slice)
COLUMN_CASES = [
    ("whole-images-3x3", (2, 3, 7, 6), (3, 3), (1, 1), (1, 1), (1, 1), None),
    ("row-band", (2, 3, 9, 8), (3, 3), (1, 1), (1, 1), (1, 1), (3, 4)),
    ("last-row", (1, 2, 9, 8), (3, 2), (2, 1), (1, 0), (1, 1), (4, 1)),
    ("strided-asymmetric", (2, 4, 11, 9), (3, 2), (2, 3), (1, 0), (1, 2), None),
    ("dilated-band", (1, 2, 13, 12), (3, 3), (1, 2), (2, 2), (2, 3), (2, 5)),
    ("padding-past-reach", (2, 2, 3, 4), (2, 2), (1, 1), (3, 3), (1, 1), None),
    ("padding-only-band", (1, 2, 3, 4), (2, 2), (1, 1), (3, 3), (1, 1), (0, 2)),
    ("stride-larger-than-kernel", (2, 2, 10, 10), (2, 2), (3, 3), (0, 0), (1, 1), None),
    ("pointwise-strided", (3, 5, 7, 6), (1, 1), (2, 2), (0, 0), (1, 1), None),
    ("wide-rows", (1, 1, 3, 300), (1, 3), (1, 1), (0, 1), (1, 1), None),
    ("volumes-3x3x3", (2, 2, 4, 5, 4), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), None),
    ("volumes-strided-asymmetric", (2, 4, 7, 6, 9), (3, 2, 3), (2, 1, 3), (1, 0, 2), (1, 2, 1), None),
    ("volumes-band-across-slices", (1, 2, 5, 6, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (4, 7)),
    ("volumes-band-within-a-slice", (1, 2, 5, 6, 5), (2, 3, 3), (2, 1, 1), (0, 1, 1), (2, 1, 1), (1, 3)),
    ("volumes-depth-padding-past-reach", (1, 2, 2, 3, 3), (2, 2, 2), (1, 1, 1), (3, 1, 0), (1, 1, 1), None),
    ("volumes-pointwise-strided", (2, 4, 3, 5, 6), (1, 1, 1), (1, 2, 2), (0, 0, 0), (1, 1, 1), None),
]
# (images dtype, columns dtype): each type with itself, and half images with float32 columns
COLUMN_TYPES = [(torch.float64,) * 2, (torch.float32,) * 2, (torch.float16,) * 2, (torch.bfloat16,) * 2,
                (torch.float16, torch.float32), (torch.bfloat16, torch.float32)]


def column_geometry(images, kernel, stride, padding, dilation, rows):
    """The band of output rows ((start, count); a volume's rows are its depth slices' rows, one
    after another) and the NCHW column matrix's [rows, pixels]."""
    n, c, *spatial = images
    out = [(s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, t, p, d in zip(spatial, kernel, stride, padding, dilation)]
    row_start, count = rows or (0, math.prod(out[:-1]))
    return (row_start, count), (c * math.prod(kernel), n * count * out[-1])


@pytest.mark.parametrize("index_bits", [32, 64])
@pytest.mark.parametrize("image_dtype, column_dtype", COLUMN_TYPES, ids=lambda t: str(t).replace("torch.", ""))
@pytest.mark.parametrize("name, images, kernel, stride, padding, dilation, rows", COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_im2col_and_col2im_threads_match_the_cpu_bitwise(
    harness, name, images, kernel, stride, padding, dilation, rows, image_dtype, column_dtype, index_bits
):
    band, column_shape = column_geometry(images, kernel, stride, padding, dilation, rows)
    geometry = (kernel, stride, padding, dilation, *band)
    x = randn(*images, dtype=image_dtype, seed=0)

    expected, actual = (torch.full(column_shape, float("nan"), dtype=column_dtype) for _ in range(2))
    ops.im2col(x, *geometry, expected)
    harness.im2col(x, *geometry, index_bits, actual)
    assert_bitwise_equal(actual, expected)

    columns = randn(*column_shape, dtype=column_dtype, seed=1)
    start = randn(*images, dtype=image_dtype, seed=2)  # col2im adds into the images
    expected, actual = start.clone(), start.clone()
    ops.col2im(columns, *geometry, expected)
    harness.col2im(columns, *geometry, index_bits, actual)
    assert_bitwise_equal(actual, expected)


def nhwc_column_shape(images, kernel, rows, groups):
    """The NHWC column matrix [G, P, taps*C/G] (csrc/conv2d.h)."""
    (column_rows, pixels) = rows
    return (groups, pixels, column_rows // groups)


@pytest.mark.parametrize("index_bits", [32, 64])
@pytest.mark.parametrize("image_dtype, column_dtype", COLUMN_TYPES, ids=lambda t: str(t).replace("torch.", ""))
@pytest.mark.parametrize("name, images, kernel, stride, padding, dilation, rows", COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_nhwc_im2col_and_col2im_threads_match_the_cpu_bitwise(
    harness, name, images, kernel, stride, padding, dilation, rows, image_dtype, column_dtype, index_bits
):
    """The NHWC kernels (one thread per channel of a pixel) against the CPU's NHWC kernels, with
    several groups where the channels allow (2 for an even count, else one per channel)."""
    channels = images[1]
    groups = 2 if channels % 2 == 0 else channels
    band, nchw_shape = column_geometry(images, kernel, stride, padding, dilation, rows)
    column_shape = nhwc_column_shape(images, kernel, nchw_shape, groups)
    geometry = (kernel, stride, padding, dilation, *band)
    channels_last = torch.channels_last_3d if len(images) == 5 else torch.channels_last
    x = randn(*images, dtype=image_dtype, seed=0).contiguous(memory_format=channels_last)

    expected, actual = (torch.full(column_shape, float("nan"), dtype=column_dtype) for _ in range(2))
    ops.im2col_nhwc(x, *geometry, expected)
    harness.im2col_nhwc(x, *geometry, index_bits, actual)
    assert_bitwise_equal(actual, expected)

    columns = randn(*column_shape, dtype=column_dtype, seed=1)
    start = randn(*images, dtype=image_dtype, seed=2).contiguous(memory_format=channels_last)
    expected, actual = start.clone(), start.clone()
    ops.col2im_nhwc(columns, *geometry, expected)
    harness.col2im_nhwc(columns, *geometry, index_bits, actual)
    assert_bitwise_equal(actual, expected)


# (name, input [N, C, H, W], multiplier, kernel, stride, padding, dilation)
DEPTHWISE_CASES = [
    ("3x3", (2, 3, 9, 8), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("multiplier-asymmetric", (2, 3, 9, 8), 2, (3, 2), (2, 1), (0, 2), (2, 1)),
    ("strided-wide", (1, 2, 5, 11), 1, (2, 3), (1, 3), (1, 1), (1, 1)),
    ("padding-past-reach", (1, 2, 3, 4), 1, (2, 2), (1, 1), (3, 3), (1, 1)),
    ("many-positions", (3, 2, 20, 21), 1, (5, 5), (1, 1), (2, 2), (1, 1)),  # lanes wrap often
    ("rows-wider-than-the-lanes", (1, 1, 3, 600), 3, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("fewer-positions-than-lanes", (1, 4, 2, 3), 1, (2, 2), (1, 1), (0, 0), (1, 1)),
    ("planes-smaller-than-the-lanes", (70, 2, 3, 4), 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # a lane's step crosses images
    ("one-pixel-planes", (300, 2, 1, 1), 1, (1, 1), (1, 1), (0, 0), (1, 1)),
    # the input gradient's taps stepped without division: dilation over the stride, and under it
    ("dilation-over-the-stride", (2, 3, 17, 19), 2, (3, 4), (2, 3), (3, 4), (3, 5)),
    ("stride-3-dilation-2", (1, 2, 16, 14), 1, (4, 3), (3, 3), (2, 1), (2, 2)),
    ("batch-zero", (0, 2, 5, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("several-lane-slices", (1, 210, 3, 3), 1, (9, 9), (1, 1), (4, 4), (1, 1)),  # NHWC weight grad: 2 slices
    # the NHWC kernels' blocks of 16 channels, and a tail
    ("a-block-and-a-tail-3x3", (2, 19, 23, 17), 1, (3, 3), (1, 2), (1, 1), (1, 1)),
    ("a-block-and-a-tail-5x5", (1, 17, 12, 30), 1, (5, 5), (2, 1), (3, 2), (2, 1)),
    # two blocks and a tail, along rows whose inner pixels share their terms by residue of the
    # stride (3 residues in the input gradient)
    ("two-blocks-and-a-tail-every-residue", (1, 40, 5, 34), 1, (3, 3), (1, 3), (1, 1), (1, 1)),
    # the strip kernels (3x3, 5x5 and 7x7 at compile time): interior elements read at constant
    # steps, borders, dilated windows, windows wider than the plane (no interior), strips with
    # tails (heights not a multiple of 4)
    ("strips-7x7", (2, 3, 13, 15), 1, (7, 7), (1, 1), (3, 3), (1, 1)),
    ("strips-7x7-multiplier-strided", (1, 2, 16, 17), 2, (7, 7), (2, 1), (3, 2), (1, 1)),
    ("strips-3x3-dilated", (2, 3, 14, 13), 1, (3, 3), (1, 1), (2, 3), (2, 3)),
    ("strips-5x5-dilated-multiplier", (1, 2, 19, 18), 3, (5, 5), (1, 1), (4, 0), (2, 1)),
    ("strips-5x5-wider-than-the-plane", (2, 2, 4, 3), 1, (5, 5), (1, 1), (2, 2), (1, 1)),
    ("non-square-kernel", (2, 3, 10, 9), 1, (3, 5), (1, 1), (1, 2), (1, 1)),
]


@pytest.mark.parametrize("index_bits", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE_CASES, ids=[c[0] for c in DEPTHWISE_CASES])
def test_depthwise_threads_match_the_cpu_bitwise(
    harness, monkeypatch, name, shape, multiplier, kernel, stride, padding, dilation, layout, dtype, index_bits
):
    """In both layouts of the activations: the CUDA threads index NHWC memory through the same
    functions, and the CPU has separate NHWC kernels (cpu/depthwise_nhwc_cpu.cpp). The weight gradient against the
    CPU's kernels in the CUDA kernels' order of lanes (the CPU's default, the order of rows, is its
    own: summation.h)."""
    monkeypatch.setenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", "lanes")
    n, c, h, w = shape
    x = randn(*shape, dtype=dtype, seed=0).contiguous(memory_format=layout)
    weight = randn(c * multiplier, 1, *kernel, dtype=dtype, seed=1)
    args = (stride, padding, dilation)
    out_shape = torch.nn.functional.conv2d(x.double(), weight.double(), None, *args, c).shape
    dy = randn(*out_shape, dtype=dtype, seed=2).contiguous(memory_format=layout)
    empty = lambda size: torch.empty(size, dtype=dtype, memory_format=layout)
    for op, a, b, result in (
        ("depthwise_conv2d", x, weight, empty(out_shape)),
        ("depthwise_input_grad", dy, weight, empty(shape)),
        ("depthwise_weight_grad", x, dy, torch.empty_like(weight)),
    ):
        expected, actual = result.fill_(float("nan")), result.clone()
        getattr(ops, op)(a, b, *args, expected)
        getattr(harness, op)(a, b, *args, index_bits, actual)
        assert_bitwise_equal(actual, expected)


# (name, input [N, C, H, W], out channels, kernel, stride, padding, dilation, groups): the direct
# grouped kernel, whose CPU version sums blocks of pixels x vectors of channels in registers
# (cpu/grouped_forward_cpu.cpp): channels per group that fill no vector, half of one (summed
# across the groups), part of one, several, and more than one slice of 2 vectors; rows with whole
# blocks, tails and edge columns.
GROUPED_CASES = [
    ("resnext-like 4 per group", (2, 16, 9, 10), 16, (3, 3), (1, 1), (1, 1), (1, 1), 4),
    # half a vector per group (4 floats, 2 doubles): summed two groups a vector, an odd count too
    ("three groups of 4, strided", (2, 12, 9, 11), 12, (3, 3), (2, 1), (1, 1), (1, 1), 3),
    ("three groups of 2", (2, 6, 7, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 3),
    # rows so wide that the weight gradient across the groups spreads a band of one row at a time,
    # carrying partial sums from band to band: groups of 4 (floats) and of 2 (doubles)
    ("4 per group, wide rows", (1, 8, 5, 300), 8, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("2 per group, wide rows", (2, 4, 4, 600), 4, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    # the AVX-512 blocks (12 pixels, 12 or 16 input channels) leave up to 11 for blocks of 4, 2, 1
    ("16 per group from 24, 10 inner columns", (1, 48, 5, 12), 32, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("8 per group from 28, 10 inner columns", (1, 56, 4, 12), 16, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("16 per group, wide rows", (1, 32, 4, 30), 32, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("12 per group (a part-vector)", (2, 24, 6, 13), 24, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("40 per group (two slices)", (1, 20, 5, 14), 80, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("one output channel per group", (2, 12, 7, 9), 4, (3, 3), (1, 1), (1, 1), (1, 1), 4),
    ("asymmetric everything", (2, 6, 11, 12), 9, (3, 2), (2, 1), (1, 2), (2, 3), 3),
    ("padding past the reach", (1, 8, 3, 4), 8, (2, 2), (1, 1), (3, 3), (1, 1), 2),
    ("stride larger than the kernel", (2, 8, 10, 11), 4, (2, 2), (3, 3), (0, 0), (1, 1), 2),
    ("batch zero", (0, 8, 5, 5), 8, (3, 3), (1, 1), (1, 1), (1, 1), 4),
]


@pytest.mark.parametrize("index_bits", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "name, shape, out_channels, kernel, stride, padding, dilation, groups", GROUPED_CASES, ids=[c[0] for c in GROUPED_CASES]
)
def test_grouped_threads_match_the_cpu_bitwise(
    harness, name, shape, out_channels, kernel, stride, padding, dilation, groups, dtype, index_bits
):
    x = randn(*shape, dtype=dtype, seed=0).contiguous(memory_format=torch.channels_last)
    weight = randn(out_channels, shape[1] // groups, *kernel, dtype=dtype, seed=1)
    args = (stride, padding, dilation, groups)
    out_shape = torch.nn.functional.conv2d(x.double(), weight.double(), None, *args).shape
    expected = torch.full(out_shape, float("nan"), dtype=dtype).contiguous(memory_format=torch.channels_last)
    actual = expected.clone()
    ops.grouped_conv2d(x, weight, *args, expected)
    harness.grouped_conv2d(x, weight, *args, index_bits, actual)
    assert_bitwise_equal(actual, expected)


@pytest.mark.parametrize("index_bits", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "name, shape, out_channels, kernel, stride, padding, dilation, groups", GROUPED_CASES, ids=[c[0] for c in GROUPED_CASES]
)
def test_grouped_weight_grad_threads_match_the_cpu_bitwise(
    harness, name, shape, out_channels, kernel, stride, padding, dilation, groups, dtype, index_bits
):
    x = randn(*shape, dtype=dtype, seed=0).contiguous(memory_format=torch.channels_last)
    weight_shape = (out_channels, shape[1] // groups, *kernel)
    args = (stride, padding, dilation, groups)
    out_shape = torch.nn.functional.conv2d(x.double(), torch.zeros(weight_shape, dtype=torch.float64), None, *args).shape
    dy = randn(*out_shape, dtype=dtype, seed=1).contiguous(memory_format=torch.channels_last)
    expected = torch.full(weight_shape, float("nan"), dtype=dtype)
    actual = expected.clone()
    ops.grouped_weight_grad(x, dy, *args, expected)
    harness.grouped_weight_grad(x, dy, *args, index_bits, actual)
    assert_bitwise_equal(actual, expected)


def test_grouped_weight_grad_in_several_passes(harness):
    """A weight gradient of more entries than a pass's buffer holds (2^22) takes one image per
    pass; the totals carried from pass to pass in float32 give the CPU kernel's bits."""
    assert harness.images_per_pass(18 * 9 * 64, 8) == 8
    assert harness.images_per_pass(2**22 // 3, 100) == 3
    assert harness.images_per_pass(2**22 + 1, 5) == 1
    x = randn(3, 2048, 1, 1, dtype=torch.float32, seed=0).contiguous(memory_format=torch.channels_last)
    dy = randn(3, 4096, 1, 1, dtype=torch.float32, seed=1).contiguous(memory_format=torch.channels_last)
    expected = torch.empty(4096, 1024, 1, 1)
    actual = torch.empty_like(expected)
    ops.grouped_weight_grad(x, dy, (1, 1), (0, 0), (1, 1), 2, expected)
    harness.grouped_weight_grad(x, dy, (1, 1), (0, 0), (1, 1), 2, 32, actual)
    assert_bitwise_equal(actual, expected)


def test_the_harness_refuses_what_the_kernels_refuse(harness):
    """The harness goes through the same checks (csrc/checks.cpp) as the operators."""
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match="expected a column matrix of"):
        harness.im2col(x, (3, 3), (1, 1), (0, 0), (1, 1), 0, 2, 32, torch.empty(3))
    with pytest.raises(RuntimeError, match="expected dense channels_last images"):
        harness.im2col_nhwc(x, (3, 3), (1, 1), (0, 0), (1, 1), 0, 2, 32, torch.empty(1, 4, 18))
    with pytest.raises(RuntimeError, match="index_bits must be 32 or 64"):
        harness.im2col(x, (3, 3), (1, 1), (0, 0), (1, 1), 0, 2, 16, torch.empty(2 * 9, 4))


def test_block_counts(harness):
    threads, max_blocks, lanes = harness.launch_constants()
    assert threads == lanes == 256  # the weight-gradient kernel has one thread per lane
    assert [harness.blocks_for(n) for n in (0, 1, threads, threads + 1)] == [1, 1, 1, 2]
    assert harness.blocks_for(max_blocks * threads) == max_blocks
    assert harness.blocks_for(2**40) == max_blocks  # a grid-stride loop covers the rest
    assert [harness.blocks_per_item(n) for n in (0, 1, 1000, 2**40)] == [1, 1, 1000, max_blocks]


def test_32_bit_indices_stop_where_the_last_grid_step_would_overflow(harness):
    threads, max_blocks, _ = harness.launch_constants()
    largest = INT32_MAX - max_blocks * threads - 1  # the most elements a 32-bit kernel takes
    assert harness.fits_int32(largest) and not harness.fits_int32(largest + 1)
    assert not harness.fits_int32(2**31) and harness.fits_int32(0)
    # Every thread's last index plus one grid step still fits in int32.
    assert largest - 1 + harness.blocks_for(largest) * threads <= INT32_MAX


@pytest.mark.parametrize("total, index_bits", [(INT32_MAX - 2**28 - 1, 32), (2**31 + 5, 64), (2**33 + 3, 64), (1000, 32)])
def test_grid_stride_indices_at_the_2_to_the_31_boundary(harness, total, index_bits):
    """The indices each thread visits, computed in the kernel's index type, are exactly
    block * threads + thread + k * (grid size) below total: none skipped, none wrapped."""
    threads, _, _ = harness.launch_constants()
    blocks = harness.blocks_for(total)
    for block, thread in ((0, 0), (blocks - 1, threads - 1), (blocks // 2, 17), (blocks - 1, 0)):
        first = block * threads + thread
        expected = list(range(first, total, blocks * threads))
        assert harness.grid_indices(total, blocks, block, thread, index_bits) == expected


# Divisors of the depthwise element kernels' coordinates: small ones (channels, widths), powers of
# two and their neighbours (where the shift changes), planes, and the largest int32 values.
DIVISORS = [*range(1, 70), 96, 127, 128, 129, 3136, 12544, 2**16 - 1, 2**16, 2**16 + 1, 1_000_003,
            2**30 - 1, 2**30, 2**30 + 1, INT32_MAX - 1, INT32_MAX]


@pytest.mark.parametrize("divisor", DIVISORS)
def test_divisor_quotients_equal_integer_division(harness, divisor):
    """Divisor<int32_t> (csrc/cuda/divisor.h) divides every index 0 <= n < 2^31 by a multiplication
    and a shift: equal to the hardware's division at the multiples of the divisor and around them,
    at the top of the range, and at random indices."""
    multiples = torch.arange(0, INT32_MAX // divisor + 1, max(1, INT32_MAX // divisor // 5000), dtype=torch.int64) * divisor
    near = torch.cat([multiples - 1, multiples, multiples + 1])
    random = torch.randint(0, INT32_MAX, (20000,), generator=torch.Generator().manual_seed(divisor))
    top = torch.arange(INT32_MAX - 2000, INT32_MAX + 1)
    n = torch.cat([near, random, top, torch.arange(0, 5000)])
    n = n[(n >= 0) & (n <= INT32_MAX)].to(torch.int32)
    expected = (n.to(torch.int64) // divisor).to(torch.int32)
    assert torch.equal(harness.divisor_quotients(n, divisor), expected)


def test_divisor_refuses_zero(harness):
    with pytest.raises(RuntimeError, match="divisor must be in"):
        harness.divisor_quotients(torch.arange(4, dtype=torch.int32), 0)
