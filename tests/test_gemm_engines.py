"""The two GEMM engines: ATen's GEMM (MKL on the CPU, small products of one group called on it
straight) and our driver on oneDNN's micro-kernel (csrc/cpu/microkernel_gemm.cpp), which runs
float32 CPU GEMMs where gemm_engine() says so.

The driver takes matrices in any orientation (NHWC's transposed views, a weight gradient's
transposed columns), cuts them into tiles fixed by the sizes, and must give the product for every
one of them; both engines must give the convolution, and TORCH_CONVBP_GEMM picks one."""
import itertools
import os

import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from route_cases import (has_bfloat16_microkernel, has_microkernel, microkernel_outruns_mkl, microkernel_runs_narrow_gemms,
                         runs_avx512_kernels)
from torch_convbp import _C

ops = torch.ops.torch_convbp


needs_microkernel = pytest.mark.skipif(not has_microkernel(), reason="no GEMM micro-kernel here (x86 with AVX2, oneDNN on)")


def matrices(g, rows, cols, orientation, generator, dtype=torch.float32):
    """[g, rows, cols]: row-major, column-major (a transposed view), strided in both
    dimensions (every other element of a larger tensor), or one matrix broadcast over g."""
    if orientation == "row_major":
        return torch.randn(g, rows, cols, generator=generator, dtype=dtype)
    if orientation == "column_major":
        return torch.randn(g, cols, rows, generator=generator, dtype=dtype).transpose(1, 2)
    if orientation == "strided":
        return torch.randn(g, 2 * rows, 2 * cols, generator=generator, dtype=dtype)[:, ::2, ::2]
    assert orientation == "broadcast"
    return torch.randn(1, rows, cols, generator=generator, dtype=dtype).expand(g, rows, cols)


ORIENTATIONS = ("row_major", "column_major", "strided")
# (M, N, K): one tile, edges of the tiles (K over 256 and N over 128, in odd sizes), a single
# row, column or product, sizes that cut into several tiles of K and of N, and a short K beside
# several of the wider tiles of N that it allows (over 512 columns)
SIZES = [(5, 7, 3), (1, 1, 1), (1, 300, 1), (300, 1, 513), (64, 129, 257), (130, 400, 600), (40, 1100, 64)]


@needs_microkernel
@pytest.mark.parametrize("accumulate", [False, True], ids=["write", "accumulate"])
@pytest.mark.parametrize("out_o, a_o, b_o", list(itertools.product(ORIENTATIONS, repeat=3)))
@pytest.mark.parametrize("m, n, k", SIZES, ids=[f"{m}x{n}x{k}" for m, n, k in SIZES])
def test_the_driver_multiplies_matrices_in_every_orientation(m, n, k, out_o, a_o, b_o, accumulate):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    a, b = matrices(2, m, k, a_o, gen), matrices(2, k, n, b_o, gen)
    out = matrices(2, m, n, out_o, gen)
    before = out.double()
    _C._microkernel_gemm(out, a, b, accumulate)
    expected = torch.bmm(a.double(), b.double()) + (before if accumulate else 0)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_microkernel
def test_the_driver_takes_a_broadcast_matrix_and_empty_products():
    gen = torch.Generator().manual_seed(0)
    a, b = matrices(3, 20, 30, "broadcast", gen), matrices(3, 30, 40, "row_major", gen)
    out = torch.empty(3, 20, 40)
    _C._microkernel_gemm(out, a, b, False)
    torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-5, atol=1e-4)
    # K = 0: a zero result, or the result left as it was where accumulating
    out = torch.full((2, 4, 5), 7.0)
    _C._microkernel_gemm(out, torch.empty(2, 4, 0), torch.empty(2, 0, 5), True)
    assert torch.equal(out, torch.full((2, 4, 5), 7.0))
    _C._microkernel_gemm(out, torch.empty(2, 4, 0), torch.empty(2, 0, 5), False)
    assert torch.equal(out, torch.zeros(2, 4, 5))
    _C._microkernel_gemm(torch.empty(2, 0, 5), torch.empty(2, 0, 3), torch.empty(2, 3, 5), False)


