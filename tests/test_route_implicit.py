"""Route implicit_nhwc: a float32 convolution of channels_last operands on a CPU with oneDNN's GEMM
micro-kernel computes its forward, and its input gradient where that is a stride-1 convolution,
as GEMMs on shifted views of the input, one per tap, with no column matrix
(csrc/cpu/implicit_nhwc_cpu.cpp). By default it takes layers of 16 to 256 input channels per group
whose output rows have 14 pixels or more, NCHW operands of stride 1 and more than one tap too
(through layout copies); on a CPU where the micro-kernel outruns MKL, every layer of 16 channels or
more per group with more than one tap, NCHW operands too, and there the input gradient of a strided
layer as well: dY's GEMMs per tap added into the dX pixels they reach (no column matrix, no
col2im). An AMD CPU without AVX-512, where the micro-kernel outruns MKL on narrow results (every
call of this route's), takes strided NCHW operands of more than one tap and the scattered input
gradient too, within the default channel and row limits. TORCH_CONVBP_GEMM=microkernel makes it take every call it can compute, =mkl none
(csrc/route.cpp)."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from cases import shift_and_add_conv2d
from route_cases import (CL, assert_same_bits_on_one_and_three_threads, has_bfloat16_microkernel, has_microkernel,
                         implicit_calls_outrun_mkl, microkernel_outruns_mkl, taken_here)

ops = torch.ops.torch_convbp


pytestmark = pytest.mark.skipif(not has_microkernel(), reason="no GEMM micro-kernel here (x86 with AVX2, oneDNN on)")


@pytest.fixture
def microkernel(monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "microkernel")


# (name, input [N, C, H, W], out channels, kernel, stride, padding, dilation, groups)
CASES = [
    ("3x3 padded", (2, 16, 9, 11), 24, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("5x5", (1, 8, 12, 10), 16, (5, 5), (1, 1), (2, 2), (1, 1), 1),
    ("asymmetric everything", (2, 12, 11, 13), 20, (3, 2), (2, 1), (1, 0), (1, 2), 1),
    ("strided, stride larger than the kernel", (2, 16, 14, 15), 16, (2, 2), (3, 3), (0, 1), (1, 1), 1),
    ("dilated", (1, 16, 13, 12), 16, (3, 3), (1, 1), (2, 2), (2, 2), 1),
    ("padding past the reach", (2, 8, 5, 6), 8, (2, 3), (1, 1), (3, 3), (1, 1), 1),
    ("rows narrower than the kernel's reach", (2, 8, 9, 2), 8, (3, 5), (1, 1), (1, 2), (1, 1), 1),
    # stride 2 along the width only: each tap's run of input pixels two pixels apart
    ("strided along the width", (2, 16, 7, 12), 16, (3, 3), (1, 2), (1, 1), (1, 1), 1),
    ("groups", (2, 32, 8, 9), 80, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    # at most 32 output channels per group: the direct grouped kernels come first
    ("narrow groups", (2, 12, 8, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 3),
    ("batch of one, one pixel wide", (1, 8, 7, 1), 8, (3, 1), (1, 1), (1, 0), (1, 1), 1),
    # fewer than 16 input channels, one group, undilated along the width: a kernel row's taps in
    # one call (K = kw*C), on input rows padded into a thread's buffer
    ("kernel rows: an RGB stem", (2, 3, 15, 17), 16, (7, 7), (2, 2), (3, 3), (1, 1), 1),
    ("kernel rows: dilated down the rows", (2, 4, 12, 13), 16, (3, 5), (1, 1), (2, 2), (2, 1), 1),
    ("kernel rows: padding past the reach", (2, 3, 6, 5), 16, (3, 3), (1, 2), (4, 4), (1, 1), 1),
    ("kernel rows: a kernel as wide as the padded row", (1, 2, 5, 3), 16, (2, 5), (1, 1), (0, 1), (1, 1), 1),
    ("narrow and dilated along the width: a call per tap", (2, 4, 12, 13), 16, (3, 3), (1, 1), (1, 2), (1, 2), 1),
]


@pytest.mark.parametrize("layout", [CL, torch.contiguous_format], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_against_the_references(name, shape, cout, kernel, stride, padding, dilation, groups, layout, microkernel):
    """The forward and the input gradient on the implicit route (where the input gradient is a
    stride-1 convolution), the weight gradient too where the stride is 1 and the operands
    channels_last (the columns route elsewhere), all against F.conv2d and our
    shift-and-add reference in float64; NCHW operands where the route takes them (stride 1 and
    more than one tap; strided ones too where its calls outrun MKL, of one tap too where every
    GEMM does), whose results come back NCHW."""
    nchw_taken = kernel != (1, 1) and (stride == (1, 1) or implicit_calls_outrun_mkl())
    if layout == torch.contiguous_format and not (nchw_taken or microkernel_outruns_mkl()):
        pytest.skip("NCHW operands of a strided layer take the implicit route only where its calls outrun MKL")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).contiguous(memory_format=layout).requires_grad_()
    w = torch.randn(cout, shape[1] // groups, *kernel, generator=g).requires_grad_()
    args = (stride, padding, dilation, groups)
    routes = torch_convbp.explain(x, w, *args)
    # the direct grouped kernels take narrow groups (at most 32 output channels a group) fed
    # channels_last, and fed NCHW those of at most 16 (float32 on the CPU, through layout copies)
    def grouped(group_outputs):
        return groups > 1 and group_outputs <= (32 if layout == CL else 16)

    assert routes["forward"].route == ("grouped" if grouped(cout // groups) else "implicit_nhwc")
    # the input gradient too: of stride 1 the convolution of dY (the direct grouped kernels' where
    # its groups, C/G output channels wide, are narrow), else dY's products scattered
    narrow_input_grad = grouped(shape[1] // groups) and stride == (1, 1)
    assert routes["input_grad"].route == ("grouped" if narrow_input_grad else "implicit_nhwc")
    y = torch_convbp.conv2d(x, w, None, *args)
    dy = torch.randn(y.shape, generator=g).contiguous(memory_format=layout)
    ours = (y, *torch.autograd.grad(y, (x, w), dy))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = F.conv2d(x64, w64, None, *args)
    ref = (y64, *torch.autograd.grad(y64, (x64, w64), dy.double()))
    pads = (padding[0], padding[0], padding[1], padding[1])
    y_own = shift_and_add_conv2d(x64, w64, None, stride, pads, dilation, groups)
    own = (y_own, *torch.autograd.grad(y_own, (x64, w64), dy.double()))
    for a, r, o in zip(ours, ref, own):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(r, o, rtol=1e-10, atol=1e-10)
    assert y.is_contiguous(memory_format=layout) and ours[1].is_contiguous(memory_format=layout)


def test_the_implicit_and_column_routes_agree(monkeypatch):
    x = torch.randn(2, 32, 16, 17).contiguous(memory_format=CL)
    w = torch.randn(48, 32, 3, 3)
    dy = torch.randn(2, 48, 16, 17).contiguous(memory_format=CL)
    results = {}
    for choice in ("microkernel", "mkl"):
        monkeypatch.setenv("TORCH_CONVBP_GEMM", choice)
        routes = torch_convbp.explain(x, w, padding=1)
        assert routes["forward"].route == ("implicit_nhwc" if choice == "microkernel" else "columns")
        results[choice] = (ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1),
                           ops.conv2d_input_grad(dy, w, list(x.shape), [1, 1], [1, 1], [1, 1], 1))
    for a, b in zip(results["microkernel"], results["mkl"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


# (name, input [N, C, H, W], out channels, kernel, dtype, channels_last, whether the rule takes the
# route on a CPU with the micro-kernel, and on one where it outruns MKL (gemm_engine() says
# "microkernel"): there every layer of 16 channels or more per group and more than one tap.
RULE = [
    ("64 channels, rows of 28", (2, 64, 28, 28), 64, 3, torch.float32, True, True, True),
    ("16 channels, rows of 14", (2, 16, 14, 14), 32, 3, torch.float32, True, True, True),
    ("rows of 7", (2, 64, 7, 7), 64, 3, torch.float32, True, False, True),
    ("256 channels", (1, 256, 14, 14), 256, 3, torch.float32, True, True, True),
    ("512 channels", (1, 512, 14, 14), 512, 3, torch.float32, True, False, True),
    ("4 channels", (2, 4, 28, 28), 32, 3, torch.float32, True, False, False),
    ("one tap", (2, 64, 28, 28), 64, 1, torch.float32, True, True, False),
    ("float64", (2, 64, 28, 28), 64, 3, torch.float64, True, False, False),
    # bfloat16 where its GEMMs run in bfloat16 on the micro-kernel (AVX512_BF16, AMX), in pairs of
    # channels, and then however many channels
    ("bfloat16", (2, 64, 28, 28), 64, 3, torch.bfloat16, True, True, True),
    ("bfloat16, 256 channels", (1, 256, 14, 14), 256, 3, torch.bfloat16, True, True, True),
    ("bfloat16, rows of 7", (2, 64, 7, 7), 64, 3, torch.bfloat16, True, False, True),
    ("bfloat16, odd channels", (2, 33, 28, 28), 63, 3, torch.bfloat16, True, False, False),
    # float32 fed NCHW through layout copies where stride 1 and more than one tap (NOTES section 66);
    # the 1x1 case is strided
    ("NCHW", (2, 64, 28, 28), 64, 3, torch.float32, False, True, True),
    ("NCHW, rows of 7", (2, 64, 7, 7), 64, 3, torch.float32, False, False, True),
    ("NCHW, one tap", (2, 64, 28, 28), 64, 1, torch.float32, False, False, False),
    # bfloat16 fed NCHW through layout copies as fed channels_last (NOTES sections 58, 60)
    ("NCHW bfloat16, 128 channels", (1, 128, 14, 14), 128, 3, torch.bfloat16, False, True, True),
    ("NCHW bfloat16, 16 channels", (2, 16, 28, 28), 16, 3, torch.bfloat16, False, True, True),
    ("NCHW bfloat16, rows of 7", (2, 64, 7, 7), 64, 3, torch.bfloat16, False, False, True),
    ("NCHW bfloat16, 8 channels", (2, 8, 28, 28), 32, 3, torch.bfloat16, False, False, False),
    ("NCHW, 8 channels", (2, 8, 28, 28), 32, 3, torch.float32, False, False, False),
]


@pytest.mark.parametrize("name, shape, cout, kernel, dtype, channels_last, takes, takes_where_faster", RULE,
                         ids=[r[0] for r in RULE])
def test_the_rule_that_chooses_it(name, shape, cout, kernel, dtype, channels_last, takes, takes_where_faster, monkeypatch):
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    if microkernel_outruns_mkl():
        takes = takes_where_faster
    takes = takes and (dtype != torch.bfloat16 or has_bfloat16_microkernel())
    x = torch.empty(shape, dtype=dtype).contiguous(memory_format=CL if channels_last else torch.contiguous_format)
    w = torch.empty(cout, shape[1], kernel, kernel, dtype=dtype)
    # a 1x1 kernel with a stride (one unpadded, of stride 1, is the pointwise route's)
    stride, padding = (2, 0) if kernel == 1 else (1, 1)
    routes = torch_convbp.explain(x, w, stride, padding)
    assert (routes["forward"].route == "implicit_nhwc") == takes
    # the strided 1x1 layer's input gradient: one tap, which the rule leaves to col2im
    assert (routes["input_grad"].route == "implicit_nhwc") == (takes and stride == 1)
    # the weight gradient's rule is its own (tests/test_route_implicit_weight_grad.py)
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "mkl")
    assert torch_convbp.explain(x, w, stride, padding)["forward"].route != "implicit_nhwc"


# (name, input [N, C, H, W], out channels, kernel, stride, dilation, groups, dtype, channels_last,
# whether the rule takes it where the micro-kernel outruns MKL)
KERNEL_ROWS_RULE = [
    ("an RGB stem, 7x7/2", (2, 3, 56, 56), 64, 7, 2, 1, 1, torch.float32, True, True),
    ("8 channels, 3x3: rows of 24", (2, 8, 28, 28), 32, 3, 1, 1, 1, torch.float32, True, True),
    ("3 channels, 3x3: rows of 9", (2, 3, 28, 28), 64, 3, 1, 1, 1, torch.float32, True, False),
    ("fed NCHW", (2, 3, 56, 56), 64, 7, 2, 1, 1, torch.float32, False, False),
    ("dilated along the width", (2, 8, 28, 28), 32, 3, 1, 2, 1, torch.float32, True, False),
    ("two groups", (2, 8, 28, 28), 32, 3, 1, 1, 2, torch.float32, True, False),
    ("bfloat16", (2, 4, 28, 28), 32, 5, 1, 1, 1, torch.bfloat16, True, False),
]


@pytest.mark.parametrize("name, shape, cout, kernel, stride, dilation, groups, dtype, channels_last, takes",
                         KERNEL_ROWS_RULE, ids=[r[0] for r in KERNEL_ROWS_RULE])
def test_the_rule_for_inputs_of_fewer_than_16_channels(name, shape, cout, kernel, stride, dilation, groups, dtype,
                                                       channels_last, takes, monkeypatch):
    """Inputs of fewer than 16 channels take the implicit forward only as calls of a kernel row's
    taps together (one group, undilated along the width) of 16 or more channels, float32 fed
    channels_last, where the micro-kernel outruns MKL: the RGB stem took 0.90x the column route's
    time; 3x3 of 3 channels (K = 9) no less, and the stem fed NCHW 1.03-1.06x (NOTES section 114)."""
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    takes = takes and microkernel_outruns_mkl()
    x = torch.empty(shape, dtype=dtype).contiguous(memory_format=CL if channels_last else torch.contiguous_format)
    w = torch.empty(cout, shape[1] // groups, kernel, kernel, dtype=dtype)
    routes = torch_convbp.explain(x, w, stride, kernel // 2 * dilation, dilation, groups)
    assert (routes["forward"].route == "implicit_nhwc") == takes
    if takes:
        assert "a GEMM per kernel row" in routes["forward"].reason


def test_strided_float32_nchw_takes_the_route_where_its_calls_outrun_mkl(monkeypatch):
    """Fed NCHW, a strided float32 layer's forward keeps the column route where the micro-kernel's
    calls do not outrun MKL: through layout copies it took 1.06x the time on an AMX Xeon (NOTES
    section 66); on an AVX2 Zen 1 0.80-0.86x (section 118). Fed channels_last it takes the
    implicit route."""
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    x = torch.empty(2, 64, 56, 56)
    w = torch.empty(128, 64, 3, 3)
    nchw = torch_convbp.explain(x, w, 2, 1)["forward"].route
    assert (nchw == "implicit_nhwc") == implicit_calls_outrun_mkl()
    assert torch_convbp.explain(x.contiguous(memory_format=CL), w, 2, 1)["forward"].route == "implicit_nhwc"


# (name, input [N, C, H, W], out channels, kernel, stride, dtype, channels_last, where it is taken:
# "avx512 or outruns" where AVX-512 kernels run or the micro-kernel's calls outrun MKL, "outruns"
# only there): the input gradient of a strided layer, scattered from dY's GEMMs. Its GEMMs are the
# forward's with the channels swapped (K = Cout/G, N = C/G), so the forward's rule holds on that
# shape: 16 or more channels per group each way, more than one tap; float32 fed NCHW through layout
# copies only where the calls outrun MKL (implicit_pays_layout).
SCATTER_RULE = [
    ("3x3/2 64>128", (2, 64, 56, 56), 128, 3, 2, torch.float32, True, "avx512 or outruns"),
    ("3x3/2 64>128 fed NCHW", (2, 64, 56, 56), 128, 3, 2, torch.float32, False, "outruns"),
    ("5x5/2", (2, 32, 28, 28), 64, 5, 2, torch.float32, True, "avx512 or outruns"),
    ("bfloat16", (2, 64, 28, 28), 128, 3, 2, torch.bfloat16, True, "avx512 or outruns"),
    ("bfloat16 fed NCHW", (2, 64, 28, 28), 128, 3, 2, torch.bfloat16, False, "avx512 or outruns"),
    ("8 input channels", (2, 8, 56, 56), 32, 3, 2, torch.float32, True, False),  # N = 8
    ("8 output channels", (2, 32, 56, 56), 8, 3, 2, torch.float32, True, False),  # K = 8
    ("one tap", (2, 64, 28, 28), 128, 1, 2, torch.float32, True, False),
    ("float64", (2, 64, 28, 28), 128, 3, 2, torch.float64, True, False),
]


@pytest.mark.parametrize("name, shape, cout, kernel, stride, dtype, channels_last, takes", SCATTER_RULE,
                         ids=[r[0] for r in SCATTER_RULE])
def test_the_rule_for_a_strided_input_gradient(name, shape, cout, kernel, stride, dtype, channels_last, takes, monkeypatch):
    """Where the micro-kernel's calls outrun MKL the strided input gradient took 0.86-0.99x
    oneDNN's time on an AVX-512 EPYC where the column route took 1.02-1.34x (benchmarks/NOTES.md,
    section 111), and 0.66-0.80x the column route's time on an AVX2 Zen 1 (section 118); on an
    AMX Xeon, which runs AVX-512 kernels, 0.81-0.94x fed channels_last, bfloat16 0.65-0.90x
    (section 119); elsewhere it was not measured and keeps the column route (col2im)."""
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    takes = taken_here(takes)
    takes = takes and (dtype != torch.bfloat16 or has_bfloat16_microkernel())
    x = torch.empty(shape, dtype=dtype).contiguous(memory_format=CL if channels_last else torch.contiguous_format)
    w = torch.empty(cout, shape[1], kernel, kernel, dtype=dtype)
    route = torch_convbp.explain(x, w, stride, kernel // 2)["input_grad"]
    assert (route.route == "implicit_nhwc") == takes, route
    if takes:
        assert "added into the input gradient's pixels" in route.reason


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "fastest")
    x = torch.randn(1, 16, 5, 5).contiguous(memory_format=CL)
    with pytest.raises(RuntimeError, match="TORCH_CONVBP_GEMM must be auto, microkernel or mkl, got 'fastest'"):
        torch_convbp.conv2d(x, torch.randn(16, 16, 3, 3))


def test_the_kernel_and_its_fake(microkernel):
    x = torch.randn(2, 16, 6, 7).contiguous(memory_format=CL)
    w = torch.randn(8, 16, 3, 3)
    out = torch.empty(2, 8, 6, 7).contiguous(memory_format=CL)
    args = ([1, 1], [1, 1], [1, 1], 1)
    opcheck(ops.implicit_conv2d.default, (x, w, *args, out))
    with pytest.raises(RuntimeError, match="computes float32 and bfloat16 only, got Double"):
        ops.implicit_conv2d(x.double(), w.double(), *args, out.double())
    with pytest.raises(RuntimeError, match=r"expected a channels_last \(dense\) input"):
        ops.implicit_conv2d(x.contiguous(), w, *args, out)
    with pytest.raises(RuntimeError, match=r"expected a channels_last or contiguous \(dense\) output"):
        ops.implicit_conv2d(x, w, *args, torch.empty(2, 6, 8, 7).transpose(1, 2))
    with pytest.raises(RuntimeError, match=r"expected output of size \[2, 8, 6, 7\]"):
        ops.implicit_conv2d(x, w, *args, out[:, :, :5])


# (name, input [N, C, D, H, W], out channels, kernel, stride, padding, dilation, groups): volumes,
# whose depth slices' rows are an image's rows and whose kernel rows are the (depth tap, kernel
# row) pairs
VOLUME_CASES = [
    ("3x3x3 padded", (2, 16, 4, 7, 9), 24, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ("asymmetric everything", (2, 16, 5, 8, 7), 16, (2, 3, 2), (2, 1, 2), (1, 0, 1), (2, 1, 2), 2),
    ("padded past the depth's reach", (1, 16, 2, 6, 6), 16, (3, 3, 3), (1, 1, 1), (3, 1, 1), (1, 1, 1), 1),
    ("a kernel one slice deep", (2, 16, 3, 6, 5), 16, (1, 3, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1), 1),
    # 3 input channels, one group, undilated along the width: a kernel row's taps in one call
    ("an RGB stem's kernel rows", (2, 3, 4, 12, 14), 16, (3, 5, 5), (1, 2, 2), (1, 2, 2), (1, 1, 1), 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kernel", ["forward", "input_grad"])
@pytest.mark.parametrize("layout", [torch.channels_last_3d, torch.contiguous_format], ids=["channels_last_3d result", "contiguous result"])
@pytest.mark.parametrize("name, size, cout, k, stride, padding, dilation, groups", VOLUME_CASES, ids=[c[0] for c in VOLUME_CASES])
def test_the_volume_kernels(name, size, cout, k, stride, padding, dilation, groups, layout, kernel, dtype):
    """implicit_conv3d and implicit_conv3d_input_grad on channels_last_3d operands (the input
    gradient's of a strided layer scattered), into either layout (bfloat16, where the CPU computes
    it: channels_last_3d only, the other refused): F.conv3d's values in float64 terms, each volume
    the same bits alone as in the batch and on 1 and 3 threads, opcheck, and the checks that name
    the problem."""
    if dtype == torch.bfloat16 and not has_bfloat16_microkernel():
        pytest.skip("no bfloat16 arithmetic for the micro-kernel here")
    if dtype == torch.bfloat16 and kernel == "forward" and size[1] // groups % 2:
        pytest.skip("bfloat16 takes the forward's input channels in pairs (the VNNI layout)")
    g = torch.Generator().manual_seed(5)
    cl3d = torch.channels_last_3d
    w = torch.randn(cout, size[1] // groups, *k, generator=g).to(dtype).contiguous(memory_format=cl3d)
    x = torch.randn(size, generator=g).to(dtype).contiguous(memory_format=cl3d)
    y_size = F.conv3d(x, w, None, stride, padding, dilation, groups).shape
    args = (list(stride), list(padding), list(dilation), groups)
    if kernel == "forward":
        op, a, result_size = ops.implicit_conv3d, x, y_size
        expected = F.conv3d(x.double(), w.double(), None, stride, padding, dilation, groups)
    else:
        dy = torch.randn(y_size, generator=g).to(dtype).contiguous(memory_format=cl3d)
        op, a, result_size = ops.implicit_conv3d_input_grad, dy, size
        x64 = x.double().requires_grad_()
        (expected,) = torch.autograd.grad(F.conv3d(x64, w.double(), None, stride, padding, dilation, groups), x64, a.double())

    def compute(a=a):
        out = torch.empty(a.shape[0], *result_size[1:], dtype=dtype).contiguous(memory_format=layout)
        op(a, w, *args, out)
        return out

    if dtype == torch.bfloat16 and layout == torch.contiguous_format:
        with pytest.raises(RuntimeError, match="writes bfloat16 results channels_last only"):
            compute()
        return
    out = compute()
    assert out.is_contiguous(memory_format=layout)
    tolerance = dict(rtol=1e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.double(), expected, **tolerance)
    assert_same_bits_on_one_and_three_threads(compute, out)
    for n in range(size[0]):
        assert torch.equal(compute(a[n:n + 1]), out[n:n + 1])
    opcheck(op.default, (a, w, *args, compute()))
    with pytest.raises(RuntimeError, match=r"expected a channels_last_3d \(dense\)"):
        op(a.contiguous(), w, *args, out)
    with pytest.raises(RuntimeError, match="expected a 5-D input" if kernel == "forward" else "expected output of size"):
        op(a[0], w, *args, out)
    with pytest.raises(RuntimeError, match="computes float32 and bfloat16 only, got Double"):
        op(a.double(), w.double(), *args, out.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kernel", ["forward", "input_grad"])
def test_an_image_gets_the_same_bits_in_any_batch(kernel, dtype, microkernel):
    """A tile is a band of output rows that may run across images (csrc/cpu/implicit_nhwc_cpu.cpp),
    and each output entry sums its taps in the same order in any band: an image's result is
    bitwise the same alone, in a batch of 5, or of 64 (rows of 3 pixels, so a band spans several
    images), a deep layer's weights included (256 output channels: one block)."""
    if dtype == torch.bfloat16 and not has_bfloat16_microkernel():
        pytest.skip("no bfloat16 arithmetic for the micro-kernel here")
    g = torch.Generator().manual_seed(3)
    for size, out_channels in (((64, 16, 5, 3), 32), ((5, 32, 6, 14), 256)):
        x = torch.randn(size, generator=g).to(dtype).contiguous(memory_format=CL)
        # the input gradient's kernel takes dY (here x) and the convolution's own weight [Cout, Cin]
        weight_size = (out_channels, size[1]) if kernel == "forward" else (size[1], out_channels)
        w = torch.randn(*weight_size, 3, 3, generator=g).to(dtype)
        op = ops.implicit_conv2d if kernel == "forward" else ops.implicit_conv2d_input_grad

        def run(batch):
            out = torch.empty(batch.shape[0], out_channels, *size[2:], dtype=dtype)
            out = out.contiguous(memory_format=CL)
            op(batch, w, [1, 1], [1, 1], [1, 1], 1, out)
            return out

        whole = run(x)
        for i in (0, 2, size[0] - 1):
            assert torch.equal(run(x[i : i + 1]), whole[i : i + 1])
        assert torch.equal(run(x[1:6]), whole[1:6])


