"""Route implicit_nhwc, the weight gradient: dW of a stride-1 convolution as GEMMs per tap on
shifted views of padded copies of the input and the output gradient, with no column matrix
(csrc/cpu/implicit_weight_grad_cpu.cpp), of channels_last or NCHW operands (the copies read
either), in float32 and, where the CPU has bfloat16 arithmetic, in bfloat16. By default it takes
bfloat16 layers of 16 or more channels per group whose output rows have 14 pixels or more, and
float32 ones of 16 to 128 input channels per group, no more output channels, undilated, fed NCHW
too on a CPU that runs AVX-512 kernels (up to 256 and dilated where the micro-kernel outruns
MKL); TORCH_CONVBP_GEMM=microkernel makes it take every stride-1 call of channels_last operands,
=mkl none (csrc/route.cpp)."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from cases import shift_and_add_conv2d
from route_cases import CL, assert_same_bits_on_one_and_three_threads, has_bfloat16_microkernel, has_microkernel, taken_here

ops = torch.ops.torch_convbp

pytestmark = pytest.mark.skipif(not has_microkernel(), reason="no GEMM micro-kernel here (x86 with AVX2, oneDNN on)")

NO_BFLOAT16 = pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=NO_BFLOAT16)]


@pytest.fixture
def microkernel(monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "microkernel")


# (name, input [N, C, H, W], out channels, kernel, padding, dilation, groups)
CASES = [
    ("3x3 padded", (2, 16, 9, 11), 24, (3, 3), (1, 1), (1, 1), 1),
    ("5x5", (1, 8, 12, 10), 16, (5, 5), (2, 2), (1, 1), 1),
    ("asymmetric everything", (2, 12, 11, 13), 20, (3, 2), (1, 0), (1, 2), 1),
    ("unpadded", (3, 8, 7, 9), 8, (3, 3), (0, 0), (1, 1), 1),
    ("dilated", (1, 16, 13, 12), 16, (3, 3), (2, 2), (2, 2), 1),
    ("padding past the reach", (2, 8, 5, 6), 8, (2, 3), (3, 3), (1, 1), 1),
    ("rows narrower than the kernel's reach", (2, 8, 9, 2), 8, (3, 5), (1, 2), (1, 1), 1),
    # an odd number of extended pixels per image: bfloat16's last pair completed with a zero
    ("odd extended pixels", (2, 6, 5, 7), 10, (3, 3), (1, 1), (1, 1), 1),
    ("groups", (2, 32, 8, 9), 80, (3, 3), (1, 1), (1, 1), 2),
    # channel blocks of 64 and a last, partial block (csrc/cpu/implicit_weight_grad_cpu.cpp)
    ("partial channel blocks", (1, 72, 5, 6), 100, (3, 3), (1, 1), (1, 1), 1),
    ("batch of one, one pixel wide", (1, 8, 7, 1), 8, (3, 1), (1, 0), (1, 1), 1),
    # 9 tiles of dW: each image's 576 extended pixels cut into 2 parts, summed apart, then added
    ("parts of the pixels", (2, 16, 24, 23), 16, (3, 3), (1, 1), (1, 1), 1),
]


def operands(shape, cout, kernel, groups, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype).contiguous(memory_format=CL)
    w = torch.randn(cout, shape[1] // groups, *kernel, generator=g).to(dtype)
    return x, w, g


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, shape, cout, kernel, padding, dilation, groups", CASES, ids=[c[0] for c in CASES])
def test_values_against_the_references(name, shape, cout, kernel, padding, dilation, groups, dtype, microkernel):
    """The weight gradient on the implicit route against F.conv2d's and our shift-and-add
    reference's in float64, as a tensor of the operands' dtype and the input's format
    (channels_last: written so by the kernel, no copy after)."""
    x, w, g = operands(shape, cout, kernel, groups, dtype)
    args = ((1, 1), padding, dilation, groups)
    assert torch_convbp.explain(x, w, *args)["weight_grad"].route == "implicit_nhwc"
    y = torch_convbp.conv2d(x, w.requires_grad_(), None, *args)
    dy = torch.randn(y.shape, generator=g).to(dtype).contiguous(memory_format=CL)
    (ours,) = torch.autograd.grad(y, w, dy)
    x64, w64 = x.double(), w.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(F.conv2d(x64, w64, None, *args), w64, dy.double())
    pads = (padding[0], padding[0], padding[1], padding[1])
    (own,) = torch.autograd.grad(shift_and_add_conv2d(x64, w64, None, (1, 1), pads, dilation, groups), w64, dy.double())
    torch.testing.assert_close(ref, own, rtol=1e-10, atol=1e-10)
    assert ours.dtype == dtype and ours.is_contiguous(memory_format=CL)
    # bfloat16: exact products summed in float32, rounded once
    tol = 1e-4 if dtype == torch.float32 else 1e-2 * ref.abs().max().item()
    torch.testing.assert_close(ours.double(), ref, rtol=tol, atol=tol)


LAYOUTS_AND_DTYPES = [(CL, torch.float32), pytest.param(CL, torch.bfloat16, marks=NO_BFLOAT16),
                      (torch.contiguous_format, torch.float32)]
LAYOUT_IDS = ["channels_last-float32", "channels_last-bfloat16", "nchw-float32"]


@pytest.mark.parametrize("layout, dtype", LAYOUTS_AND_DTYPES, ids=LAYOUT_IDS)
@pytest.mark.parametrize("where", ["right edge", "left edge", "interior", "padding row"])
def test_non_finite_inputs_propagate_like_f_conv2d(where, layout, dtype):
    """The padded copies pair the extended output gradient's zero columns with input values that
    the convolution never pairs (0 * inf is NaN): a chunk whose input holds an infinity or a NaN
    takes the convolution's own pairs instead, so each tap's gradient is inf, NaN or finite where
    F.conv2d's is. Also a NaN of the output gradient, which the padding's zeros pair with. The
    kernel itself, of operands in either layout it reads."""
    x, w, g = operands((2, 16, 6, 7), 16, (3, 3), 1, dtype)
    dy = torch.randn(2, 16, 6, 7, generator=g).to(dtype)
    if where == "right edge":
        x[1, 3, 2, -1] = float("inf")
    elif where == "left edge":
        x[0, 5, 4, 0] = float("-inf")
    elif where == "interior":
        x[1, 0, 3, 3] = float("nan")
    else:
        dy[0, 2, 0, 4] = float("nan")
    ours = torch.empty(w.shape, dtype=dtype)
    ops.implicit_conv2d_weight_grad(x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout),
                                    [1, 1], [1, 1], [1, 1], 1, ours)
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), 1, 1)
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours.isposinf(), ref.isposinf()) and torch.equal(ours.isneginf(), ref.isneginf())
    assert ours.isfinite().any() and not ours.isfinite().all()
    finite = ref.isfinite()
    tol = 1e-4 if dtype == torch.float32 else 1e-2 * ref[finite].abs().max().item()
    torch.testing.assert_close(ours.double()[finite], ref[finite], rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", [CL, torch.contiguous_format], ids=["channels_last", "contiguous"])
def test_a_non_finite_chunk_between_finite_ones(layout):
    """Chunks of one image: the middle one holds an infinity and takes the convolution's own pairs;
    the chunks after it reuse the padded planes, whose zeros are written once per call, so the
    finite taps' values are F.conv2d's."""
    x, w, g = operands((3, 16, 6, 7), 16, (3, 3), 1, torch.float32)
    dy = torch.randn(3, 16, 6, 7, generator=g)
    x[1, 2, 3, 0] = float("inf")
    ours = torch.empty(w.shape)
    with torch_convbp.workspace_limit(1):
        ops.implicit_conv2d_weight_grad(x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout),
                                        [1, 1], [1, 1], [1, 1], 1, ours)
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), 1, 1)
    assert torch.equal(ours.isfinite(), ref.isfinite()) and not ours.isfinite().all()
    finite = ref.isfinite()
    torch.testing.assert_close(ours.double()[finite], ref[finite], rtol=1e-4, atol=1e-4)


NCHW_FLOAT32 = pytest.mark.skipif(not taken_here("avx512 or outruns"),
                                  reason="float32 fed NCHW takes the route only where AVX-512 kernels run or its calls outrun MKL")


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=NCHW_FLOAT32), pytest.param(torch.bfloat16, marks=NO_BFLOAT16)],
                         ids=str)
@pytest.mark.parametrize("kernel", [(3, 3), (5, 5)], ids=["3x3", "5x5"])
# padded rows of 16 and 17 pixels (3x3, 5x5), then 15 and 16 with an odd count of extended pixels:
# bfloat16's pairs of pixels straddle rows where the padded row is odd
@pytest.mark.parametrize("shape, cout", [((2, 32, 16, 15), 24), ((3, 16, 7, 14), 16)], ids=["16x15", "7x14"])
def test_fed_nchw(shape, cout, kernel, dtype, monkeypatch):
    """Operands fed NCHW take the route where the micro-kernel computes their dtype (float32 where
    AVX-512 kernels run or the route's calls outrun MKL), read as they are: the padded copies built from NCHW rows, dY's rows
    transposed in cache. The weight gradient is the same as fed channels_last, bit for bit (the
    same padded copies, the same GEMMs), and a contiguous tensor."""
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    x, w, g = operands(shape, cout, kernel, 1, dtype)
    padding = [kernel[0] // 2, kernel[1] // 2]
    dy = torch.randn(shape[0], cout, *shape[2:], generator=g).to(dtype)
    args = (list(w.shape), [1, 1], padding, [1, 1], 1)
    route = torch_convbp.explain(x.contiguous(), w, 1, padding)["weight_grad"]
    assert route.route == "implicit_nhwc" and route.layout == "nchw"
    nchw = ops.conv2d_weight_grad(x.contiguous(), dy, *args)
    assert nchw.is_contiguous()
    assert torch.equal(nchw, ops.conv2d_weight_grad(x, dy.contiguous(memory_format=CL), *args))
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), 1, padding)
    tol = 1e-4 if dtype == torch.float32 else 1e-2 * ref.abs().max().item()
    torch.testing.assert_close(nchw.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, cout", [
    ((5, 48, 11, 13), 80),  # 2 x 2 x 9 = 36 tiles of dW, one part of the pixels
    ((3, 16, 30, 29), 16),  # 9 tiles, each image's 900 extended pixels in 3 parts: 27 tasks
], ids=["tiles", "parts"])
def test_chunks_and_threads_do_not_change_the_bits(shape, cout, dtype, microkernel):
    """The sums run on over chunks of images in one order, and each task owns one part of the
    pixels of whole tiles of dW: the same bits under a workspace limit of one image per chunk, and
    on 1, 3 or 16 threads."""
    x, w, g = operands(shape, cout, (3, 3), 1, dtype)
    dy = torch.randn(shape[0], cout, *shape[2:], generator=g).to(dtype).contiguous(memory_format=CL)
    args = (list(w.shape), [1, 1], [1, 1], [1, 1], 1)
    whole = ops.conv2d_weight_grad(x, dy, *args)
    with torch_convbp.workspace_limit(20_000):
        assert torch.equal(ops.conv2d_weight_grad(x, dy, *args), whole)
    before = torch.get_num_threads()
    try:
        for count in (1, 3, 16):
            torch.set_num_threads(count)
            assert torch.equal(ops.conv2d_weight_grad(x, dy, *args), whole)
    finally:
        torch.set_num_threads(before)


# (name, input [N, C, H, W], out channels, kernel, stride, dilation, dtype, channels_last, takes)
RULE = [
    ("64 channels, rows of 56", (2, 64, 56, 56), 64, 3, 1, 1, torch.float32, True, True),
    ("5x5", (2, 64, 28, 28), 64, 5, 1, 1, torch.float32, True, True),
    ("16 channels", (1, 16, 112, 112), 16, 3, 1, 1, torch.float32, True, True),
    ("more output than input channels", (2, 32, 56, 56), 64, 3, 1, 1, torch.float32, True, False),
    # up to 256 channels where the route's calls outrun MKL (NOTES sections 112, 118), dilated there
    # and where AVX-512 kernels run (section 119)
    ("256 channels", (1, 256, 14, 14), 256, 3, 1, 1, torch.float32, True, "outruns"),
    ("512 channels", (1, 512, 14, 14), 512, 3, 1, 1, torch.float32, True, False),
    ("dilated", (2, 64, 28, 28), 64, 3, 1, 2, torch.float32, True, "avx512 or outruns"),
    ("rows of 7", (2, 64, 7, 7), 64, 3, 1, 1, torch.float32, True, False),
    ("strided", (2, 64, 56, 56), 64, 3, 2, 1, torch.float32, True, False),
    # float32 fed NCHW where AVX-512 kernels run (NOTES section 94) or the route's calls outrun MKL
    # (section 118), read as it is (section 111)
    ("NCHW", (2, 64, 56, 56), 64, 3, 1, 1, torch.float32, False, "avx512 or outruns"),
    ("NCHW 5x5", (2, 64, 28, 28), 64, 5, 1, 1, torch.float32, False, "avx512 or outruns"),
    # and there up to 256 channels and dilated (sections 118, 119)
    ("NCHW 256 channels", (1, 256, 14, 14), 256, 3, 1, 1, torch.float32, False, "avx512 or outruns"),
    ("NCHW 512 channels", (1, 512, 14, 14), 512, 3, 1, 1, torch.float32, False, False),
    ("NCHW dilated", (2, 64, 28, 28), 64, 3, 1, 2, torch.float32, False, "avx512 or outruns"),
    ("NCHW strided", (2, 64, 56, 56), 64, 3, 2, 1, torch.float32, False, False),
    ("float64", (2, 64, 28, 28), 64, 3, 1, 1, torch.float64, True, False),
    # bfloat16 where its GEMMs run in bfloat16 on the micro-kernel: however many channels, dilated too
    ("bfloat16, 512 channels", (1, 512, 14, 14), 512, 3, 1, 1, torch.bfloat16, True, True),
    ("bfloat16, dilated", (1, 256, 28, 28), 256, 3, 1, 2, torch.bfloat16, True, True),
    ("bfloat16, more output channels", (2, 32, 56, 56), 64, 3, 1, 1, torch.bfloat16, True, True),
    ("bfloat16, rows of 7", (2, 64, 7, 7), 64, 3, 1, 1, torch.bfloat16, True, False),
    ("bfloat16, 8 channels", (2, 8, 28, 28), 32, 3, 1, 1, torch.bfloat16, True, False),
    # bfloat16 fed NCHW, read as it is (NOTES section 112)
    ("NCHW bfloat16", (2, 64, 56, 56), 64, 3, 1, 1, torch.bfloat16, False, True),
    ("NCHW bfloat16, strided", (2, 64, 56, 56), 128, 3, 2, 1, torch.bfloat16, False, False),
]


@pytest.mark.parametrize("name, shape, cout, kernel, stride, dilation, dtype, channels_last, takes", RULE, ids=[r[0] for r in RULE])
def test_the_rule_that_chooses_it(name, shape, cout, kernel, stride, dilation, dtype, channels_last, takes, monkeypatch):
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    takes = taken_here(takes)
    takes = takes and (dtype != torch.bfloat16 or has_bfloat16_microkernel())
    x = torch.empty(shape, dtype=dtype).contiguous(memory_format=CL if channels_last else torch.contiguous_format)
    w = torch.empty(cout, shape[1], kernel, kernel, dtype=dtype)
    args = (stride, dilation * (kernel // 2), dilation)
    route = torch_convbp.explain(x, w, *args)["weight_grad"]
    assert (route.route == "implicit_nhwc") == takes
    if takes:  # NCHW operands read as they are
        assert route.layout == ("nhwc" if channels_last else "nchw")
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "mkl")
    assert torch_convbp.explain(x, w, *args)["weight_grad"].route != "implicit_nhwc"


def test_the_kernel_and_its_fake(microkernel):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 7, 9, generator=g).contiguous(memory_format=CL)
    dy = torch.randn(2, 48, 5, 8, generator=g).contiguous(memory_format=CL)
    args = ([1, 1], [1, 0], [2, 1], 2)
    dw = torch.empty(48, 16, 3, 2)
    ops.implicit_conv2d_weight_grad(x, dy, *args, dw)
    expected = torch.nn.grad.conv2d_weight(x.double(), dw.shape, dy.double(), *args)
    torch.testing.assert_close(dw.double(), expected, rtol=1e-4, atol=1e-4)
    opcheck(ops.implicit_conv2d_weight_grad.default, (x, dy, *args, dw))
    with pytest.raises(RuntimeError, match="computes stride 1 only, got stride"):
        ops.implicit_conv2d_weight_grad(x, torch.empty(2, 48, 3, 8).contiguous(memory_format=CL), [2, 1], [1, 0], [2, 1], 2, dw)
    with pytest.raises(RuntimeError, match="computes float32 and bfloat16 only, got Double"):
        ops.implicit_conv2d_weight_grad(x.double(), dy.double(), *args, dw.double())
    # NCHW operands, read as they are: the same bits as channels_last ones
    nchw = torch.empty_like(dw)
    ops.implicit_conv2d_weight_grad(x.contiguous(), dy.contiguous(), *args, nchw)
    assert torch.equal(nchw, dw)
    opcheck(ops.implicit_conv2d_weight_grad.default, (x.contiguous(), dy.contiguous(), *args, nchw))
    with pytest.raises(RuntimeError, match="both contiguous or both channels_last"):
        ops.implicit_conv2d_weight_grad(x.contiguous(), dy, *args, dw)
    # a channels_last dW: the same values in the other memory order
    dw_cl = torch.empty_like(dw, memory_format=CL)
    ops.implicit_conv2d_weight_grad(x, dy, *args, dw_cl)
    assert torch.equal(dw_cl, dw) and dw_cl.is_contiguous(memory_format=CL)
    opcheck(ops.implicit_conv2d_weight_grad.default, (x, dy, *args, dw_cl))
    with pytest.raises(RuntimeError, match="expected a contiguous or channels_last"):
        ops.implicit_conv2d_weight_grad(x, dy, *args, torch.empty(16, 48, 3, 2).transpose(0, 1))
    with pytest.raises(RuntimeError, match=r"expected output of size"):
        ops.implicit_conv2d_weight_grad(x, dy[:, :, :3], *args, dw)


# (name, input [N, C, D, H, W], out channels, kernel, padding, dilation, groups): volumes, whose
# padded depth slices are one plane (csrc/cpu/padded_planes.h)
VOLUME_CASES = [
    ("3x3x3 padded", (2, 16, 4, 7, 9), 24, (3, 3, 3), (1, 1, 1), (1, 1, 1), 1),
    # padded rows of 7 pixels: bfloat16's pairs straddle rows, and slices
    ("asymmetric everything", (1, 32, 4, 6, 5), 48, (3, 2, 3), (1, 0, 2), (1, 2, 1), 2),
    ("dilated in depth, unpadded there", (3, 16, 5, 5, 14), 32, (2, 3, 3), (0, 1, 1), (2, 1, 1), 1),
    ("padded past the depth's reach", (1, 16, 2, 6, 6), 16, (3, 3, 3), (3, 1, 1), (1, 1, 1), 1),
    # more output rows than H + pad_h: a slice's pitch is OH (csrc/cpu/padded_planes.h)
    ("padded past the plane's reach", (2, 16, 3, 5, 6), 16, (2, 3, 3), (0, 3, 2), (1, 1, 2), 1),
    ("one row deep kernels", (2, 18, 4, 4, 15), 16, (3, 1, 3), (1, 0, 1), (1, 1, 1), 1),
    # 27 tiles of dW and each volume's extended pixels in parts (kMinTasks)
    ("parts of the pixels", (2, 16, 6, 12, 12), 16, (3, 3, 3), (1, 1, 1), (1, 1, 1), 1),
]
CL3D = torch.channels_last_3d


def tap_sums_conv3d_weight_grad(x, dy, kernel, padding, dilation, groups):
    """The weight gradient of a stride-1 3-D convolution as the test's own arithmetic: per tap, the
    products of dY with the zero-padded input shifted by the tap, summed over the batch and the
    output pixels, per group."""
    pd, ph, pw = padding
    xp = F.pad(x, (pw, pw, ph, ph, pd, pd))
    od, oh, ow = dy.shape[2:]
    c, cout = x.shape[1] // groups, dy.shape[1] // groups
    dw = torch.zeros(dy.shape[1], c, *kernel, dtype=x.dtype)
    for kd in range(kernel[0]):
        for ki in range(kernel[1]):
            for kj in range(kernel[2]):
                d, i, j = kd * dilation[0], ki * dilation[1], kj * dilation[2]
                shifted = xp[:, :, d:d + od, i:i + oh, j:j + ow]
                for g in range(groups):
                    dw[g * cout:(g + 1) * cout, :, kd, ki, kj] = torch.einsum(
                        "nodhw,ncdhw->oc", dy[:, g * cout:(g + 1) * cout], shifted[:, g * c:(g + 1) * c])
    return dw


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, shape, cout, kernel, padding, dilation, groups", VOLUME_CASES, ids=[c[0] for c in VOLUME_CASES])
def test_the_volume_kernel(name, shape, cout, kernel, padding, dilation, groups, dtype):
    """implicit_conv3d_weight_grad: F.conv3d's weight gradient and the test's own tap sums in
    float64 terms, of NCDHW or channels_last_3d operands (read as they are: the same bits) into a
    contiguous or channels_last_3d dW (the same values); the same bits on 1 and 3 threads and in
    chunks of one volume; opcheck; and the checks that name the problem."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=g).to(dtype)
    out = [s + 2 * p - d * (k - 1) for s, p, d, k in zip(shape[2:], padding, dilation, kernel)]
    dy = torch.randn(shape[0], cout, *out, generator=g).to(dtype)
    args = ([1, 1, 1], list(padding), list(dilation), groups)
    w_size = (cout, shape[1] // groups, *kernel)

    def compute(x=x, dy=dy, layout=CL3D, weight_layout=torch.contiguous_format):
        dw = torch.empty(w_size, dtype=dtype).contiguous(memory_format=weight_layout)
        ops.implicit_conv3d_weight_grad(x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout), *args, dw)
        return dw

    dw = compute()
    ref = torch.nn.grad.conv3d_weight(x.double(), w_size, dy.double(), 1, padding, dilation, groups)
    own = tap_sums_conv3d_weight_grad(x.double(), dy.double(), kernel, padding, dilation, groups)
    torch.testing.assert_close(own, ref, rtol=1e-10, atol=1e-10)
    tol = 1e-4 if dtype == torch.float32 else 1e-2 * ref.abs().max().item()
    torch.testing.assert_close(dw.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(compute(layout=torch.contiguous_format), dw)
    dw_cl = compute(weight_layout=CL3D)
    assert dw_cl.is_contiguous(memory_format=CL3D) and torch.equal(dw_cl, dw)
    with torch_convbp.workspace_limit(1):  # a volume per chunk
        assert torch.equal(compute(), dw)
    assert_same_bits_on_one_and_three_threads(compute, dw)
    x_cl, dy_cl = x.contiguous(memory_format=CL3D), dy.contiguous(memory_format=CL3D)
    opcheck(ops.implicit_conv3d_weight_grad.default, (x_cl, dy_cl, *args, compute()))
    opcheck(ops.implicit_conv3d_weight_grad.default, (x.contiguous(), dy.contiguous(), *args, compute()))
    with pytest.raises(RuntimeError, match="both contiguous or both channels_last_3d"):
        ops.implicit_conv3d_weight_grad(x.contiguous(), dy_cl, *args, dw)
    strided_rows = (shape[3] + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // 2 + 1
    strided_dy = torch.zeros(shape[0], cout, out[0], strided_rows, out[2], dtype=dtype).contiguous(memory_format=CL3D)
    with pytest.raises(RuntimeError, match="computes stride 1 only, got stride"):
        ops.implicit_conv3d_weight_grad(x_cl, strided_dy, [1, 2, 1], *args[1:], dw)
    with pytest.raises(RuntimeError, match="computes float32 and bfloat16 only, got Double"):
        ops.implicit_conv3d_weight_grad(x_cl.double(), dy_cl.double(), *args, dw.double())
    with pytest.raises(RuntimeError, match="expected a 5-D input"):
        ops.implicit_conv3d_weight_grad(x_cl[0], dy_cl, *args, dw)
    with pytest.raises(RuntimeError, match="expected output of size"):
        ops.implicit_conv3d_weight_grad(x_cl, dy_cl[:, :, :1], *args, dw)


@pytest.mark.parametrize("layout", [CL3D, torch.contiguous_format], ids=["channels_last_3d", "ncdhw"])
@pytest.mark.parametrize("where", ["interior", "first slice", "output gradient"])
def test_non_finite_volumes_propagate_like_f_conv3d(where, layout):
    """As for images: a chunk whose volume holds an infinity or a NaN takes the convolution's own
    pairs, so each tap's gradient is inf, NaN or finite where F.conv3d's is."""
    g = torch.Generator().manual_seed(4)
    x, dy = torch.randn(2, 16, 4, 5, 6, generator=g), torch.randn(2, 16, 4, 5, 6, generator=g)
    if where == "interior":
        x[1, 3, 2, 1, 4] = float("nan")
    elif where == "first slice":
        x[0, 2, 0, 0, 0] = float("inf")
    else:
        dy[1, 5, 3, 4, 0] = float("nan")
    ours = torch.empty(16, 16, 3, 3, 3)
    ops.implicit_conv3d_weight_grad(x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout),
                                    [1, 1, 1], [1, 1, 1], [1, 1, 1], 1, ours)
    ref = torch.nn.grad.conv3d_weight(x.double(), ours.shape, dy.double(), 1, 1)
    assert torch.equal(ours.isnan(), ref.isnan()) and torch.equal(ours.isinf(), ref.isinf())
    assert not ours.isfinite().all()
    finite = ref.isfinite()
    torch.testing.assert_close(ours.double()[finite], ref[finite], rtol=1e-4, atol=1e-4)
