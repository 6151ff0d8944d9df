"""CUDA-only properties: agreement with the CPU, streams, repeatability, large indices.
(Every other test runs on CUDA too, through the `device` fixture.)"""
import pytest
import torch

import torch_convbp
from cases import CASES
from family_cases import VOLUME_CASES

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch_convbp.CUDA_KERNELS), reason="needs a CUDA device and the CUDA kernels"
)
ops = torch.ops.torch_convbp


def explicit_args(case):
    stride, pads, dilation, groups = case.explicit()
    return stride, (pads[0], pads[2]), dilation, groups


@pytest.mark.parametrize("case", [c for c in CASES if not isinstance(c.padding, str) and c.batch > 0], ids=str)
def test_column_kernels_match_the_cpu_bitwise(case):
    """im2col copies; col2im sums in the same order on both devices: bitwise equal in float64."""
    x, w, _ = case.tensors()
    args = explicit_args(case)
    out_h, out_w = ops.conv2d(x, w, None, *args).shape[2:]
    cols = {d: x.new_empty(x.shape[1] * case.kernel[0] * case.kernel[1], x.shape[0] * out_h * out_w, device=d) for d in ("cpu", "cuda")}
    for d in cols:
        ops.im2col(x.to(d), case.kernel, *args[:3], 0, out_h, cols[d])
    assert torch.equal(cols["cpu"], cols["cuda"].cpu())
    c = torch.randn_like(cols["cpu"])
    back = {d: torch.zeros_like(x, device=d) for d in ("cpu", "cuda")}
    for d in back:
        ops.col2im(c.to(d), case.kernel, *args[:3], 0, out_h, back[d])
    assert torch.equal(back["cpu"], back["cuda"].cpu())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case_name", ["asymmetric_everything", "depthwise_asymmetric"])
def test_cuda_agrees_with_cpu(dtype, case_name):
    case = next(c for c in CASES if c.name == case_name)
    results = {}
    for d in ("cpu", "cuda"):
        x, w, b = case.tensors(dtype=torch.float32, device=d, requires_grad=False)
        x, w = (t.to(dtype).requires_grad_() for t in (x, w))
        y = torch_convbp.conv2d(x, w, None, **case.args())
        results[d] = [t.double().cpu() for t in (y, *torch.autograd.grad(y, (x, w), torch.ones_like(y)))]
    tol = {torch.float64: 1e-12, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    for a, b in zip(results["cpu"], results["cuda"]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d], ids=["ncdhw", "channels_last_3d"])
@pytest.mark.parametrize("case", [c for c in VOLUME_CASES if c.batch], ids=str)
def test_volumes_on_cuda_agree_with_the_cpu(case, layout):
    """conv3d and conv_transpose3d on the GPU (vol2col and col2vol in both layouts): values and
    gradients equal the CPU's to float64 rounding, and the backward repeats bit for bit."""
    results = {}
    for d in ("cpu", "cuda"):
        x, w, b = (t if t is None else t.to(d) for t in case.tensors())
        x, w = (t.contiguous(memory_format=layout).requires_grad_() for t in (x, w))
        b = b if b is None else b.requires_grad_()
        inputs = [t for t in (x, w, b) if t is not None]
        y = case.ours(x, w, b)
        g = torch.cos(torch.arange(y.numel(), dtype=y.dtype, device=d)).view(y.shape)
        results[d] = [y, *torch.autograd.grad(y, inputs, g)]
        if d == "cuda":
            again = torch.autograd.grad(case.ours(x, w, b), inputs, g)
            assert all(torch.equal(a, b) for a, b in zip(results[d][1:], again))
    for a, b in zip(results["cpu"], results["cuda"]):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-12, atol=1e-12)


def test_runs_on_the_current_stream():
    """On a side stream, the forward and both gradients equal those computed on the default
    stream: every kernel, copy and GEMM follows the current stream (else the side stream's
    results would be read before they are written, or written after they are read)."""
    x = torch.randn(8, 16, 32, 32, device="cuda", requires_grad=True)
    w = torch.randn(16, 16, 3, 3, device="cuda", requires_grad=True)
    expected = torch_convbp.conv2d(x, w, padding=1)
    expected_grads = torch.autograd.grad(expected, (x, w), torch.ones_like(expected))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = torch_convbp.conv2d(x, w, padding=1)
        grads = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(y, expected)
    for got, want in zip(grads, expected_grads):
        assert torch.equal(got, want)  # the backward is deterministic: the same bits


def test_backward_is_bitwise_repeatable_with_many_chunks():
    torch.manual_seed(0)
    x = torch.randn(32, 16, 20, 20, device="cuda", requires_grad=True)
    w = torch.randn(32, 8, 3, 3, device="cuda", requires_grad=True)
    with torch_convbp.workspace_limit(300_000):
        runs = []
        for _ in range(4):
            y = torch_convbp.conv2d(x, w, None, 2, 1, 1, 2)
            runs.append(torch.autograd.grad(y, (x, w), torch.ones_like(y)))
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a, b)


def test_on_a_second_device_under_its_guard():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    x = torch.randn(2, 3, 8, 8, device="cuda:1")
    w = torch.randn(4, 3, 3, 3, device="cuda:1")
    torch.testing.assert_close(torch_convbp.conv2d(x, w).cpu(), torch_convbp.conv2d(x.cpu(), w.cpu()), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_input_past_2_to_the_31_elements():
    """An input of 2^31 + elements (8.6 GB in float32): 64-bit indexing in every kernel. The
    output and both gradients of the last output rows are checked against F.conv2d on the slice
    of the input that they read, and the input gradient is zero everywhere else."""
    free, _ = torch.cuda.mem_get_info()
    if free < 48 << 30:
        pytest.skip("needs about 48 GB of free GPU memory")
    x = torch.randn(1, 2, 32768 + 8, 32768, device="cuda", dtype=torch.float32, requires_grad=True)
    assert x.numel() > 2**31
    w = torch.randn(1, 2, 3, 3, device="cuda", requires_grad=True)
    with torch_convbp.workspace_limit(1 << 30):
        y = torch_convbp.conv2d(x, w, padding=1)
        # Output rows H-4..H-2 see input rows H-5..H-1: the far end of the 64-bit index range.
        tail = y[..., -4:-1, :]
        gx, gw = torch.autograd.grad(tail.sum(), (x, w))
    x_tail = x.detach()[..., -5:, :].clone().requires_grad_()
    ref_tail = torch.nn.functional.conv2d(x_tail, w, padding=(0, 1))
    gx_ref, gw_ref = torch.autograd.grad(ref_tail.sum(), (x_tail, w))
    torch.testing.assert_close(tail, ref_tail, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gx[..., -5:, :], gx_ref, rtol=1e-4, atol=1e-4)
    assert gx[..., :-5, :].abs().max().item() == 0
    # A sum over 3 x 32768 positions per entry: compared at the gradient's scale.
    torch.testing.assert_close(gw, gw_ref, rtol=1e-4, atol=1e-4 * gw_ref.abs().max().item())
