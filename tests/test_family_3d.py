"""conv3d and conv_transpose3d: the same engine with a depth. Values and gradients in float64
against torch.nn.functional and the tap-by-tap definition, gradcheck and gradgradcheck, opcheck of
every operator call, torch.compile (static and dynamic), the memory format, what they refuse, and
the properties of the engine: the same bits on any thread count, the workspace bound, the
half-precision dtypes and autocast."""
import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck
from torch.library import opcheck

import torch_convbp
from family_cases import VOLUME_CASES, tapwise_convolution, tapwise_transposed_convolution
from test_family import OperatorCalls
from test_threads import RESULTS, assert_same_bits, results_of, threads
from test_values import TOL, relayout, values_and_grads

NONEMPTY = [c for c in VOLUME_CASES if c.batch != 0]
CL3D = torch.channels_last_3d
ops = torch.ops.torch_convbp


@pytest.mark.parametrize("layout", ["contiguous", "non_contiguous", "channels_last"])
@pytest.mark.parametrize("case", VOLUME_CASES, ids=str)
def test_matches_torch_nn_functional(case, layout):
    if layout == "channels_last" and case.batch is None:
        pytest.skip("channels_last_3d is a layout of 5-D tensors")
    x, w, b = case.tensors(requires_grad=True)
    x, w = relayout(x, layout), relayout(w, layout)
    ours = values_and_grads(case.ours, x, w, b)
    ref = values_and_grads(case.reference, x, w, b)
    assert ours[0].shape == ref[0].shape
    for a, e in zip(ours, ref):
        torch.testing.assert_close(a, e, **TOL)
    # float64 volumes: F.conv3d falls back to ATen's contiguous-only kernels; ours keep the format.
    channels_last = layout == "channels_last" and case.batch > 0
    assert ours[0].is_contiguous(memory_format=CL3D if channels_last else torch.contiguous_format)


@pytest.mark.parametrize("function", ["conv3d", "conv_transpose3d"])
@pytest.mark.parametrize("operand", ["input", "weight"])
def test_channels_last_3d_in_channels_last_3d_out_as_f_decides(function, operand):
    """In float32, where F runs oneDNN, the output's memory format is F's: channels_last_3d when
    the input or the weight is."""
    x = torch.randn(2, 4, 5, 6, 7)
    w = torch.randn(4, 4, 3, 3, 3)
    if operand == "input":
        x = x.contiguous(memory_format=CL3D)
    else:
        w = w.contiguous(memory_format=CL3D)
    y, y_ref = getattr(torch_convbp, function)(x, w, padding=1), getattr(F, function)(x, w, padding=1)
    assert y_ref.is_contiguous(memory_format=CL3D) and not y_ref.is_contiguous()
    assert y.is_contiguous(memory_format=CL3D) and not y.is_contiguous()
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [c for c in NONEMPTY if c.batch is not None and not isinstance(c.padding, str)], ids=str)
def test_matches_the_definition(case):
    """Against the sum (or scatter) over kernel taps that defines the convolution: neither F nor
    a column matrix."""
    x, w, b = case.tensors()
    args = case.kwargs()
    if case.transposed:
        expected = tapwise_transposed_convolution(
            x, w, b, args["stride"], args["padding"], args["output_padding"], args["dilation"], case.groups)
    else:
        expected = tapwise_convolution(x, w, b, args["stride"], args["padding"], args["dilation"], case.groups)
    torch.testing.assert_close(case.ours(x, w, b), expected, **TOL)


@pytest.mark.parametrize("case", NONEMPTY, ids=str)
def test_gradcheck_and_gradgradcheck(case):
    """The first order entry by entry; the second order as gradgradcheck's random projections
    (fast_mode). The second order calls the same three operators, whose values and gradients the
    tests above check entry by entry; what it adds is the nodes' wiring (which operator, which
    arguments), which a projection checks as well. The 2-D operators, whose nodes are the same
    templates (csrc/autograd.cpp), get the full second-order check (test_family.py,
    test_gradients.py); here it took 42 of the suite's seconds (benchmarks/NOTES.md, section 83)."""
    tensors = [t for t in case.tensors(requires_grad=True) if t is not None]
    fn = lambda x, w, *b: case.ours(x, w, b[0] if b else None)
    assert gradcheck(fn, tensors)
    assert gradgradcheck(fn, tensors, fast_mode=True)


