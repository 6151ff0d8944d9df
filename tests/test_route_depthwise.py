"""Route depthwise: one input channel per group (any channel multiplier) computes with the direct
depthwise kernels, in NCHW or, for channels_last operands, in NHWC (csrc/cpu/depthwise_nhwc_cpu.cpp,
cuda/depthwise_thread.h). Both layouts sum every entry in the same order, so they give bitwise
the same results, on both devices. On the CPU output planes under 256 pixels compute in NHWC for
NCHW operands too, a block of channels of one image at a time transposed in cache. The weight gradient in the CPU's order of rows (its
default) is an NHWC kernel (csrc/cpu/depthwise_rows_cpu.cpp), which takes NCHW operands a band of
rows at a time, transposed in cache; TORCH_CONVBP_CPU_DEPTHWISE_ORDER=lanes gives the CPU the
CUDA kernels' order, and their bits. A depthwise volume's operators on the CPU (float32, float64) are the
kernels of volumes: the NHWC ones with a depth (the weight gradient in the order of rows only), NCDHW
operands a block of channels, or of rows, at a time transposed in cache."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from family_cases import tapwise_convolution
from route_cases import CL, assert_formats, assert_matches_the_references

ops = torch.ops.torch_convbp

# (name, input [N, C, H, W], multiplier, kernel, stride, padding, dilation)
DEPTHWISE = [
    ("3x3", (2, 8, 9, 7), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("asymmetric, multiplier 2", (2, 3, 9, 8), 2, (3, 2), (2, 1), (0, 2), (2, 1)),
    ("5x5 stride 2", (3, 16, 12, 11), 1, (5, 5), (2, 2), (2, 2), (1, 1)),
    ("more positions than lanes", (1, 24, 5, 70), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("batch of one, 1x1 kernel", (1, 40, 4, 4), 1, (1, 1), (1, 1), (0, 0), (1, 1)),
    # NCHW operands of small planes in blocks of 64 channels of one image (csrc/cpu/depthwise_nhwc_cpu.cpp):
    # several blocks, the last one partial, with and without a multiplier
    ("blocks of channels, the last one partial", (2, 72, 6, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("blocks of channels, multiplier 2, strided", (3, 70, 9, 8), 2, (3, 3), (2, 2), (1, 1), (1, 1)),
    # and, in float32, bfloat16 and float16, larger planes that the planes of vectors do not take
    # (here 5x5): blocks of fewer channels (32 here: a block's bands within about 300 KiB), the
    # last one partial
    ("5x5 large planes, blocks of 32 channels", (1, 40, 30, 30), 1, (5, 5), (1, 1), (2, 2), (1, 1)),
    # output planes of 256 pixels or more: on the CPU, NCHW operands take the NCHW kernels (smaller
    # planes, and float32 ones the planes of vectors do not take, the NHWC ones), so these compare
    # the two sets of kernels
    ("large planes", (2, 8, 20, 20), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("large planes, multiplier 2, stride 2", (2, 6, 33, 34), 2, (3, 3), (2, 2), (1, 1), (1, 1)),
    # rows whose inner pixels share their terms (one list per residue of the stride), and rows
    # with no inner pixel at all
    ("wide rows, strided and dilated along them", (1, 18, 14, 40), 1, (3, 3), (1, 2), (1, 3), (1, 2)),
    ("stride 3, multiplier 2, wide rows", (1, 8, 24, 50), 2, (3, 4), (1, 3), (1, 2), (1, 1)),
    ("rows narrower than the kernel's reach", (2, 16, 60, 3), 1, (3, 5), (1, 1), (1, 3), (1, 1)),
    # inner pixels summed four side by side, in full blocks of 16 channels and in a partial one
    # (and, with a multiplier, the input gradient's channels a step apart, pixel by pixel)
    ("four pixels side by side", (2, 37, 17, 22), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("four pixels side by side, multiplier 2", (1, 16, 16, 23), 2, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("four pixels side by side, rows wholly in the padding", (1, 16, 9, 24), 1, (3, 3), (1, 1), (4, 1), (1, 1)),
    # 3x3 planes of 256 pixels or more, stride 1 along the rows: float32 NCHW calls sum each pixel
    # in vector registers (csrc/cpu/depthwise_cpu.cpp, PlaneOfVectors), the last vector of a row
    # overlapping the one before, or one by one where a row's inner pixels fill no vector
    ("3x3 in vectors, dilated, the last vector overlapping", (2, 4, 18, 29), 1, (3, 3), (1, 1), (2, 2), (2, 2)),
    ("3x3 in vectors, rows strided, multiplier 2", (1, 3, 33, 17), 2, (3, 3), (2, 1), (1, 1), (1, 1)),
    ("3x3 unpadded, inner pixels in whole vectors", (1, 4, 18, 18), 1, (3, 3), (1, 1), (0, 0), (1, 1)),
    ("3x3, fewer inner pixels a row than a vector", (2, 4, 40, 9), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    # strided along the rows, at most 9 taps: the forward sums in vectors over the phases of the
    # input's rows, the input gradient phase by phase (csrc/cpu/depthwise_planes_cpu.cpp)
    ("3x3 stride 2 in phases, odd sizes", (2, 4, 37, 35), 1, (3, 3), (2, 2), (1, 1), (1, 1)),
    ("3x3 stride 3, dilated, in phases", (1, 3, 50, 53), 1, (3, 3), (3, 3), (2, 1), (2, 2)),
    ("1x3 strided along the rows only", (1, 2, 30, 41), 1, (1, 3), (1, 2), (0, 2), (1, 1)),
    ("2x2 stride 2 unpadded, the last row and column reached by no tap", (1, 2, 33, 33), 1, (2, 2), (2, 2), (0, 0), (1, 1)),
    # stride 2 along the rows: the phases split from the input's rows and put together into the
    # input gradient's two vectors at a time, the rest of a row one by one
    ("3x3 stride 2, rows of whole pairs of vectors", (1, 3, 31, 64), 1, (3, 3), (2, 2), (1, 1), (1, 1)),
    ("1x1 stride 2, the odd rows and columns reached by no tap", (1, 3, 40, 41), 1, (1, 1), (2, 2), (0, 0), (1, 1)),
    ("3x3 strided down the columns only", (2, 3, 40, 30), 1, (3, 3), (2, 1), (1, 1), (1, 1)),
    # 3x3 at stride 1, one output channel per input channel, channels in whole vectors: on AVX-512
    # the NHWC forward and input gradient sum a row's inner pixels in strips of 8, the nine weights
    # in registers (csrc/cpu/depthwise_strips_cpu.cpp), the row's other pixels as before; these
    # planes of 256 pixels or more compare them with the NCHW kernels
    ("3x3 in strips, a partial strip left", (2, 32, 16, 21), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("3x3 in strips, unpadded rows, padded columns", (1, 16, 18, 26), 1, (3, 3), (1, 1), (2, 0), (1, 1)),
    ("3x3 in strips, 48 channels, one strip a row", (1, 48, 12, 10), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("3x3 in strips, columns padded past the reach", (2, 32, 9, 30), 1, (3, 3), (1, 1), (0, 2), (1, 1)),
]

STRIPS = [d for d in DEPTHWISE if d[0].startswith("3x3 in strips")]



def sums_in_vectors(shape, multiplier, kernel, stride, padding, dilation):
    """Whether a case's float32 NCHW forward sums in vector registers on the CPU: a 3x3 kernel at
    stride 1 along the rows, or at most 9 taps strided along them; output planes of 256 pixels or
    more (smaller ones go to the NHWC kernels)."""
    out = [(size + 2 * p - d * (k - 1) - 1) // st + 1
           for size, k, st, p, d in zip(shape[2:], kernel, stride, padding, dilation)]
    taken = (tuple(kernel) == (3, 3) and stride[1] == 1) or (stride[1] > 1 and kernel[0] * kernel[1] <= 9)
    return taken and out[0] * out[1] >= 256


PLANES_OF_VECTORS = [d for d in DEPTHWISE if sums_in_vectors(*d[1:])]


def depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, device="cpu"):
    """x, weight and an output gradient of an image ([N, C, H, W]) or a volume ([N, C, D, H, W])."""
    c = shape[1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    weight = torch.randn(c * multiplier, 1, *kernel, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    conv = F.conv3d if len(shape) == 5 else F.conv2d
    out_shape = conv(x.double(), weight.double(), None, stride, padding, dilation, c).shape
    dy = torch.randn(*out_shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    return x, weight, dy


@pytest.mark.parametrize("order", ["rows", "lanes"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE, ids=[d[0] for d in DEPTHWISE])
def test_depthwise_in_nhwc_gives_the_nchw_bits(name, shape, multiplier, kernel, stride, padding, dilation, dtype, order,
                                               device, monkeypatch):
    """The NHWC depthwise kernels sum every entry in the NCHW kernels' order: the three operators
    give bitwise the same values in both formats, and channels_last results. On the CPU, NCHW
    calls with output planes of 256 pixels or more take the NCHW kernels (smaller ones the NHWC
    kernels, on blocks of channels transposed in cache), so those cases compare the two sets of
    kernels. Only the weight gradient in the order of lanes of small planes takes layout copies
    (to its NHWC kernel); every other NCHW call takes its operands as they are."""
    monkeypatch.setenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", order)
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, device)
    args = (list(stride), list(padding), list(dilation), shape[1])
    small_planes = dy.shape[2] * dy.shape[3] < 256 and device == "cpu"
    copies = small_planes and order == "lanes"
    layouts = {r.operator: r.layout for r in torch_convbp.explain(x, weight, *args, grad_output=dy)}
    assert layouts == {"forward": "nchw", "input_grad": "nchw", "weight_grad": "nhwc" if copies else "nchw"}
    nchw = (ops.conv2d(x, weight, None, *args), ops.conv2d_input_grad(dy, weight, list(shape), *args),
            ops.conv2d_weight_grad(x, dy, list(weight.shape), *args))
    x_cl, dy_cl = x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL)
    nhwc = (ops.conv2d(x_cl, weight, None, *args), ops.conv2d_input_grad(dy_cl, weight, list(shape), *args),
            ops.conv2d_weight_grad(x_cl, dy_cl, list(weight.shape), *args))
    assert {r.layout for r in torch_convbp.explain(x_cl, weight, *args, grad_output=dy_cl)} == {"nhwc"}
    for a, e in zip(nhwc, nchw):
        assert torch.equal(a, e)
    assert nhwc[0].is_contiguous(memory_format=CL) and nhwc[1].is_contiguous(memory_format=CL)
    if shape[2] * shape[3] > 1:  # not also contiguous
        assert not nhwc[0].is_contiguous() and not nhwc[1].is_contiguous()


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE, ids=[d[0] for d in DEPTHWISE])
def test_half_precision_depthwise_is_the_float32_sums_rounded_once(name, shape, multiplier, kernel, stride, padding,
                                                                    dilation, dtype, memory_format, device):
    """bfloat16 and float16 operands are converted to float32 exactly, summed in the float32
    kernels' order and each result rounded once: the three operators give bitwise the float32
    call on the same values, rounded as torch rounds. (The NHWC forward and input gradient, and
    NCHW ones of small planes, convert rows or bands of the operands first: benchmarks/NOTES.md,
    section 97.)"""
    if device != "cpu":
        pytest.skip("the CPU's kernels; the CUDA ones are compared with the CPU's in the harness")
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, device)
    x, dy = x.contiguous(memory_format=memory_format), dy.contiguous(memory_format=memory_format)
    args = (list(stride), list(padding), list(dilation), shape[1])

    def operators(x, weight, dy):
        return (ops.conv2d(x, weight, None, *args), ops.conv2d_input_grad(dy, weight, list(shape), *args),
                ops.conv2d_weight_grad(x, dy, list(weight.shape), *args))

    rounded = [r.to(dtype) for r in operators(x.float(), weight.float(), dy.float())]
    for ours, expected in zip(operators(x, weight, dy), rounded):
        assert ours.dtype == dtype and torch.equal(ours, expected)


@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE[:3], ids=[d[0] for d in DEPTHWISE[:3]])
def test_depthwise_values_and_gradients_of_any_order(name, shape, multiplier, kernel, stride, padding, dilation, device):
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, torch.float64, device)
    x, dy = x.contiguous(memory_format=CL).requires_grad_(), dy.contiguous(memory_format=CL)
    weight.requires_grad_()
    b = torch.randn(weight.shape[0], dtype=x.dtype, device=device, requires_grad=True)
    args = (stride, padding, dilation, shape[1])
    y = torch_convbp.conv2d(x, weight, b, *args)
    ours = (y, *torch.autograd.grad(y, (x, weight, b), dy))
    assert_formats(ours, assert_matches_the_references(ours, x, weight, b, dy, *args))
    small = (x[:1, :, :5, :6].detach().clone().requires_grad_(), weight)
    fn = lambda x, w: torch_convbp.conv2d(x, w, None, *args)
    assert torch.autograd.gradcheck(fn, small)
    assert torch.autograd.gradgradcheck(fn, small)


def test_the_depthwise_kernels_refuse_mixed_layouts(device):
    x, weight, dy = depthwise_operands((2, 4, 5, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1), torch.float32, device)
    out = torch.empty_like(dy)
    with pytest.raises(RuntimeError, match="both contiguous or both channels_last"):
        ops.depthwise_conv2d(x.contiguous(memory_format=CL), weight, [1, 1], [1, 1], [1, 1], out)
    with pytest.raises(RuntimeError, match="expected a contiguous weight"):
        ops.depthwise_conv2d(x, weight.transpose(2, 3), [1, 1], [1, 1], [1, 1], out)


# (name, input [N, C, D, H, W], multiplier, kernel, stride, padding, dilation): depthwise volumes,
# whose operators on the CPU (float32, float64) are the direct kernels of volumes: the forward's and
# input gradient's each value one sum over its terms in (kd, kh, kw) order (the input gradient's
# (o, kd, kh, kw)), the 2-D kernels' terms with a depth; the weight gradient in the order of rows,
# each row (n, od, oh) adding its 2-D sums over the input slices it reads
DEPTHWISE_VOLUMES = [
    ("ir-CSN's 3x3x3", (2, 16, 4, 10, 11), 1, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    ("multiplier 2, strided in depth, dilated", (1, 8, 7, 12, 10), 2, (3, 3, 3), (2, 2, 1), (1, 1, 0), (2, 1, 1)),
    ("asymmetric, padded past the reach in depth", (3, 5, 3, 9, 9), 1, (2, 3, 4), (1, 1, 2), (3, 0, 1), (1, 1, 1)),
    ("MViT's pooling, strided 4x4 in the plane", (2, 8, 4, 16, 15), 1, (3, 3, 3), (1, 4, 4), (1, 1, 1), (1, 1, 1)),
    ("four pixels side by side, a partial block of channels", (1, 37, 3, 5, 23), 1, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
]
CL3D = torch.channels_last_3d


@pytest.mark.parametrize("memory_format", [CL3D, torch.contiguous_format], ids=["channels_last_3d", "ncdhw"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE_VOLUMES,
                         ids=[v[0] for v in DEPTHWISE_VOLUMES])
def test_a_depthwise_volume_takes_the_kernels_of_volumes(name, shape, multiplier, kernel, stride, padding, dilation,
                                                         dtype, memory_format):
    """explain() names them for every operator, in the operands' layout (NCDHW ones a block of
    channels, or of rows, at a time transposed in cache); their results are the kernels', bit for
    bit, in the operands' format (the weight gradient's contiguous), and the kernels give the same
    bits from either layout; F.conv3d's values and gradients, the tap-by-tap definition's output
    and its adjoint (float64); opcheck of the operators and of the kernels."""
    x, weight, g = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype)
    x, g = x.contiguous(memory_format=memory_format), g.contiguous(memory_format=memory_format)
    args = (list(stride), list(padding), list(dilation), shape[1])
    y = ops.conv3d(x, weight, None, *args)
    assert y.is_contiguous(memory_format=memory_format)
    routes = torch_convbp.explain(x, weight, *args, grad_output=g)
    for operator in ("forward", "input_grad", "weight_grad"):
        layout = "nhwc" if memory_format == CL3D else "nchw"
        assert (routes[operator].route, routes[operator].layout) == ("depthwise", layout)
        assert routes[operator].reason.startswith("one input channel per group, a volume")
    dx = ops.conv3d_input_grad(g, weight, list(shape), *args)
    dw = ops.conv3d_weight_grad(x, g, list(weight.shape), *args)
    assert dx.is_contiguous(memory_format=memory_format) and dw.is_contiguous()
    direct_y, direct_dx, direct_dw = torch.empty_like(g), torch.empty_like(x), torch.empty_like(weight)
    ops.depthwise_conv3d(x, weight, *args[:3], direct_y)
    ops.depthwise_conv3d_input_grad(g, weight, *args[:3], direct_dx)
    ops.depthwise_conv3d_weight_grad(x, g, *args[:3], direct_dw)
    assert torch.equal(y, direct_y) and torch.equal(dx, direct_dx) and torch.equal(dw, direct_dw)
    other = torch.contiguous_format if memory_format == CL3D else CL3D
    x_other, g_other = x.contiguous(memory_format=other), g.contiguous(memory_format=other)
    other_y, other_dx, other_dw = torch.empty_like(g_other), torch.empty_like(x_other), torch.empty_like(weight)
    ops.depthwise_conv3d(x_other, weight, *args[:3], other_y)
    ops.depthwise_conv3d_input_grad(g_other, weight, *args[:3], other_dx)
    ops.depthwise_conv3d_weight_grad(x_other, g_other, *args[:3], other_dw)
    assert torch.equal(y, other_y) and torch.equal(dx, other_dx) and torch.equal(dw, other_dw)
    tolerance = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-4)
    x64, w64, g64 = x.double().requires_grad_(), weight.double().requires_grad_(), g.double()
    y_ref = F.conv3d(x64, w64, None, *args)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x64, w64), g64)
    torch.testing.assert_close(y.double(), y_ref, **tolerance)
    torch.testing.assert_close(dx.double(), dx_ref, **tolerance)
    torch.testing.assert_close(dw.double(), dw_ref, **tolerance)
    y_own = tapwise_convolution(x64.detach(), w64.detach(), None, *args)
    torch.testing.assert_close(y.double(), y_own, **tolerance)
    if dtype == torch.float64:  # <conv(x), g> = <x, input_grad(g)>
        torch.testing.assert_close((x64.detach() * dx).sum(), (y_own * g64).sum(), rtol=1e-12, atol=1e-12)
    opcheck(ops.conv3d.default, (x, weight, None, *args))
    opcheck(ops.conv3d_input_grad.default, (g, weight, list(shape), *args))
    opcheck(ops.depthwise_conv3d.default, (x, weight, *args[:3], direct_y))
    opcheck(ops.depthwise_conv3d_input_grad.default, (g, weight, *args[:3], direct_dx))
    opcheck(ops.conv3d_weight_grad.default, (x, g, list(weight.shape), *args))
    opcheck(ops.depthwise_conv3d_weight_grad.default, (x, g, *args[:3], direct_dw))


@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", DEPTHWISE_VOLUMES,
                         ids=[v[0] for v in DEPTHWISE_VOLUMES])
def test_the_weight_gradient_of_volumes_on_any_thread_count(name, shape, multiplier, kernel, stride, padding,
                                                            dilation):
    """The same bits on 1, 2 and 3 threads, from either layout: fed NCDHW a kernel deeper than one
    slice is cut into blocks of 16 channels (the last one partial), each volume's block transposed
    once, where there are as many blocks as threads (the 37 channels' three blocks on 1 and 3
    threads, 16 channels on 1), and every other call into groups of rows; neither cut changes an
    entry's order."""
    x, weight, g = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, torch.float32)
    runs = []
    threads = torch.get_num_threads()
    try:
        for n_threads, memory_format in ((1, torch.contiguous_format), (2, CL3D), (3, torch.contiguous_format)):
            torch.set_num_threads(n_threads)
            dw = torch.empty_like(weight)
            a, b = x.contiguous(memory_format=memory_format), g.contiguous(memory_format=memory_format)
            ops.depthwise_conv3d_weight_grad(a, b, list(stride), list(padding), list(dilation), dw)
            runs.append(dw)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(run, runs[0]) for run in runs[1:])