@needs_microkernel
def test_the_driver_gives_the_same_bits_for_the_same_sizes():
    """Whatever the operands' orientation and position in memory: the tiles and the order of each
    element's sums follow the sizes alone."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(1, 70, 600, generator=gen), torch.randn(1, 600, 300, generator=gen)
    results = []
    for a_view, b_view in [(a, b), (a.transpose(1, 2).contiguous().transpose(1, 2), b),
                           (a, b.transpose(1, 2).contiguous().transpose(1, 2))]:
        out = torch.empty(1, 70, 300)
        _C._microkernel_gemm(out, a_view, b_view, False)
        results.append(out)
    for other in results[1:]:
        assert torch.equal(results[0], other)


# and a short K's wide tiles of N beside more rows than its staged sums take at once
BF16_SIZES = [(5, 7, 3), (1, 300, 1), (64, 129, 257), (130, 40, 513), (17, 33, 2), (600, 700, 64)]


@pytest.mark.skipif(not has_bfloat16_microkernel(), reason="no bfloat16 micro-kernel here (AVX512_BF16 or AMX-BF16)")
@pytest.mark.parametrize("result", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("accumulate", [False, True], ids=["write", "accumulate"])
@pytest.mark.parametrize("out_o, a_o, b_o", list(itertools.product(ORIENTATIONS, repeat=3)))
@pytest.mark.parametrize("m, n, k", BF16_SIZES, ids=[f"{m}x{n}x{k}" for m, n, k in BF16_SIZES])
def test_the_driver_multiplies_bfloat16_in_every_orientation(m, n, k, out_o, a_o, b_o, accumulate, result):
    """bfloat16 operands, their products summed in float32 (odd K padded), the result rounded
    once: within half a bfloat16 ulp of the float64 product (and float32 sums' error)."""
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    a, b = (matrices(2, *size, o, gen).bfloat16() for size, o in (((m, k), a_o), ((k, n), b_o)))
    out = matrices(2, m, n, out_o, gen).to(result)
    before = out.double()
    _C._microkernel_gemm(out, a, b, accumulate)
    exact = torch.bmm(a.double(), b.double()) + (before if accumulate else 0)
    rounding = exact.abs() * (2.0 ** -8 if result == torch.bfloat16 else 0)  # 8 significant bits
    sums = (a.double().abs() @ b.double().abs() + before.abs()) * 2.0 ** -22
    assert ((out.double() - exact).abs() <= rounding + sums + 1e-30).all()


def test_the_drivers_entry_refuses_what_it_cannot_multiply():
    with pytest.raises(RuntimeError, match="expected 3-D float32 or bfloat16 CPU tensors"):
        _C._microkernel_gemm(torch.empty(1, 2, 3, dtype=torch.float64), torch.empty(1, 2, 4), torch.empty(1, 4, 3), False)
    with pytest.raises(RuntimeError, match="expected operands of one dtype and a result in it or in float32"):
        _C._microkernel_gemm(torch.empty(1, 2, 3), torch.empty(1, 2, 4, dtype=torch.bfloat16), torch.empty(1, 4, 3), False)
    with pytest.raises(RuntimeError, match=r"cannot multiply \[1, 2, 4\] by \[1, 5, 3\] into \[1, 2, 3\]"):
        _C._microkernel_gemm(torch.empty(1, 2, 3), torch.empty(1, 2, 4), torch.empty(1, 5, 3), False)


# ATen's engine: a small product of one group goes to BLAS straight, without at::addmm_ around it
# (host time: csrc/cpu/blas_gemm_cpu.cpp), with the BLAS call at::addmm_ makes, so its bits.
# (M, N, K): sides of 1, whose leading dimensions BLAS still checks, and the largest product taken
BLAS_SIZES = [(5, 7, 3), (1, 1, 1), (1, 9, 4), (9, 1, 4), (6, 5, 1), (16, 16, 16)]
blas_runs = _C._blas_gemm(torch.zeros(1, 1, 1), torch.ones(1, 1, 1), torch.ones(1, 1, 1), False)


@pytest.mark.skipif(not blas_runs, reason="no BLAS that at::addmm_ calls for small products here (x86-64 with MKL)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("accumulate", [False, True], ids=["write", "accumulate"])
@pytest.mark.parametrize("out_o, a_o, b_o", list(itertools.product(ORIENTATIONS, repeat=3)))
@pytest.mark.parametrize("m, n, k", BLAS_SIZES, ids=[f"{m}x{n}x{k}" for m, n, k in BLAS_SIZES])
def test_a_small_product_on_blas_has_the_bits_of_addmm(m, n, k, out_o, a_o, b_o, accumulate, dtype):
    """Row- or column-major matrices: the product of at::addmm_ on the same matrices, bit for
    bit. A matrix strided in both dimensions, which at::addmm_ copies first, is left to it."""
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a, b = matrices(1, m, k, a_o, gen, dtype), matrices(1, k, n, b_o, gen, dtype)
    out = matrices(1, m, n, out_o, gen, dtype)
    expected = out.clone()
    expected[0].addmm_(a[0], b[0], beta=1 if accumulate else 0)
    took = _C._blas_gemm(out, a, b, accumulate)
    assert took == ("strided" not in (out_o, a_o, b_o))
    if took:
        assert torch.equal(out, expected)


@pytest.mark.skipif(not blas_runs, reason="no BLAS that at::addmm_ calls for small products here (x86-64 with MKL)")
@pytest.mark.parametrize("out, a, b", [
    (torch.zeros(1, 17, 16), torch.ones(1, 17, 16), torch.ones(1, 16, 16)),  # over 16^3 multiply-adds
    (torch.zeros(2, 4, 5), torch.ones(2, 4, 3), torch.ones(2, 3, 5)),  # two groups: at::bmm's
    (torch.zeros(1, 4, 5, dtype=torch.bfloat16), torch.ones(1, 4, 3, dtype=torch.bfloat16),
     torch.ones(1, 3, 5, dtype=torch.bfloat16)),
    (torch.zeros(1, 4, 5), torch.ones(1, 4, 0), torch.ones(1, 0, 5)),  # K = 0: at::addmm_'s zeros
], ids=["large", "groups", "bfloat16", "empty"])
def test_other_products_are_left_to_addmm(out, a, b):
    assert not _C._blas_gemm(out, a, b, False)
    assert not out.any()


# (name, input size, out channels, kernel, stride, padding, dilation, groups)
LAYERS = [
    ("3x3", (3, 16, 11, 9), 24, 3, 1, 1, 1, 1),
    ("strided, grouped", (2, 32, 12, 13), 64, 3, 2, 1, 1, 2),
    ("1x1", (2, 40, 7, 9), 72, 1, 1, 0, 1, 1),
    ("1x1 strided", (2, 40, 9, 9), 36, 1, 2, 0, 1, 1),
    ("deep, dilated", (2, 130, 6, 7), 260, 3, 1, 2, 2, 1),
    # the weight gradient's GEMM fed channels_last, dW [64, 147] over the pixels, ends its rows in a
    # part of a vector: the micro-kernel driver computes it transposed
    ("an RGB stem", (2, 3, 30, 29), 64, 7, 2, 3, 1, 1),
]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("engine", ["mkl", "microkernel"])
@pytest.mark.parametrize("name, size, cout, kernel, stride, padding, dilation, groups", LAYERS, ids=[c[0] for c in LAYERS])
def test_both_engines_give_the_convolution(name, size, cout, kernel, stride, padding, dilation, groups, engine, channels_last,
                                           monkeypatch):
    """Float32 on either engine against F.conv2d in float64: the output and both gradients."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", engine)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, generator=gen)
    w = torch.randn(cout, size[1] // groups, kernel, kernel, generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    w.requires_grad_()
    args = (stride, padding, dilation, groups)
    y = torch_convbp.conv2d(x, w, None, *args)
    dy = torch.randn(y.shape, generator=gen)
    ours = (y, *torch.autograd.grad(y, (x, w), dy))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = F.conv2d(x64, w64, None, *args)
    expected = (y64, *torch.autograd.grad(y64, (x64, w64), dy.double()))
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-4)


def test_which_engine_runs_the_gemms(monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "mkl")
    assert torch_convbp.gemm_engine(torch.float32) == "aten"
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "microkernel")
    assert torch_convbp.gemm_engine(torch.float32) == ("microkernel" if has_microkernel() else "aten")
    # float64 GEMMs, and GEMMs off the CPU, are ATen's
    assert torch_convbp.gemm_engine(torch.float64) == "aten"
    assert torch_convbp.gemm_engine(torch.float32, "cuda") == "aten"
    # bfloat16 GEMMs run on the micro-kernel where the CPU has bfloat16 arithmetic, else in
    # float32 (gemm_dtype), on the float32 engine
    assert torch_convbp.gemm_engine(torch.bfloat16) == (
        "microkernel" if has_bfloat16_microkernel() else torch_convbp.gemm_engine(torch.float32))
    # one GEMM, by its result's shape: float32 results under 16 on a side on ATen's however forced
    assert torch_convbp.gemm_engine(torch.float32, result=(15, 300)) == "aten"
    assert torch_convbp.gemm_engine(torch.float32, result=(300, 16)) == torch_convbp.gemm_engine(torch.float32)
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "mkl")
    assert torch_convbp.gemm_engine(torch.float32, result=(64, 64)) == "aten"
    with pytest.raises(ValueError, match=r"result must be \(rows, cols\) of sizes >= 0, got \(-1, 4\)"):
        torch_convbp.gemm_engine(torch.float32, result=(-1, 4))
    with pytest.raises(ValueError, match=r"result must be \(rows, cols\) of sizes >= 0, got \(2, 3, 4\)"):
        torch_convbp.gemm_engine(torch.float32, result=(2, 3, 4))
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "fastest")
    with pytest.raises(RuntimeError, match="TORCH_CONVBP_GEMM must be auto, microkernel or mkl, got 'fastest'"):
        torch_convbp.gemm_engine(torch.float32)


def cpu_is_amd():
    with open("/proc/cpuinfo") as cpuinfo:
        return "AuthenticAMD" in cpuinfo.read()


def onednn_capped_below_avx2():
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return cap in ("SSE41", "AVX")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU's vendor from /proc/cpuinfo")
def test_the_float32_engine_by_cpu_and_result_width(monkeypatch):
    """The default rule: on an AMD CPU that runs AVX-512 kernels every float32 GEMM of 16 or more
    on a side runs on the micro-kernel (benchmarks/NOTES.md, section 36); on an AMD CPU without
    them (its oneDNN not capped below AVX2) those at most 256 columns wide, where the driver ran
    faster than MKL on a Zen 1, the wider ones on MKL, where it ran slower (sections 115, 117);
    on other CPUs every one on MKL (an AVX-512 Xeon's MKL ran at the core's peak: section 26)."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "auto")
    amd = cpu_is_amd() and has_microkernel()
    every = amd and runs_avx512_kernels()
    narrow = amd and not runs_avx512_kernels() and not onednn_capped_below_avx2()
    assert microkernel_outruns_mkl() == every and microkernel_runs_narrow_gemms() == narrow
    expected = {(3136, 256): every or narrow, (16, 64): every or narrow, (64, 257): every, (196, 1024): every,
                (15, 64): False, (3136, 8): False}
    for shape, on_microkernel in expected.items():
        assert torch_convbp.gemm_engine(torch.float32, result=shape) == ("microkernel" if on_microkernel else "aten"), shape
    assert torch_convbp.gemm_engine(torch.float64, result=(64, 64)) == "aten"
    assert torch_convbp.gemm_engine(torch.float32, "cuda", result=(64, 64)) == "aten"


@pytest.mark.skipif(not microkernel_runs_narrow_gemms(), reason="float32 GEMMs by their width: AMD CPUs without AVX-512")
def test_a_convolutions_gemms_take_the_engine_of_their_width(monkeypatch):
    """Channels_last 1x1 forwards, [pixels, C] @ [C, Cout]: Cout 256 on the micro-kernel, 320 on
    MKL, each GEMM whole on one engine (its blocks of rows too)."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "auto")
    x = torch.randn(2, 64, 16, 16).contiguous(memory_format=torch.channels_last)
    for cout, name in [(256, "torch_convbp::microkernel_gemm"), (320, "aten::addmm_")]:
        w = torch.randn(cout, 64, 1, 1)
        with torch.profiler.profile() as profile:
            y = ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1)
        names = {event.name for event in profile.events()}
        assert name in names and not {"aten::addmm_", "torch_convbp::microkernel_gemm"} - {name} & names, cout
        torch.testing.assert_close(y.double(), F.conv2d(x.double(), w.double()), rtol=1e-5, atol=1e-4)


@needs_microkernel
def test_the_gemms_run_on_the_engine_chosen(monkeypatch):
    """The profiler sees each GEMM block as aten::addmm_ on ATen's engine, and as
    torch_convbp::microkernel_gemm on the driver (a strided weight gradient: the columns route
    on either; a stride-1 one may take the implicit route, which has no GEMM blocks)."""
    x, dy = torch.randn(2, 16, 10, 10), torch.randn(2, 32, 5, 5)
    for engine, name in [("mkl", "aten::addmm_"), ("microkernel", "torch_convbp::microkernel_gemm")]:
        monkeypatch.setenv("TORCH_CONVBP_GEMM", engine)
        with torch.profiler.profile() as profile:
            ops.conv2d_weight_grad(x, dy, [32, 16, 3, 3], [2, 2], [1, 1], [1, 1], 1)
        names = {event.name for event in profile.events()}
        assert name in names and not {"aten::addmm_", "torch_convbp::microkernel_gemm"} - {name} & names


@needs_microkernel
@pytest.mark.parametrize("cout", [24, 48])
@pytest.mark.parametrize("op", ["forward", "input_grad", "weight_grad"])
def test_the_channels_last_1x1_gemms_run_on_the_micro_kernel_where_avx512_runs(monkeypatch, op, cout):
    """The channels_last 1x1 forward and input gradient, [pixels, C] @ [C, Cout], run on the
    micro-kernel wherever the CPU runs AVX-512 kernels (faster there than MKL on a Xeon too:
    benchmarks/NOTES.md, section 73); the weight gradient follows the CPU's rule, which on AMD
    CPUs without AVX-512 puts these results (24 to 48 wide) on it too (section 117), but for
    a weight gradient of more output than input channels, dY^T [Cout, P] @ X [P, C], which ran
    slower there on a Zen 3 (section 124)."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "auto")
    x = torch.randn(2, 32, 12, 12).contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, 32, 1, 1)
    dy = torch.randn(2, cout, 12, 12).contiguous(memory_format=torch.channels_last)
    calls = {
        "forward": lambda: ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1),
        "input_grad": lambda: ops.conv2d_input_grad(dy, w, list(x.shape), [1, 1], [0, 0], [1, 1], 1),
        "weight_grad": lambda: ops.conv2d_weight_grad(x, dy, list(w.shape), [1, 1], [0, 0], [1, 1], 1),
    }
    with torch.profiler.profile() as profile:
        calls[op]()
    names = {event.name for event in profile.events()}
    by_call = op != "weight_grad" and runs_avx512_kernels()
    by_width = microkernel_runs_narrow_gemms() and not (op == "weight_grad" and cout > 32)
    on_microkernel = microkernel_outruns_mkl() or by_call or by_width
    assert ("torch_convbp::microkernel_gemm" in names) == on_microkernel
    assert ("aten::addmm_" in names) != on_microkernel


