"""float32, bfloat16 and float16 against F.conv2d, and autocast."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from cases import CASES

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", DTYPE_CASES, ids=str)
def test_low_precision_values_and_grads(case, dtype, device):
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_weight_grad_accumulates_chunks_in_float32(dtype):
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