@pytest.mark.parametrize("multiplier", [1, 2])
def test_the_kernels_of_volumes_are_the_2d_kernels_with_a_depth(multiplier):
    """A kernel one slice deep: the volume kernels' result slices are the 2-D kernels' results of
    the operand slices, bit for bit (the same terms in the same order, float32); the weight
    gradient is the 2-D one (in the CPU's order of rows) of the volumes' slices as one batch of
    images (the same rows, in the same order and groups)."""
    geometry = ([1, 1, 1], [0, 1, 1], [1, 1, 1])
    x, weight, g = depthwise_operands((2, 24, 3, 9, 26), multiplier, (1, 3, 3), *geometry, torch.float32)
    x, g = x.contiguous(memory_format=CL3D), g.contiguous(memory_format=CL3D)
    y, dx = torch.empty_like(g), torch.empty_like(x)
    ops.depthwise_conv3d(x, weight, *geometry, y)
    ops.depthwise_conv3d_input_grad(g, weight, *geometry, dx)
    planar = ([1, 1], [1, 1], [1, 1])
    for n in range(2):
        for d in range(3):
            image, grad_image = (t[n : n + 1, :, d].contiguous(memory_format=CL) for t in (x, g))
            y_image, dx_image = torch.empty_like(grad_image), torch.empty_like(image)
            ops.depthwise_conv2d(image, weight[:, :, 0].contiguous(), *planar, y_image)
            ops.depthwise_input_grad(grad_image, weight[:, :, 0].contiguous(), *planar, dx_image)
            assert torch.equal(y[n : n + 1, :, d], y_image) and torch.equal(dx[n : n + 1, :, d], dx_image)
    dw, dw_images = torch.empty_like(weight), torch.empty_like(weight[:, :, 0])
    ops.depthwise_conv3d_weight_grad(x, g, *geometry, dw)
    images = [t.transpose(1, 2).reshape(-1, *t.shape[1:2], *t.shape[3:]).contiguous(memory_format=CL) for t in (x, g)]
    ops.depthwise_weight_grad(*images, *planar, dw_images)
    assert torch.equal(dw[:, :, 0], dw_images)