@pytest.mark.parametrize("kernel", ["forward", "input_grad"])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_float32_result_written_nchw(kernel, stride, microkernel):
    """The forward and the input gradient write a float32 result NCHW themselves where it is
    contiguous (each tile's sums transposed into the planes): the same bits as channels_last, and
    what conv2d returns for NCHW operands without a layout copy after. bfloat16 results are written
    channels_last only."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 32, 9, 10, generator=g).contiguous(memory_format=CL)
    w = torch.randn(48, 16, 3, 3, generator=g)
    args = ([stride, stride], [1, 1], [1, 1], 2)
    y_size = F.conv2d(x, w, None, *args).shape
    if kernel == "forward":
        op, a, size = ops.implicit_conv2d, x, y_size
    else:
        op, a, size = ops.implicit_conv2d_input_grad, torch.randn(y_size, generator=g).contiguous(memory_format=CL), x.shape

    def run(layout, dtype=torch.float32):
        out = torch.full(size, float("nan"), dtype=dtype).contiguous(memory_format=layout)
        op(a.to(dtype), w.to(dtype), *args, out)
        return out

    nchw = run(torch.contiguous_format)
    assert nchw.is_contiguous() and torch.equal(nchw, run(CL))
    opcheck(op.default, (a, w, *args, torch.empty(size)))
    refusal = (r"writes bfloat16 results channels_last only \(contiguous ones: float32\)" if has_bfloat16_microkernel()
               else "computes bfloat16 only on a CPU with bfloat16 arithmetic")
    with pytest.raises(RuntimeError, match=refusal):
        run(torch.contiguous_format, torch.bfloat16)


def test_the_input_grad_kernel_and_its_fake(microkernel):
    """The input gradient's kernel takes the convolution's own weight and shape (grad_input is
    its input, grad_output its output) and rotates and transposes the weight itself."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 7, 9, generator=g, dtype=torch.float64)
    w = torch.randn(48, 16, 3, 2, generator=g, dtype=torch.float64)
    args = ([1, 1], [1, 0], [2, 1], 2)
    dy = torch.randn(F.conv2d(x, w, None, *args).shape, generator=g, dtype=torch.float64)
    expected = torch.nn.grad.conv2d_input(x.shape, w, dy, *args)
    dx = torch.empty(x.shape).contiguous(memory_format=CL)
    ops.implicit_conv2d_input_grad(dy.float().contiguous(memory_format=CL), w.float(), *args, dx)
    torch.testing.assert_close(dx.double(), expected, rtol=1e-4, atol=1e-4)
    opcheck(ops.implicit_conv2d_input_grad.default,
            (dy.float().contiguous(memory_format=CL), w.float(), *args, dx))
    with pytest.raises(RuntimeError, match="computes float32 and bfloat16 only, got Double"):
        ops.implicit_conv2d_input_grad(dy.contiguous(memory_format=CL), w, *args, dx.double())
    with pytest.raises(RuntimeError, match=r"expected output of size"):
        ops.implicit_conv2d_input_grad(dy.float().contiguous(memory_format=CL)[:, :, :3], w.float(), *args, dx)


