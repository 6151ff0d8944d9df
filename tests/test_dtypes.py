"""float32, bfloat16 and float16 against F.conv2d, both ways of running half-precision GEMMs,
and autocast."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from cases import CASES
from route_cases import has_bfloat16_microkernel

# Relative to the largest magnitude of the float64 result: float16/bfloat16 round the inputs,
# the GEMM output and the column matrix once each, and accumulate in float32.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPE_CASES = [c for c in CASES if c.batch > 0 and c.name in (
    "basic", "asymmetric_everything", "same_even_kernel_dilated", "depthwise", "pointwise", "many_images")]


def assert_near(actual, expected, dtype):
    assert actual.dtype == dtype
    scale = expected.abs().max().clamp_min(1.0)
    err = (actual.double() - expected).abs().max()
    assert err <= TOLERANCE[dtype] * scale, f"{err} > {TOLERANCE[dtype]} * {scale}"


@pytest.fixture(params=["auto", "native", "float32"])
def half_gemm(request, monkeypatch):
    """Half-precision GEMMs by the default rule (bfloat16 on our micro-kernel driver where the CPU
    has bfloat16 arithmetic), natively on ATen's GEMMs, or in float32 on float32 column matrices:
    all are tested wherever the test runs."""
    monkeypatch.setenv("TORCH_CONVBP_HALF_GEMM", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", DTYPE_CASES, ids=str)
def test_low_precision_values_and_grads(case, dtype, device, half_gemm):
    x, w, b = case.tensors(dtype=dtype, device=device, requires_grad=True)
    y = torch_convbp.conv2d(x, w, b, **case.args())
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), g)
    # The reference: float64 on the same (rounded) values.
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = F.conv2d(x64, w64, b64, **case.args())
    grads64 = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    assert_near(y, y64, dtype)
    for a, e in zip(grads, grads64):
        assert_near(a, e, dtype)


@pytest.mark.parametrize("setting", ["float32", "auto"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_float32_gemms_round_each_result_once(dtype, setting, device, monkeypatch):
    """With float32 GEMMs, every output and gradient entry is its float64 value rounded once to
    the dtype, up to float32's own error: within half a unit in the last place, plus a little.
    So too with bfloat16 GEMMs on the micro-kernel (the default where the CPU computes bfloat16):
    their products are exact in float32 and summed in float32, the strided input gradient's
    columns included."""
    if setting == "auto" and (device != "cpu" or dtype != torch.bfloat16 or not has_bfloat16_microkernel()):
        pytest.skip("bfloat16 GEMMs on the CPU's micro-kernel only")
    monkeypatch.setenv("TORCH_CONVBP_HALF_GEMM", setting)
    torch.manual_seed(0)
    x = torch.randn(3, 6, 11, 9, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(8, 3, 3, 2, dtype=dtype, device=device, requires_grad=True)
    args = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    y = torch_convbp.conv2d(x, w, **args)
    g = torch.randn_like(y)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    y64 = F.conv2d(x64, w64, **args)
    actual = (y, *torch.autograd.grad(y, (x, w), g))
    expected = (y64, *torch.autograd.grad(y64, (x64, w64), g.double()))
    half_ulp = torch.finfo(dtype).eps / 2  # relative rounding error of one rounding
    for a, e in zip(actual, expected):
        bound = half_ulp * e.abs() + 1e-5 * e.abs().max()
        assert ((a.double() - e).abs() <= bound).all()


def sums_of_pairs(dtype, device):
    """An input [1, 2, 8, 64] whose two channels' sums are exact in float32 (exponents close), and
    whose rounding to bfloat16 or float16 meets every case: halfway ties to even, to odd, values
    just off a tie, zeros, NaN, infinities, and sums beyond the dtype's largest value."""
    torch.manual_seed(0)
    first = torch.randn(8, 64).to(dtype)
    second = (first.float() * torch.empty(8, 64).uniform_(-1, 1)).to(dtype)
    eps, big = torch.finfo(dtype).eps, torch.finfo(dtype).max
    special = [(1.0, eps / 2), (1.0 + eps, eps / 2), (1.0, eps / 2 + eps / 8), (-1.0 - eps, -eps / 2),
               (0.0, -0.0), (float("nan"), 1.0), (float("inf"), 1.0),
               (float("-inf"), 2.0), (big, big), (-big, -big), (big, -big)]
    for i, (a, b) in enumerate(special):
        first[0, i], second[0, i] = a, b
    return torch.stack([first, second]).unsqueeze(0).to(device)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_half_precision_output_is_its_float32_sum_rounded_as_torch_rounds(dtype, memory_format, device, half_gemm):
    """y = x0 + x1 through a 1x1 convolution whose weights are ones: each output is the float32
    sum rounded once, bit for bit as torch rounds float32 to the dtype (infinities, ties to even
    and all; a NaN stays a NaN, whose bits torch's own conversions do not agree on), whichever
    route and GEMM computes it."""
    x = sums_of_pairs(dtype, device).contiguous(memory_format=memory_format)
    y = torch_convbp.conv2d(x, torch.ones(3, 2, 1, 1, dtype=dtype, device=device))
    expected = (x[:, 0].float() + x[:, 1].float()).to(dtype)
    for channel in range(3):
        got = y[:, channel]
        assert torch.equal(got.isnan(), expected.isnan())
        bits = [torch.where(t.isnan(), 0.0, t).view(torch.int16) for t in (got, expected)]
        assert torch.equal(*bits)