@pytest.mark.parametrize("case", NONEMPTY, ids=str)
def test_opcheck_every_operator_call(case):
    """The forward and backward call the three 3-D operators; each call passes opcheck: schema,
    fake kernel, autograd registration."""
    x, w, b = case.tensors(requires_grad=True)
    with OperatorCalls() as recorder:
        y = case.ours(x, w, b)
        torch.autograd.grad(y, (x, w), torch.ones_like(y))
    assert {func._opname for func, _ in recorder.calls} >= {"conv3d_input_grad", "conv3d_weight_grad"}
    for func, args in recorder.calls:
        args = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
        opcheck(func, args)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("function", ["conv3d", "conv_transpose3d"])
def test_torch_compile_fullgraph(function, dynamic):
    case = next(c for c in NONEMPTY if c.function == function and c.groups > 1)
    compiled = torch.compile(lambda x, w, b: case.ours(x, w, b), fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for batch in (2, 3) if dynamic else (2,):
        x, w, b = case.tensors(requires_grad=True)
        x = torch.cat([x] * 2)[:batch].detach().requires_grad_()
        y, y_eager = compiled(x, w, b), case.ours(x, w, b)
        torch.testing.assert_close(y, y_eager, **TOL)
        g = torch.randn_like(y)
        for a, e in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(y_eager, (x, w, b), g)):
            torch.testing.assert_close(a, e, **TOL)


def test_conv_transpose3d_is_the_input_gradient_of_conv3d():
    """<conv3d(x, W), g> = <x, conv_transpose3d(g, W)>."""
    x = torch.randn(2, 4, 7, 6, 5, dtype=torch.float64)
    w = torch.randn(6, 2, 3, 2, 3, dtype=torch.float64)
    args = dict(stride=(2, 1, 2), padding=(1, 0, 1), groups=2)
    y = torch_convbp.conv3d(x, w, None, **args)
    g = torch.randn_like(y)
    transposed = torch_convbp.conv_transpose3d(g, w, None, output_padding=(0, 0, 0), **args)
    assert transposed.shape == x.shape
    torch.testing.assert_close((y * g).sum(), (x * transposed).sum(), **TOL)


x5, w5, wt5 = torch.randn(2, 4, 5, 5, 5), torch.randn(6, 2, 3, 3, 3), torch.randn(4, 3, 3, 3, 3)