def test_a_depthwise_volume_of_no_volumes_and_its_gradients():
    x, weight, _ = depthwise_operands((0, 4, 3, 5, 5), 1, (3, 3, 3), 1, 1, 1, torch.float64)
    x.requires_grad_(), weight.requires_grad_()
    y = torch_convbp.conv3d(x, weight, None, 1, 1, 1, 4)
    assert y.shape == (0, 4, 3, 5, 5)
    dx, dw = torch.autograd.grad(y, (x, weight), torch.ones_like(y))
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros_like(weight))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda x, w, out: (x.contiguous(), w, out), "expected input and output both contiguous or both channels_last_3d"),
        (lambda x, w, out: (x, w.transpose(3, 4), out), "expected a contiguous weight"),
        (lambda x, w, out: (x.bfloat16(), w.bfloat16(), out.bfloat16()), "computes float32 and float64 only, got torch.bfloat16"),
        (lambda x, w, out: (x, w, out[:, :, :2]), r"expected output of size \[2, 4, 3, 5, 5\]"),
        (lambda x, w, out: (x[:, :, 0], w, out), r"expected a 5-D input \[N, C, D, H, W\]"),
        (lambda x, w, out: (x, w.double(), out), "must have the same dtype"),
    ],
    ids=["mixed layouts", "transposed weight", "bfloat16", "output size", "4-D input", "mixed dtypes"],
)
@pytest.mark.parametrize("kernel", ["depthwise_conv3d", "depthwise_conv3d_input_grad", "depthwise_conv3d_weight_grad"])
def test_the_kernels_of_volumes_and_their_fakes_refuse_bad_arguments(change, match, kernel):
    """The input gradient's checks are the forward's with grad_input as the input and grad_output
    as the output, the weight gradient's with grad_weight as the weight."""
    for device in ("cpu", "meta"):
        x = torch.randn(2, 4, 3, 5, 5, device=device).contiguous(memory_format=CL3D)
        w = torch.randn(4, 1, 3, 3, 3, device=device)
        out = torch.empty(2, 4, 3, 5, 5, device=device).contiguous(memory_format=CL3D)
        x, w, out = change(x, w, out)
        with pytest.raises(RuntimeError, match=match):
            if kernel == "depthwise_conv3d":
                ops.depthwise_conv3d(x, w, [1, 1, 1], [1, 1, 1], [1, 1, 1], out)
            elif kernel == "depthwise_conv3d_input_grad":
                ops.depthwise_conv3d_input_grad(out, w, [1, 1, 1], [1, 1, 1], [1, 1, 1], x)
            else:
                ops.depthwise_conv3d_weight_grad(x, out, [1, 1, 1], [1, 1, 1], [1, 1, 1], w)