def test_gemm_dtype_tells_which_dtype_the_gemms_run_in(monkeypatch):
    monkeypatch.delenv("TORCH_CONVBP_HALF_GEMM", raising=False)
    assert torch_convbp.gemm_dtype(torch.float64) == torch.float64
    assert torch_convbp.gemm_dtype(torch.float32, "cuda") == torch.float32
    assert torch_convbp.gemm_dtype(torch.bfloat16, "cuda") == torch.bfloat16
    # on the CPU, bfloat16 GEMMs on the micro-kernel where the CPU has bfloat16 arithmetic, else
    # float32 GEMMs; float16 always in float32
    assert torch_convbp.gemm_dtype(torch.bfloat16) == (torch.bfloat16 if has_bfloat16_microkernel() else torch.float32)
    assert torch_convbp.gemm_dtype(torch.float16) == torch.float32
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "mkl")  # not on the micro-kernel: float32
    assert torch_convbp.gemm_dtype(torch.bfloat16) == torch.float32
    monkeypatch.delenv("TORCH_CONVBP_GEMM")
    monkeypatch.setenv("TORCH_CONVBP_HALF_GEMM", "float32")
    assert torch_convbp.gemm_dtype(torch.float16, "cuda") == torch.float32
    monkeypatch.setenv("TORCH_CONVBP_HALF_GEMM", "native")
    assert torch_convbp.gemm_dtype(torch.bfloat16) == torch.bfloat16


def test_half_gemm_setting_is_checked(monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_HALF_GEMM", "fast")
    x = torch.randn(1, 2, 5, 5, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="TORCH_CONVBP_HALF_GEMM must be auto, native or float32, got 'fast'"):
        torch_convbp.conv2d(x, torch.randn(2, 2, 3, 3, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_weight_grad_accumulates_chunks_in_float32(dtype, half_gemm):
    """Many chunks summed in float32: as accurate as one chunk."""
    torch.manual_seed(0)
    x = torch.randn(32, 4, 8, 8, dtype=dtype)
    g = torch.randn(32, 4, 8, 8, dtype=dtype)
    args = ((1, 1), (1, 1), (1, 1), 1)
    exact = torch.ops.torch_convbp.conv2d_weight_grad(x.double(), g.double(), [4, 4, 3, 3], *args)
    with torch_convbp.workspace_limit(1):  # one output row per chunk: 256 chunks
        chunked = torch.ops.torch_convbp.conv2d_weight_grad(x, g, [4, 4, 3, 3], *args)
    assert_near(chunked, exact, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_runs_in_the_autocast_dtype(dtype, device):
    if device == "cpu" and dtype == torch.float16 and not torch.amp.is_autocast_available("cpu"):
        pytest.skip("no CPU autocast")
    x = torch.randn(2, 3, 8, 8, device=device)
    conv = torch_convbp.Conv2d(3, 4, 3, padding=1).to(device)
    reference = torch.nn.Conv2d(3, 4, 3, padding=1).to(device)
    reference.load_state_dict(conv.state_dict())
    with torch.autocast(device, dtype=dtype):
        y = conv(x)
        y_ref = reference(x)
    assert y.dtype == y_ref.dtype == dtype
    assert_near(y, y_ref.double(), dtype)
    y.float().sum().backward()
    assert conv.weight.grad.dtype == torch.float32