@pytest.mark.parametrize(
    "call, f_refuses_too, error, match",
    [
        ("conv3d(x5, w5, groups=4)", True, RuntimeError, "must be divisible by groups"),
        ("conv3d(x5, w5)", True, RuntimeError, "to have 2 channels, but got 4 channels"),
        ("conv3d(x5, w5, groups=2, stride=(1, 0, 1))", True, RuntimeError, "stride must be positive"),
        ("conv3d(x5, w5, groups=2, dilation=(1, 1, 0))", True, RuntimeError, "dilation must be positive"),
        ("conv3d(x5, w5, groups=2, padding=(0, -1, 0))", True, RuntimeError, "padding must be non-negative"),
        ("conv3d(x5, w5, groups=0)", True, RuntimeError, "groups must be positive"),
        ("conv3d(x5, w5, groups=2, dilation=(3, 1, 1))", True, RuntimeError,
         r"padded input size per channel \(5 x 5 x 5\) is smaller than the dilated kernel \(7 x 3 x 3\)"),
        ("conv3d(x5[:, :, :0], w5, groups=2)", True, RuntimeError, "input depth, height and width must be non-zero"),
        ("conv3d(x5, w5[:, :, :1, :0], groups=2)", True, RuntimeError, "weight must have non-zero sizes"),
        ("conv3d(x5, w5, torch.zeros(5), groups=2)", True, RuntimeError, r"expected bias of size \[6\]"),
        ("conv3d(x5, w5.double(), groups=2)", True, RuntimeError, "must have the same dtype"),
        ("conv3d(x5[0, 0], w5)", True, RuntimeError, r"expected 4D \(unbatched\) or 5D \(batched\) input"),
        ("conv3d(x5[None], w5)", True, RuntimeError, r"expected 4D \(unbatched\) or 5D \(batched\) input"),
        ("conv3d(x5, w5[0], groups=2)", True, RuntimeError, "expected a 5-D weight"),
        ("conv3d(x5, w5[..., 0], groups=2, padding='same')", True, RuntimeError, "expected a 5-D weight"),
        ("conv3d(x5, w5, groups=2, stride=(1, 1))", True, ValueError, "stride to be a single integer value or a list of 3"),
        ("conv3d(x5, w5, groups=2, padding=(1, 1))", True, ValueError, "padding to be a single integer value or a list of 3"),
        ("conv3d(x5, w5, groups=2, stride=(1, 2, 1), padding='same')", True, ValueError, "'same' is not supported for strided"),
        ("conv3d(x5, w5, groups=2, padding='full')", False, ValueError, "invalid padding string 'full'"),
        ("conv3d(x5.long(), w5.long(), groups=2)", False, RuntimeError, "must be float64, float32, float16 or bfloat16"),
        ("conv3d(x5.to_sparse(), w5, groups=2)", True, RuntimeError, "dense"),
        ("conv_transpose3d(x5, wt5, stride=2, output_padding=2)", True, RuntimeError, "output_padding must be smaller than either stride or dilation"),
        ("conv_transpose3d(x5, wt5, output_padding=(0, 0, -1))", True, RuntimeError, "output_padding must be non-negative"),
        ("conv_transpose3d(x5, wt5, stride=(1, 1, 0))", True, RuntimeError, "stride and dilation must be positive"),
        ("conv_transpose3d(x5, wt5, groups=3)", True, RuntimeError, "must be divisible by groups"),
        ("conv_transpose3d(x5[:, :3], wt5)", True, RuntimeError, "to have 4 channels .* but got 3 channels"),
        ("conv_transpose3d(x5, wt5, padding=(0, 4, 0))", True, RuntimeError, r"output size per channel \(7 x -1 x 7\) must be positive"),
        ("conv_transpose3d(x5, wt5, torch.randn(4))", True, RuntimeError, r"expected bias of size \[3\]"),
        ("conv_transpose3d(x5[None], wt5)", True, RuntimeError, r"expected 4D \(unbatched\) or 5D \(batched\) input"),
        ("conv_transpose3d(x5, wt5[0])", True, RuntimeError, "expected a 5-D weight"),
        ("conv_transpose3d(x5, wt5, output_padding=(0, 0))", True, ValueError, "output_padding to be a single integer value or a list of 3"),
    ],
    ids=lambda v: v if isinstance(v, str) and "(" in v else "",
)
def test_refused_with_a_clear_message(call, f_refuses_too, error, match):
    scope = dict(torch=torch, x5=x5, w5=w5, wt5=wt5)
    with pytest.raises(error, match=match):
        eval("torch_convbp." + call, dict(scope, torch_convbp=torch_convbp))
    if f_refuses_too:  # torch.nn.functional refuses it too (in its own words)
        with pytest.raises(Exception):
            eval("F." + call, dict(scope, F=F))