# The CPU's weight gradient in the order of rows (csrc/cpu/depthwise_rows_cpu.cpp): with one
# output channel per input channel, a 3x3 kernel's taps all at once in two vectors of channels
# (then one; on AVX-512, at stride 1 undilated along the rows, one vector at a time, each kernel
# row's three input vectors a window slid along the row), any other kernel a tap at a time in four
# vectors (then one), the rest of the
# channels and any channel multiplier channel by channel; the groups of rows fixed by their number
# (16 at most). NCHW operands: each group's rows of dy, and the input rows they read, transposed to
# NHWC bands in cache, image by image (a group may hold the end of one image and the start of the
# next).
ROWS = [
    ("7x7, four vectors, one and a tail", (2, 88, 9, 10), 1, (7, 7), (1, 1), (3, 3), (1, 1)),
    ("1x1, four vectors", (2, 64, 5, 6), 1, (1, 1), (1, 1), (0, 0), (1, 1)),
    ("3x3, two vectors and a tail", (2, 57, 9, 11), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("5x5 strided, one vector and a tail", (3, 21, 12, 10), 1, (5, 5), (2, 2), (2, 2), (1, 1)),
    ("3x3 dilated, padding past the reach", (1, 32, 7, 6), 1, (3, 3), (1, 2), (3, 4), (2, 2)),
    ("more rows than groups", (5, 16, 13, 4), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("other kernel, multiplier 3", (2, 5, 8, 9), 3, (2, 4), (1, 2), (1, 0), (1, 1)),
    ("one row", (1, 48, 1, 30), 1, (1, 3), (1, 1), (0, 1), (1, 1)),
    ("rows strided by 3 and dilated", (2, 9, 61, 16), 1, (3, 3), (3, 1), (2, 1), (2, 1)),
    ("groups of 21 rows, one across images", (2, 3, 481, 4), 1, (3, 3), (3, 1), (2, 1), (2, 1)),
    ("1x5, kernel rows past the padding, groups across images", (3, 10, 19, 15), 1, (1, 5), (1, 1), (3, 2), (1, 1)),
    ("2x4 a tap at a time, rows strided by 2 only", (3, 7, 40, 30), 1, (2, 4), (2, 1), (1, 1), (1, 1)),
    ("5x5, large planes", (2, 8, 17, 16), 1, (5, 5), (1, 1), (2, 2), (1, 1)),
    # a window slid along the row: rows strided and dilated, inner pixels from the first (no
    # padding), one inner pixel a row, and padding past the kernel's reach
    ("3x3 in windows, rows strided and dilated, a tail", (2, 40, 15, 13), 1, (3, 3), (2, 1), (2, 1), (2, 1)),
    ("3x3 in windows, unpadded rows", (2, 32, 7, 9), 1, (3, 3), (1, 1), (0, 0), (1, 1)),
    ("3x3 in windows, one inner pixel a row", (3, 16, 6, 3), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ("3x3 in windows, padding past the reach", (2, 16, 5, 6), 1, (3, 3), (1, 1), (1, 3), (1, 1)),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, shape, multiplier, kernel, stride, padding, dilation", ROWS, ids=[r[0] for r in ROWS])
def test_the_cpu_weight_gradient_in_either_order(name, shape, multiplier, kernel, stride, padding, dilation, dtype, monkeypatch):
    """Both orders give the weight gradient to the rounding of their dtype (against float64), the
    same bits in both formats and on 1 or 3 threads; the order of rows is the default."""
    x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, "cpu")
    args = (list(stride), list(padding), list(dilation), shape[1])
    reference = torch.ops.aten.convolution_backward(
        dy.double(), x.double(), weight.double(), None, *args[:3], False, [0, 0], shape[1], [False, True, False])[1]
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    results = {}
    threads = torch.get_num_threads()
    for order in ("rows", "lanes", None):
        if order:
            monkeypatch.setenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", order)
        else:
            monkeypatch.delenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", raising=False)
        runs = []
        try:
            for n_threads, layout in ((1, torch.contiguous_format), (3, CL), (3, torch.contiguous_format)):
                torch.set_num_threads(n_threads)
                a, b = x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout)
                runs.append(ops.conv2d_weight_grad(a, b, list(weight.shape), *args))
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(run, runs[0]) for run in runs[1:])
        error = (runs[0].double() - reference).norm() / reference.norm()
        assert error < tolerance, (order, error)
        results[order] = runs[0]
    assert torch.equal(results[None], results["rows"])


def test_the_order_of_rows_propagates_what_is_not_finite(monkeypatch):
    """An infinity in the input reaches the entries that multiply it, a NaN in the output gradient
    every entry of its channel that reads inside the image, as in the order of lanes; from NCHW
    operands too."""
    x, weight, dy = depthwise_operands((2, 16, 16, 17), 1, (3, 3), (1, 1), (1, 1), (1, 1), torch.float32, "cpu")
    x[1, 3, 2, 4], dy[0, 5, 0, 0] = float("inf"), float("nan")
    args = ([1, 1], [1, 1], [1, 1], 16)
    grads = {}
    for order in ("rows", "lanes"):
        monkeypatch.setenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", order)
        grads[order] = ops.conv2d_weight_grad(x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL), [16, 1, 3, 3], *args)
    monkeypatch.setenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", "rows")
    grads["rows, nchw"] = ops.conv2d_weight_grad(x, dy, [16, 1, 3, 3], *args)
    for order in ("rows", "rows, nchw", "lanes"):
        assert torch.equal(grads[order].isnan(), grads["lanes"].isnan())
        assert torch.equal(grads[order].isinf(), grads["lanes"].isinf())
    assert grads["rows"][3].isinf().any() and grads["rows"][5].isnan().any()