@needs_microkernel
@pytest.mark.parametrize("plane", [7, 14])
@pytest.mark.parametrize("op", ["forward", "input_grad"])
def test_the_nchw_1x1_products_of_a_plane_run_on_the_micro_kernel_where_measured_faster(monkeypatch, op, plane):
    """Fed NCHW, a 1x1 layer's forward and input gradient are products per image whose results
    are the plane's pixels wide, W [Cout, C] @ X [C, H*W]: narrow, but on an AVX2 Zen 3 slower on
    the micro-kernel than on MKL (benchmarks/NOTES.md, section 124), so the narrow-results rule
    of AMD CPUs without AVX-512 leaves them on MKL. The input gradient of planes of at most 64
    pixels runs on the micro-kernel wherever AVX-512 kernels run, or the narrow rule holds
    (section 122); every product wherever the micro-kernel outruns MKL."""
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "auto")
    x, w = torch.randn(2, 64, plane, plane), torch.randn(32, 64, 1, 1)
    dy = torch.randn(2, 32, plane, plane)
    assert torch_convbp.explain(x, w)[op].route == "pointwise_by_images"
    call = {"forward": lambda: ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1),
            "input_grad": lambda: ops.conv2d_input_grad(dy, w, list(x.shape), [1, 1], [0, 0], [1, 1], 1)}[op]
    with torch.profiler.profile() as profile:
        result = call()
    names = {event.name for event in profile.events()}
    small_plane_grad = op == "input_grad" and plane * plane <= 64
    on_microkernel = microkernel_outruns_mkl() or (small_plane_grad and (runs_avx512_kernels() or microkernel_runs_narrow_gemms()))
    assert ("torch_convbp::microkernel_gemm" in names) == on_microkernel
    expected = (F.conv2d(x.double(), w.double()) if op == "forward"
                else torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double()))
    torch.testing.assert_close(result.double(), expected, rtol=1e-5, atol=1e-4)