S3 = ((1, 1, 1), (0, 0, 0), (1, 1, 1))  # stride, padding, dilation


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda d: ops.conv3d(x5.to(d), w5.to(d), None, (1, 1), (0, 0, 0), (1, 1, 1), 2), r"expected stride to have 3 values \(depth, height, width\)"),
        (lambda d: ops.conv3d(x5[0].to(d), w5.to(d), None, *S3, 2), r"expected a 5-D input \[N, C, D, H, W\]"),
        (lambda d: ops.conv3d(x5.to(d), w5[0].to(d), None, *S3, 2), r"expected a 5-D weight \[out_channels, in_channels/groups, kD, kH, kW\]"),
        (lambda d: ops.conv3d_input_grad(torch.randn(2, 6, 3, 3, 2, device=d), w5.to(d), [2, 4, 5, 5, 5], *S3, 2),
         r"expected grad_output of size \[2, 6, 3, 3, 3\]"),
        (lambda d: ops.conv3d_input_grad(torch.randn(2, 6, 3, 3, 3, device=d), w5.to(d), [2, 4, -5, 5, 5], *S3, 2),
         "input size must be non-negative"),
        (lambda d: ops.conv3d_weight_grad(x5.to(d), torch.randn(2, 6, 3, 3, 3, device=d), [6, 2, 3, 3, 3], *S3, 4),
         "must be divisible by groups"),
        (lambda d: ops.im2col(x5.to(d), (3, 3), *S3, 0, 9, torch.empty(5, device=d)),
         "expected kernel_size to have 3 values, one per spatial dimension"),
        (lambda d: ops.im2col(x5.to(d), (3, 3, 3), *S3, 4, 6, torch.empty(4 * 27 * 2 * 6 * 3, device=d)),
         r"output rows \[4, 10\) are outside the output rows \(depth slices times rows\) 9"),
        (lambda d: ops.im2col_nhwc(x5.to(d), (3, 3, 3), *S3, 0, 9, torch.empty(1, 54, 108, device=d)),
         "expected dense channels_last images"),
    ],
    ids=["stride-pair", "4-D input", "4-D weight", "grad_output", "negative input size", "groups", "kernel_size", "rows",
         "nhwc images"],
)
def test_operators_and_their_fakes_refuse_alike(call, match):
    for device in ("cpu", "meta"):
        with pytest.raises(RuntimeError, match=match):
            call(device)