def test_an_unknown_order_is_refused_by_name(monkeypatch):
    x, weight, dy = depthwise_operands((1, 4, 5, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1), torch.float32, "cpu")
    monkeypatch.setenv("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", "columns")
    with pytest.raises(RuntimeError, match="TORCH_CONVBP_CPU_DEPTHWISE_ORDER must be rows or lanes, got 'columns'"):
        ops.conv2d_weight_grad(x, dy, [4, 1, 3, 3], [1, 1], [1, 1], [1, 1], 4)


def rows_order_results(cases):
    """The weight gradient in the order of rows of each (x, dy, weight shape, args), from
    channels_last operands and from contiguous ones."""
    return [ops.conv2d_weight_grad(x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout), shape, *args)
            for x, dy, shape, args in cases for layout in (CL, torch.contiguous_format)]


@pytest.mark.parametrize("switch", ["TORCH_CONVBP_NO_AVX2", "TORCH_CONVBP_NO_AVX512"])
def test_the_order_of_rows_gives_the_same_bits_on_every_vector_width(tmp_path, switch):
    """Its vectors are AVX-512's, AVX2's or any x86-64 CPU's (vector_ops.h), picked as it runs; a
    fresh process under TORCH_CONVBP_NO_AVX2 takes the last, under TORCH_CONVBP_NO_AVX512 the AVX2
    ones. Each lane rounds alike, so all give the same bits (on a CPU without AVX-512 the second
    compares the AVX2 code with itself)."""
    cases = []
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for name, shape, multiplier, kernel, stride, padding, dilation in ROWS:
            x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, "cpu")
            cases.append((x, dy, list(weight.shape), (list(stride), list(padding), list(dilation), shape[1])))
    torch.save(cases, tmp_path / "cases.pt")
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from test_route_depthwise import rows_order_results; "
        "torch.save(rows_order_results(torch.load(sys.argv[2] + '/cases.pt')), sys.argv[2] + '/results.pt')"
    )
    env = {**os.environ, switch: "1"}
    env.pop("TORCH_CONVBP_CPU_DEPTHWISE_ORDER", None)
    subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__), str(tmp_path)], env=env, check=True)
    for ours, theirs in zip(rows_order_results(cases), torch.load(tmp_path / "results.pt")):
        assert torch.equal(ours, theirs)