# (name, dX [N, C, H, W], out channels, kernel, stride, padding, dilation, groups): input gradients
# that are not a stride-1 convolution of dY, which the kernel scatters
SCATTERED = [
    ("3x3/2", (5, 32, 13, 12), 48, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    # pixels that no tap reaches (stride 3 past a kernel of 2) stay zero
    ("stride past the kernel", (3, 16, 11, 10), 32, (2, 2), (3, 3), (0, 1), (1, 1), 1),
    ("asymmetric, dilated, groups", (2, 32, 15, 13), 64, (3, 2), (2, 3), (1, 0), (2, 1), 2),
    ("stride 1, padding past the reach", (2, 16, 6, 7), 16, (3, 3), (1, 1), (3, 2), (1, 1), 1),
    ("256 output channels: a tile's block of them", (2, 256, 6, 9), 256, (3, 3), (2, 2), (1, 1), (1, 1), 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups", SCATTERED,
                         ids=[c[0] for c in SCATTERED])
def test_the_input_grad_kernel_scatters_a_strided_layer(name, shape, cout, kernel, stride, padding, dilation, groups, dtype, microkernel):
    """The input gradient of a strided layer (or one padded past the kernel's reach): each tap's
    GEMM on a run of dY's pixels, added into the dX pixels it reaches (C's rows stride pixels
    apart), taps in (ki, kj) order (in bfloat16 of one group: phase convolutions, the test
    below), so within float32's (bfloat16's) rounding of float64; each image's result bitwise the
    same alone and on any thread count; the fake agrees (opcheck)."""
    if dtype == torch.bfloat16 and not has_bfloat16_microkernel():
        pytest.skip("no bfloat16 arithmetic for the micro-kernel here")
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(cout, shape[1] // groups, *kernel, generator=g) / 8).to(dtype)
    args = (list(stride), list(padding), list(dilation), groups)
    y_size = F.conv2d(torch.empty(shape), w.float(), None, *args).shape
    dy = torch.randn(y_size, generator=g).to(dtype).contiguous(memory_format=CL)

    def run(grad_output):
        dx = torch.full((grad_output.shape[0], *shape[1:]), float("nan"), dtype=dtype)
        dx = dx.contiguous(memory_format=CL)
        ops.implicit_conv2d_input_grad(grad_output, w, *args, dx)
        return dx

    ours = run(dy)
    ref = torch.nn.grad.conv2d_input(shape, w.double(), dy.double(), *args)
    tolerance = 2 ** -7 * ref.abs().max().item() if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(ours.double(), ref, rtol=0 if dtype == torch.bfloat16 else 1e-4, atol=tolerance)
    assert torch.equal(run(dy[1:2]), ours[1:2])
    assert_same_bits_on_one_and_three_threads(lambda: run(dy), ours)
    opcheck(ops.implicit_conv2d_input_grad.default, (dy, w, *args, run(dy)))


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
@pytest.mark.parametrize("layout", [CL, torch.contiguous_format], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("name, shape, cout, kernel, stride, padding, dilation, groups", CASES[:9], ids=[c[0] for c in CASES[:9]])
def test_bfloat16_on_the_implicit_route(name, shape, cout, kernel, stride, padding, dilation, groups, layout, microkernel):
    """bfloat16: each tap's products on the micro-kernel in bfloat16, summed in float32 over the
    taps and rounded once: within bfloat16's rounding of the float64 result, the input gradient
    too (the tap matrices in the VNNI layout, their taps reversed)."""
    if shape[1] // groups % 2 or cout // groups % 2:
        pytest.skip("bfloat16 takes the route with channels per group in pairs")
    if layout == torch.contiguous_format and not microkernel_outruns_mkl():
        pytest.skip("NCHW operands take the implicit route only where the micro-kernel outruns MKL")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(torch.bfloat16).contiguous(memory_format=layout).requires_grad_()
    w = (torch.randn(cout, shape[1] // groups, *kernel, generator=g) / 4).to(torch.bfloat16).requires_grad_()
    args = (stride, padding, dilation, groups)
    routes = torch_convbp.explain(x, w, *args)
    assert routes["forward"].route in ("implicit_nhwc", "grouped")
    y = torch_convbp.conv2d(x, w, None, *args)
    dy = torch.randn(y.shape, generator=g).to(torch.bfloat16).contiguous(memory_format=layout)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = F.conv2d(x64, w64, None, *args)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    for ours, ref in ((y, y64), (dx, dx64), (dw, dw64)):
        assert ours.dtype == torch.bfloat16
        # one rounding of a float32 sum: within 2^-8 of the largest magnitude
        torch.testing.assert_close(ours.double(), ref, rtol=0, atol=2 ** -7 * ref.abs().max().item())
    assert y.is_contiguous(memory_format=layout) and dx.is_contiguous(memory_format=layout)


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
def test_bfloat16_fed_nchw_through_layout_copies(monkeypatch):
    """bfloat16 NCHW operands take the route in NHWC through layout copies: the results come back
    NCHW, within bfloat16's rounding of the float64 result."""
    monkeypatch.delenv("TORCH_CONVBP_GEMM", raising=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, 14, 15, generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(128, 128, 3, 3, generator=g) / 16).to(torch.bfloat16).requires_grad_()
    routes = torch_convbp.explain(x, w, padding=1)
    assert routes["forward"].route == routes["input_grad"].route == "implicit_nhwc"
    y = torch_convbp.conv2d(x, w, padding=1)
    dy = torch.randn(y.shape, generator=g).to(torch.bfloat16)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = F.conv2d(x64, w64, padding=1)
    for ours, ref in zip((y, dx, dw), (y64, *torch.autograd.grad(y64, (x64, w64), dy.double()))):
        assert ours.dtype == torch.bfloat16 and ours.is_contiguous()
        torch.testing.assert_close(ours.double(), ref, rtol=0, atol=2 ** -7 * ref.abs().max().item())


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
def test_the_bfloat16_kernels_refuse_odd_channels(microkernel):
    x = torch.randn(1, 9, 5, 5).to(torch.bfloat16).contiguous(memory_format=CL)
    w = torch.randn(4, 9, 3, 3).to(torch.bfloat16)
    out = torch.empty(1, 4, 5, 5, dtype=torch.bfloat16).contiguous(memory_format=CL)
    with pytest.raises(RuntimeError, match="even number of input channels per group only.*got 9"):
        ops.implicit_conv2d(x, w, [1, 1], [1, 1], [1, 1], 1, out)
    assert torch_convbp.explain(x, w, padding=1)["forward"].route != "implicit_nhwc"


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
@pytest.mark.parametrize("kernel", ["forward", "input_grad"])
def test_bfloat16_padded_rows_in_chunks_and_blocks(kernel, microkernel):
    """bfloat16 of one group, undilated along the width, up to 256 input channels (here stride 1):
    the input copied into zero-padded planes in chunks of 2 MiB, blocks of pixels across rows,
    and a kernel row's taps in one call (csrc/cpu/implicit_nhwc_cpu.cpp). Here 6 images of 64x61
    padded pixels and 64 channels (about 0.5 MB each: 2 chunks), a 5x3 kernel: within bfloat16's
    rounding of float64, and each image's result bitwise the same alone."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 64, 60, 59, generator=g).to(torch.bfloat16).contiguous(memory_format=CL)
    # the input gradient's kernel takes dY (here x) and the convolution's own weight [Cout, Cin]
    w = (torch.randn(48, 64, 5, 3, generator=g) / 8).to(torch.bfloat16)
    if kernel == "input_grad":
        w = w.transpose(0, 1).contiguous()
    padding = [2, 1]
    op = ops.implicit_conv2d if kernel == "forward" else ops.implicit_conv2d_input_grad

    def run(batch):
        out = torch.empty(batch.shape[0], 48, 60, 59, dtype=torch.bfloat16).contiguous(memory_format=CL)
        op(batch, w, [1, 1], padding, [1, 1], 1, out)
        return out

    whole = run(x)
    if kernel == "forward":
        ref = F.conv2d(x.double(), w.double(), None, 1, padding)
    else:
        ref = torch.nn.grad.conv2d_input((6, 48, 60, 59), w.double(), x.double(), 1, padding)
    torch.testing.assert_close(whole.double(), ref, rtol=0, atol=2 ** -7 * ref.abs().max().item())
    assert torch.equal(run(x[4:5]), whole[4:5])
    before = torch.get_num_threads()
    try:
        for count in (1, 3, 16):  # a batch of one image still has 16 tiles (blocks of pixels)
            torch.set_num_threads(count)
            assert torch.equal(run(x[4:5]), whole[4:5])
    finally:
        torch.set_num_threads(before)


def check_a_bfloat16_kernel(op, source, weight, geometry, ref, image):
    """op (one group) of `source` into a NaN-filled channels_last result: within bfloat16's
    rounding of `ref` (float64), every pixel written, and image `image`'s result bit for bit alone
    and on 1 and 3 threads. `geometry`: (stride, padding, dilation)."""

    def run(batch):
        out = torch.full((batch.shape[0], *ref.shape[1:]), float("nan"), dtype=torch.bfloat16)
        out = out.contiguous(memory_format=CL)
        op(batch, weight, *(list(v) for v in geometry), 1, out)
        return out

    whole = run(source)
    torch.testing.assert_close(whole.double(), ref, rtol=0, atol=2 ** -7 * ref.abs().max().item())
    assert_same_bits_on_one_and_three_threads(lambda: run(source[image : image + 1]), whole[image : image + 1])


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
@pytest.mark.parametrize(
    "stride, padding, dilation",
    [((2, 2), (1, 1), (1, 1)), ((3, 2), (2, 0), (1, 1)), ((2, 1), (2, 1), (2, 1)), ((1, 3), (0, 4), (1, 1)), ((2, 2), (0, 0), (3, 1))],
    ids=["2x2", "3x2-asymmetric-padding", "2x1-dilated-rows", "1x3-padding-past-the-kernel", "2x2-unpadded-dilated-rows"],
)
def test_bfloat16_strided_forward_on_phase_planes(stride, padding, dilation, microkernel):
    """A strided bfloat16 forward of one group, undilated along the width, takes padded rows too:
    its padded rows in stride_h phase planes, its extended pixels stride_w apart
    (csrc/cpu/padded_planes.h). Here 5 images of 70x57 pixels and 64 channels (about 0.5 MB each:
    chunks of the padded copy), a 5x3 kernel: within bfloat16's rounding of float64, and each
    image's result bitwise the same alone and on any thread count."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 64, 70, 57, generator=g).to(torch.bfloat16).contiguous(memory_format=CL)
    w = (torch.randn(40, 64, 5, 3, generator=g) / 8).to(torch.bfloat16)
    ref = F.conv2d(x.double(), w.double(), None, stride, padding, dilation)
    check_a_bfloat16_kernel(ops.implicit_conv2d, x, w, (stride, padding, dilation), ref, image=3)


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
@pytest.mark.parametrize(
    "kernel_size, stride, padding, dilation",
    [
        ((3, 3), (2, 2), (1, 1), (1, 1)),
        ((5, 3), (3, 2), (2, 0), (1, 1)),
        ((3, 3), (2, 1), (2, 1), (2, 1)),
        ((3, 3), (1, 1), (3, 2), (1, 1)),
        ((2, 2), (3, 3), (0, 0), (1, 1)),
    ],
    ids=[
        "3x3-stride-2",
        "5x3-stride-3x2",
        "stride-2x1-dilated-rows",
        "stride-1-padding-past-the-kernel",
        "2x2-stride-3-phases-without-taps",
    ],
)
def test_bfloat16_input_grad_as_phase_convolutions(kernel_size, stride, padding, dilation, microkernel):
    """The input gradient of a bfloat16 layer of one group, undilated along the width, that is no
    stride-1 convolution of dY (strided, or padded past the kernel's reach) takes stride_h x
    stride_w phase convolutions of dY on one padded copy (csrc/cpu/padded_rows_cpu.cpp): dX pixel
    (i*sh + a, j*sw + b) is output (i, j) of phase (a, b), whose taps are those whose reach divides
    by the stride. Here 5 images of dY with 64 channels (chunks of the padded copy), phases of one
    tap, of two, and of none (a 2x2 kernel of stride 3: zeros): within bfloat16's rounding of
    float64, every dX pixel written, and each image's result bitwise the same alone and on any
    thread count."""
    g = torch.Generator().manual_seed(13)
    size = (5, 40, 61, 58)
    w = (torch.randn(64, 40, *kernel_size, generator=g) / 8).to(torch.bfloat16)
    out_shape = F.conv2d(torch.empty(size, device="meta"), w.to("meta"), None, stride, padding, dilation).shape
    dy = torch.randn(out_shape, generator=g).to(torch.bfloat16).contiguous(memory_format=CL)
    ref = torch.nn.grad.conv2d_input(size, w.double(), dy.double(), stride, padding, dilation)
    check_a_bfloat16_kernel(ops.implicit_conv2d_input_grad, dy, w, (stride, padding, dilation), ref, image=2)


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 arithmetic for the micro-kernel here")
@pytest.mark.parametrize("kernel", ["forward", "input_grad"])
@pytest.mark.parametrize("channels", [128, 130, 256, 258])
def test_bfloat16_stride_one_either_side_of_the_merged_channels(channels, kernel, microkernel):
    """bfloat16 of stride 1 and one group takes padded rows up to 128 input channels with
    AVX512_BF16, up to 256 on AMX, and the tiles of one tap a call above
    (csrc/cpu/implicit_nhwc_cpu.cpp, most_merged_channels): either side of both limits, within
    bfloat16's rounding of float64, and the same bits on any thread count."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, channels, 6, 7, generator=g).to(torch.bfloat16).contiguous(memory_format=CL)
    w = (torch.randn(32, channels, 3, 3, generator=g) / 16).to(torch.bfloat16)
    if kernel == "input_grad":  # its kernel takes dY (here x) and the layer's weight [Cout, Cin]
        w = w.transpose(0, 1).contiguous()
    op = ops.implicit_conv2d if kernel == "forward" else ops.implicit_conv2d_input_grad

    def run():
        out = torch.empty(2, 32, 6, 7, dtype=torch.bfloat16).contiguous(memory_format=CL)
        op(x, w, [1, 1], [1, 1], [1, 1], 1, out)
        return out

    ours = run()
    if kernel == "forward":
        ref = F.conv2d(x.double(), w.double(), None, 1, 1)
    else:
        ref = torch.nn.grad.conv2d_input((2, 32, 6, 7), w.double(), x.double(), 1, 1)
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=2 ** -7 * ref.abs().max().item())
    assert_same_bits_on_one_and_three_threads(run, ours)


DTYPES_OF_THE_ROUTE = [torch.float32] + ([torch.bfloat16] if has_bfloat16_microkernel() else [])


@pytest.mark.parametrize("dtype", DTYPES_OF_THE_ROUTE, ids=str)
@pytest.mark.parametrize("kernel", ["forward", "input_grad"])
@pytest.mark.parametrize("groups, kernel_size", [(1, (3, 3)), (2, (3, 2)), (1, (1, 1))], ids=["3x3", "groups-3x2", "1x1"])
def test_a_channels_last_weight_is_read_in_place(groups, kernel_size, kernel, dtype, microkernel):
    """The implicit route's forward and input gradient take a channels_last weight as it is, its
    tap matrices transposed from its own memory (csrc/cpu/implicit_nhwc_cpu.cpp,
    channels_last_tap_rows): the same bits as from the contiguous weight, through the op and
    through conv2d's autograd; a weight of neither layout is refused, naming both."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 32, 7, 9, generator=g).to(dtype).contiguous(memory_format=CL)
    w = (torch.randn(48, 32 // groups, *kernel_size, generator=g) / 8).to(dtype)
    pad = [k // 2 for k in kernel_size]
    y_size = F.conv2d(x.float(), w.float(), None, 1, pad, 1, groups).shape
    if kernel == "forward":
        op, a, size = ops.implicit_conv2d, x, y_size
    else:  # the layer's input gradient: dY of the forward's size, a result of the input's
        op, size = ops.implicit_conv2d_input_grad, x.shape
        a = torch.randn(y_size, generator=g).to(dtype).contiguous(memory_format=CL)

    def run(weight):
        out = torch.empty(size, dtype=dtype).contiguous(memory_format=CL)
        op(a, weight, [1, 1], pad, [1, 1], groups, out)
        return out

    from_contiguous = run(w)
    assert torch.equal(run(w.contiguous(memory_format=CL)), from_contiguous)
    out = torch.empty(size, dtype=dtype).contiguous(memory_format=CL)
    opcheck(op.default, (a, w.contiguous(memory_format=CL), [1, 1], pad, [1, 1], groups, out))
    every_other_channel = torch.cat([w, w], dim=1)[:, ::2]  # dense in neither layout
    with pytest.raises(RuntimeError, match=r"expected a contiguous or channels_last \(dense\) weight"):
        run(every_other_channel)
    xr = x.detach().requires_grad_()
    results = []
    for weight in (w, w.contiguous(memory_format=CL)):
        y = torch_convbp.conv2d(xr, weight, None, 1, pad, 1, groups)
        results.append((y, *torch.autograd.grad(y, xr, torch.ones_like(y))))
    (y, dx), (y_cl, dx_cl) = results
    assert torch.equal(y_cl, y) and torch.equal(dx_cl, dx)