# name: (input size, out channels, kernel, stride, padding, dilation, groups, workspace limit)
VOLUME_LAYERS = {
    "many-small-volumes": ((6, 8, 4, 6, 6), 16, (3, 3, 3), 1, 1, 1, 1, None),
    "one-volume-in-row-bands": ((1, 4, 6, 20, 18), 8, (3, 3, 3), 1, 1, 1, 1, 40_000),
    "strided-asymmetric-grouped": ((3, 12, 5, 9, 8), 18, (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 1), 3, None),
    "wide-groups-bands": ((2, 16, 4, 11, 9), 16, (3, 3, 3), (1, 2, 2), 1, 1, 1, 60_000),
    # channels_last_3d float32 on a CPU with the GEMM micro-kernel: the implicit route's tiles of
    # volumes (csrc/cpu/implicit_nhwc_cpu.cpp), bands of rows across depth slices and volumes
    "implicit-volume-tiles": ((3, 16, 5, 14, 15), 24, (3, 3, 3), 1, 1, 1, 1, None),
    "pointwise-shortcut": ((4, 16, 4, 8, 8), 32, (1, 1, 1), (1, 2, 2), 0, 1, 1, None),
    "depthwise": ((2, 16, 4, 7, 7), 16, (3, 3, 3), 1, 1, 1, 16, None),
    "depthwise-multiplier-2-strided-in-depth": ((3, 8, 5, 9, 8), 16, (3, 3, 3), (2, 1, 2), (1, 1, 0), (2, 1, 1), 8, None),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last_3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layer", list(VOLUME_LAYERS))
def test_same_bits_on_any_thread_count(layer, dtype, channels_last):
    runs = {}
    for count in (1, 2, 3):
        with threads(count):
            runs[count] = results_of(VOLUME_LAYERS[layer], dtype, channels_last, torch_convbp.conv3d)
    assert_same_bits(runs)


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last_3d"])
@pytest.mark.parametrize("layer", list(VOLUME_LAYERS))
def test_the_cut_computes_the_convolution(layer, channels_last):
    """The bands and blocks (under each layer's workspace limit) add up to F.conv3d, in float64."""
    ours = results_of(VOLUME_LAYERS[layer], torch.float64, channels_last, torch_convbp.conv3d)
    expected = results_of(VOLUME_LAYERS[layer], torch.float64, channels_last, F.conv3d)
    for name, got, want in zip(RESULTS, ours, expected):
        torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{name}: {m}")


def test_a_scaled_down_pytorch_128947_runs_in_64_mib():
    """pytorch#128947: a conv3d over [1, 256, 5, 1090, 1922] asked for 161 GiB. Scaled down to
    [1, 32, 5, 272, 480] its whole column matrix would be 2.1 GiB; under a 64 MiB workspace limit
    the call takes bands of output rows and gives F.conv3d's values and gradients."""
    torch.manual_seed(0)
    x = torch.randn(1, 32, 5, 272, 480, requires_grad=True)
    w = torch.randn(8, 32, 3, 3, 3, requires_grad=True)
    assert 32 * 27 * 5 * 272 * 480 * 4 > 2 << 30
    limit = 64 << 20
    with torch_convbp.workspace_limit(limit):
        torch_convbp.workspace_peak(reset=True)
        y = torch_convbp.conv3d(x, w, padding=1)
        g = torch.randn_like(y)
        grads = torch.autograd.grad(y, (x, w), g)
        assert 0 < torch_convbp.workspace_peak() <= limit
    y_ref = F.conv3d(x, w, padding=1)
    grads_ref = torch.autograd.grad(y_ref, (x, w), g)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(grads[0], grads_ref[0], rtol=1e-4, atol=1e-3)
    # Sums of 530 thousand float32 products: relative to the gradient's scale.
    torch.testing.assert_close(grads[1], grads_ref[1], rtol=0, atol=1e-4 * grads_ref[1].abs().max().item())


@pytest.mark.slow
def test_a_volume_past_2_to_the_31_elements():
    """An input of 2.2e9 elements (8.6 GiB in float32): offsets into it pass 2^31, and its column
    matrix is taken a band at a time under the default 1 GiB limit. The far end of the output,
    where the offsets are largest, matches F.conv3d on the slices it reads."""
    x = torch.empty(1, 2, 1030, 1040, 1040)
    x.fill_(0.5)
    assert x.numel() > 2**31
    x[:, :, -6:].normal_(generator=torch.Generator().manual_seed(0))
    w = torch.randn(3, 2, 3, 3, 3, generator=torch.Generator().manual_seed(1))
    torch_convbp.workspace_peak(reset=True)
    y = torch_convbp.conv3d(x, w, stride=2)
    assert torch_convbp.workspace_peak() <= torch_convbp.get_workspace_limit()
    expected = F.conv3d(x[:, :, -8:], w, stride=2)  # output slices 511..513 read input slices 1022..1029
    torch.testing.assert_close(y[:, :, -3:], expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y[:, :, :2], F.conv3d(x[:, :, :5], w, stride=2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("function", ["conv3d", "conv_transpose3d"])
def test_low_precision_values_and_grads(function, dtype):
    """Each dtype against float64 computed by F, within the dtype's own rounding."""
    case = next(c for c in NONEMPTY if c.function == function and c.name == "asymmetric-everything")
    x, w, b = case.tensors(requires_grad=True)
    y = case.reference(x, w, b)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
    expected = (y, *torch.autograd.grad(y, (x, w, b), g))
    low = [t.detach().to(dtype).requires_grad_() for t in (x, w, b)]
    y = case.ours(*low)
    got = (y, *torch.autograd.grad(y, low, g.to(dtype)))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=1e-1)
    for a, e in zip(got, expected):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), e, **tol)


def test_autocast_runs_in_the_autocast_dtype():
    x, w, b = torch.randn(2, 4, 4, 5, 5), torch.randn(6, 4, 3, 3, 3), torch.randn(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_ref = torch_convbp.conv3d(x, w, b, padding=1), F.conv3d(x, w, b, padding=1)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=5e-2)