def plane_results(cases):
    """The forward and input gradient of each (x, weight, dy, args), in the operands' format."""
    return [(ops.conv2d(x, weight, None, *args), ops.conv2d_input_grad(dy, weight, list(x.shape), *args))
            for x, weight, dy, args in cases]


@pytest.mark.parametrize("switch", ["TORCH_CONVBP_NO_AVX2", "TORCH_CONVBP_NO_AVX512"])
def test_the_planes_and_strips_give_the_same_bits_on_every_vector_width(tmp_path, switch):
    """The float32 NCHW forward and input gradient of 3x3 planes, and of strided planes of at most 9
    taps, sum in vector registers of AVX-512, AVX2 or any x86-64 CPU (vector_ops.h), picked as it
    runs, each lane rounding alike: a fresh process under the switch gives the same bits (the NHWC
    kernels' too, by the test above). So do the NHWC strips of 3x3 rows, which run on AVX-512 only:
    the process under the switch sums those rows with the general kernels. On a CPU without AVX-512
    the second compares the AVX2 code with itself. bfloat16 strips read and write the rows as they
    are, widening and rounding in registers: the same bits as the general kernels on widened rows,
    a NaN and an infinity included (compared as bits)."""
    cases = []
    layouts = [(d, torch.contiguous_format, torch.float32) for d in PLANES_OF_VECTORS]
    layouts += [(d, CL, dtype) for d in STRIPS for dtype in (torch.float32, torch.bfloat16)]
    for (name, shape, multiplier, kernel, stride, padding, dilation), layout, dtype in layouts:
        x, weight, dy = depthwise_operands(shape, multiplier, kernel, stride, padding, dilation, dtype, "cpu")
        if dtype == torch.bfloat16:
            x[0, 1, 2, 5], x[-1, -1, -2, -3], dy[0, 2, 1, 4] = float("nan"), float("inf"), float("nan")
        cases.append((x.contiguous(memory_format=layout), weight, dy.contiguous(memory_format=layout),
                      (list(stride), list(padding), list(dilation), shape[1])))
    torch.save(cases, tmp_path / "cases.pt")
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from test_route_depthwise import plane_results; "
        "torch.save(plane_results(torch.load(sys.argv[2] + '/cases.pt')), sys.argv[2] + '/results.pt')"
    )
    subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__), str(tmp_path)],
                   env={**os.environ, switch: "1"}, check=True)
    def bits(t):
        return t.view(torch.int16) if t.dtype == torch.bfloat16 else t

    for ours, theirs in zip(plane_results(cases), torch.load(tmp_path / "results.pt")):
        assert torch.equal(bits(ours[0]), bits(theirs[0])) and torch.equal(bits(ours[1]), bits(theirs[1]))
