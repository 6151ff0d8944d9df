"""The operators as PyTorch sees them (opcheck, torch.compile), and the engine's properties:
im2col/col2im adjointness, determinism, the workspace limit."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from cases import CASES

ops = torch.ops.torch_convbp


def explicit_args(case):
    stride, pads, dilation, groups = case.explicit()
    return stride, (pads[0], pads[2]), dilation, groups


SYMMETRIC_CASES = [c for c in CASES if not isinstance(c.padding, str) and c.batch > 0][:8]


@pytest.mark.parametrize("case", SYMMETRIC_CASES, ids=str)
def test_opcheck(case, device):
    x, w, b = case.tensors(device=device, requires_grad=True)
    args = explicit_args(case)
    y = ops.conv2d(x, w, b, *args)
    g = torch.randn_like(y).requires_grad_()
    opcheck(ops.conv2d.default, (x, w, b, *args))
    opcheck(ops.conv2d_input_grad.default, (g, w, list(x.shape), *args))
    opcheck(ops.conv2d_weight_grad.default, (x, g, list(w.shape), *args))


def column_matrix(x, kernel, args, row_start, rows):
    (sh, sw), (ph, pw), (dh, dw), _ = args
    out_w = (x.shape[3] + 2 * pw - dw * (kernel[1] - 1) - 1) // sw + 1
    cols = x.new_empty(x.shape[1] * kernel[0] * kernel[1], x.shape[0] * rows * out_w)
    ops.im2col(x, kernel, (sh, sw), (ph, pw), (dh, dw), row_start, rows, cols)
    return cols


@pytest.mark.parametrize("case", SYMMETRIC_CASES, ids=str)
def test_im2col_col2im_opcheck_and_adjoint(case, device):
    """<im2col(x), c> == <x, col2im(c)>, for whole images and for a band of output rows."""
    x, w, _ = case.tensors(device=device)
    args = explicit_args(case)
    out_h = ops.conv2d(x, w, None, *args).shape[2]
    for row_start, rows in ((0, out_h), (out_h // 2, out_h - out_h // 2)):
        cols = column_matrix(x, case.kernel, args, row_start, rows)
        c = torch.randn_like(cols)
        back = torch.zeros_like(x)
        ops.col2im(c, case.kernel, *args[:3], row_start, rows, back)
        torch.testing.assert_close((cols * c).sum(), (x * back).sum(), rtol=1e-12, atol=1e-12)
        opcheck(ops.im2col.default, (x, case.kernel, *args[:3], row_start, rows, cols))
        opcheck(ops.col2im.default, (c, case.kernel, *args[:3], row_start, rows, back))


def nhwc_from_nchw_columns(cols, channels, kernel, groups):
    """The NCHW column matrix [(c, ki, kj), P] reordered into the NHWC one [G, P, (ki, kj, c')]."""
    kh, kw = kernel
    per_group = cols.view(groups, channels // groups, kh, kw, -1)
    return per_group.permute(0, 4, 2, 3, 1).reshape(groups, cols.shape[1], -1).contiguous()


@pytest.mark.parametrize("case", SYMMETRIC_CASES, ids=str)
def test_nhwc_columns_are_the_nchw_columns_reordered(case, device):
    """im2col_nhwc copies what im2col copies, into the NHWC order; col2im_nhwc sums every pixel's
    entries in col2im's order, so the same columns give the same bits. Both pass opcheck."""
    x, w, _ = case.tensors(device=device)
    args = explicit_args(case)
    x_cl, channels, groups = x.contiguous(memory_format=torch.channels_last), x.shape[1], args[3]
    out_h = ops.conv2d(x, w, None, *args).shape[2]
    for row_start, rows in ((0, out_h), (out_h // 2, out_h - out_h // 2)):
        cols = column_matrix(x, case.kernel, args, row_start, rows)
        expected = nhwc_from_nchw_columns(cols, channels, case.kernel, groups)
        nhwc = torch.full_like(expected, float("nan"))
        ops.im2col_nhwc(x_cl, case.kernel, *args[:3], row_start, rows, nhwc)
        assert torch.equal(nhwc, expected)

        c = torch.randn_like(cols)
        back = torch.randn_like(x)
        back_nhwc = back.contiguous(memory_format=torch.channels_last)
        c_nhwc = nhwc_from_nchw_columns(c, channels, case.kernel, groups)
        ops.col2im(c, case.kernel, *args[:3], row_start, rows, back)
        ops.col2im_nhwc(c_nhwc, case.kernel, *args[:3], row_start, rows, back_nhwc)
        assert torch.equal(back_nhwc, back)
        opcheck(ops.im2col_nhwc.default, (x_cl, case.kernel, *args[:3], row_start, rows, nhwc))
        opcheck(ops.col2im_nhwc.default, (c_nhwc, case.kernel, *args[:3], row_start, rows, back_nhwc))


@pytest.mark.parametrize(
    "stride, padding, dilation",
    [(1, 1, 1), (1, (2, 0), (1, 2)), (1, (3, 1), 1), (2, 1, 1), ((1, 2), 1, 1)],
    ids=["rotated-kernel", "rotated-kernel-asymmetric", "padding-past-reach", "strided", "strided-width"],
)
@pytest.mark.parametrize("limit", [None, 1], ids=["whole-images", "row-by-row"])
def test_input_grad_routes(stride, padding, dilation, limit, device):
    """A stride-1 grad-input is computed as the convolution of dY with the rotated, transposed
    kernel; padding past the kernel's reach and strides go through GEMM + col2im. Both routes
    match F.conv2d's gradient, in whole images and one output row at a time."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 9, 8, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(6, 2, 3, 2, dtype=torch.float64, device=device)
    args = dict(stride=stride, padding=padding, dilation=dilation, groups=2)
    y = F.conv2d(x, w, **args)
    g = torch.randn_like(y)
    (expected,) = torch.autograd.grad(y, x, g)
    pair = lambda v: (v, v) if isinstance(v, int) else v
    explicit = (pair(stride), pair(padding), pair(dilation), 2)
    with torch_convbp.workspace_limit(limit or torch_convbp.get_workspace_limit()):
        actual = ops.conv2d_input_grad(g, w, list(x.shape), *explicit)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_float32_columns_of_half_images(dtype, device):
    """For float32 GEMMs on half-precision images, im2col converts as it copies and col2im as it
    adds: the same as working on float32 images, then rounding the image once."""
    case = next(c for c in SYMMETRIC_CASES if c.name == "asymmetric_everything")
    x, _, _ = case.tensors(device=device, dtype=dtype)
    args = explicit_args(case)
    cols = column_matrix(x, case.kernel, args, 1, 2)
    wide = torch.empty_like(cols, dtype=torch.float32)
    ops.im2col(x, case.kernel, *args[:3], 1, 2, wide)
    assert torch.equal(wide, cols.float())
    c = torch.randn_like(wide)
    back, back32 = torch.zeros_like(x), torch.zeros_like(x, dtype=torch.float32)
    ops.col2im(c, case.kernel, *args[:3], 1, 2, back)
    ops.col2im(c, case.kernel, *args[:3], 1, 2, back32)
    assert torch.equal(back, back32.to(dtype))
    opcheck(ops.im2col.default, (x, case.kernel, *args[:3], 1, 2, wide))
    opcheck(ops.col2im.default, (c, case.kernel, *args[:3], 1, 2, back))


@pytest.mark.parametrize(
    "images, columns",
    [(torch.float32, torch.float64), (torch.float64, torch.float32), (torch.float32, torch.bfloat16)],
    ids=str,
)
def test_column_dtype_must_match_or_widen_half_images(images, columns):
    x = torch.randn(2, 4, 6, 6, dtype=images)
    message = "columns must have the images' dtype, or float32 for float16 and bfloat16 images"
    for device in ("cpu", "meta"):  # the operator and its fake kernel
        cols = torch.empty(4 * 9, 2 * 16, dtype=columns, device=device)
        with pytest.raises(RuntimeError, match=message):
            ops.im2col(x.to(device), (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, cols)
        with pytest.raises(RuntimeError, match=message):
            ops.col2im(cols, (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, x.to(device))


DEPTHWISE_CASES = [c for c in CASES if c.groups > 1 and c.groups == c.in_channels and c.batch > 0]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=str)
def test_depthwise_kernels_opcheck_and_adjoint(case, layout, device):
    """The direct depthwise kernels are each other's adjoints: <conv(x, w), g> equals
    <x, input_grad(g, w)> and <w, weight_grad(x, g)>; they hold no workspace. In both layouts."""
    x, w, _ = case.tensors(device=device)
    x = x.contiguous(memory_format=layout)
    stride, padding, dilation, _ = explicit_args(case)
    geometry = (stride, padding, dilation)
    torch_convbp.workspace_peak(reset=True)
    y = ops.conv2d(x, w, None, stride, padding, dilation, case.groups)
    assert torch_convbp.workspace_peak() == 0
    g = torch.randn_like(y)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    ops.depthwise_input_grad(g, w, *geometry, dx)
    ops.depthwise_weight_grad(x, g, *geometry, dw)
    product = (y * g).sum()
    torch.testing.assert_close((x * dx).sum(), product, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((w * dw).sum(), product, rtol=1e-12, atol=1e-12)
    opcheck(ops.depthwise_conv2d.default, (x, w, *geometry, torch.empty_like(y)))
    opcheck(ops.depthwise_input_grad.default, (g, w, *geometry, dx))
    opcheck(ops.depthwise_weight_grad.default, (x, g, *geometry, dw))


def test_depthwise_kernels_refuse_bad_arguments():
    x, w, g = torch.randn(2, 4, 6, 6), torch.randn(4, 1, 3, 3), torch.randn(2, 4, 4, 4)
    geometry = ((1, 1), (0, 0), (1, 1))
    with pytest.raises(RuntimeError, match=r"expected output of size \[2, 4, 4, 4\], got \[2, 4, 5, 5\]"):
        ops.depthwise_conv2d(x, w, *geometry, torch.empty(2, 4, 5, 5))
    with pytest.raises(RuntimeError, match="expected input and output both contiguous or both channels_last"):
        ops.depthwise_conv2d(x.transpose(2, 3), w, *geometry, torch.empty_like(g))
    with pytest.raises(RuntimeError, match="expected a contiguous weight"):
        ops.depthwise_conv2d(x, w.transpose(2, 3), *geometry, torch.empty_like(g))
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        ops.depthwise_weight_grad(x, g.double(), *geometry, torch.empty_like(w))


def test_im2col_layout():
    """Row (c, ki, kj), column (image, oh, ow): checked entry by entry on a small case."""
    x = torch.arange(2 * 2 * 3 * 4, dtype=torch.float64).view(2, 2, 3, 4)
    cols = column_matrix(x, (2, 2), ((1, 1), (1, 0), (1, 1), 1), 0, 4).view(2, 2, 2, 2, 4, 3)
    for c, ki, kj, n, oh, ow in torch.cartesian_prod(*[torch.arange(s) for s in cols.shape]).tolist():
        ih, iw = oh - 1 + ki, ow + kj
        expected = x[n, c, ih, iw] if 0 <= ih < 3 else 0.0
        assert cols[c, ki, kj, n, oh, ow] == expected


def test_torch_compile_fullgraph_converted_model():
    torch._dynamo.reset()
    model = torch_convbp.convert(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, groups=2), nn.Conv2d(8, 4, 1))
    )
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 3, 10, 10)
    torch.testing.assert_close(compiled(x), model(x))
    compiled(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)


# The functions and the operators they call: conv2d/conv1d, conv3d, and the transposed ones
# (the input gradients, plus the bias in Python). (function, input size, weight size)
FUNCTION_CALLS = [
    ("conv2d", (1, 3, 6, 6), (4, 3, 3, 3), "conv2d"),
    ("conv1d", (1, 3, 6), (4, 3, 3), "conv2d"),
    ("conv_transpose2d", (1, 3, 6, 6), (3, 4, 3, 3), "conv2d_input_grad"),
    ("conv3d", (1, 3, 4, 4, 4), (4, 3, 3, 3, 3), "conv3d"),
    ("conv_transpose3d", (1, 3, 4, 4, 4), (3, 4, 3, 3, 3), "conv3d_input_grad"),
]


class RecordingTensor(torch.Tensor):
    """A tensor subclass whose __torch_function__ records what is called on it."""

    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


class RecordingMode(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("function, input_size, weight_size, operator", FUNCTION_CALLS, ids=[c[0] for c in FUNCTION_CALLS])
def test_eager_calls_skip_torch_ops_unless_torch_function_would_see_it(function, input_size, weight_size, operator,
                                                                        monkeypatch):
    """In eager code the functions call the operators directly (_C.conv2d, ...: less host time,
    benchmarks/NOTES.md section 90), every dispatch key still seeing them. Where __torch_function__
    would be offered the torch.ops call (a tensor subclass's, a torch function mode's), they call
    torch.ops, and the subclass comes back as from F."""
    ours, theirs = getattr(torch_convbp, function), getattr(F, function)
    x, w, b = torch.randn(input_size), torch.randn(weight_size), torch.randn(4)
    direct = []
    from torch_convbp import functional

    for dims, calls in list(functional._DIRECT_CALLS.items()):
        recorded = [lambda *args, call=call, name=call.__name__: direct.append(name) or call(*args) for call in calls]
        monkeypatch.setitem(functional._DIRECT_CALLS, dims, tuple(recorded))
    torch.testing.assert_close(ours(x, w, b), theirs(x, w, b))
    assert direct == [operator]

    RecordingTensor.calls = []
    y = ours(x.as_subclass(RecordingTensor), w, b)
    assert type(y) is type(theirs(x.as_subclass(RecordingTensor), w, b)) is RecordingTensor
    assert getattr(ops, operator) in RecordingTensor.calls
    with RecordingMode() as mode:
        torch.testing.assert_close(ours(x, w, b), theirs(x, w, b))
    assert getattr(ops, operator) in mode.calls
    assert direct == [operator]



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_is_bitwise_repeatable(device, dtype):
    torch.manual_seed(0)
    x = torch.randn(16, 8, 12, 12, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(16, 4, 3, 3, device=device, dtype=dtype, requires_grad=True)

    def grads():
        y = torch_convbp.conv2d(x, w, None, 1, 1, 1, 2)
        return torch.autograd.grad(y, (x, w), torch.ones_like(y))

    torch_convbp.set_workspace_limit(200_000)  # several chunks, several lanes
    first = grads()
    for _ in range(5):
        for a, b in zip(first, grads()):
            assert torch.equal(a, b)


def test_depthwise_gradients_do_not_depend_on_the_thread_count():
    """The direct depthwise kernels give each thread whole planes or weight rows and sum in a fixed
    order, so their results are bitwise the same on 1 thread and on several."""
    torch.manual_seed(0)
    x = torch.randn(6, 8, 15, 13, requires_grad=True)
    w = torch.randn(16, 1, 3, 3, requires_grad=True)

    def grads():
        y = torch_convbp.conv2d(x, w, None, (2, 1), 1, 1, 8)
        return (y, *torch.autograd.grad(y, (x, w), torch.cos(y)))

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = grads()
        torch.set_num_threads(max(threads, 2))
        parallel = grads()
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(serial, parallel):
        assert torch.equal(a, b)


CHUNKED_CASES = ("asymmetric_everything", "many_images", "pointwise", "dilated", "stride2_pad1")


@pytest.mark.parametrize("limit", [1, 5_000, 60_000])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in CHUNKED_CASES], ids=str)
def test_chunked_equals_unchunked(case, limit, device):
    """A small workspace limit (down to one output row per chunk) changes nothing but memory."""
    x, w, b = case.tensors(device=device, requires_grad=True)

    def run():
        y = torch_convbp.conv2d(x, w, b, **case.args())
        return (y, *torch.autograd.grad(y, (x, w, b), torch.cos(y)))

    whole = run()
    with torch_convbp.workspace_limit(limit):
        chunked = run()
    for a, e in zip(chunked, whole):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["forward", "weight_grad", "input_grad"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_workspace_limit_bounds_memory(op, batch):
    """The workspace never exceeds the limit; here the column matrix of one image (9.4 MB) is far
    larger than the limits, so it is taken a few output rows at a time."""
    x = torch.randn(batch, 64, 64, 64)
    w = torch.randn(8, 64, 3, 3)
    g = torch.randn(batch, 8, 64, 64)
    args = ((1, 1), (1, 1), (1, 1), 1)
    call = {
        "forward": lambda: ops.conv2d(x, w, None, *args),
        "weight_grad": lambda: ops.conv2d_weight_grad(x, g, list(w.shape), *args),
        "input_grad": lambda: ops.conv2d_input_grad(g, w, list(x.shape), *args),
    }[op]
    full = call()
    for limit in (1 << 20, 300_000):
        torch_convbp.set_workspace_limit(limit)
        torch_convbp.workspace_peak(reset=True)
        torch.testing.assert_close(call(), full, rtol=1e-4, atol=1e-3)  # float32 sums, reordered
        assert 0 < torch_convbp.workspace_peak() <= limit
    torch_convbp.set_workspace_limit(1 << 30)
    torch_convbp.workspace_peak(reset=True)
    call()
    assert torch_convbp.workspace_peak() > 1 << 20  # the limit is what made the difference


def test_workspace_limit_settings():
    torch_convbp.set_workspace_limit("2M")
    assert torch_convbp.get_workspace_limit() == 2 << 20
    with torch_convbp.workspace_limit(4096):
        assert torch_convbp.get_workspace_limit() == 4096
    assert torch_convbp.get_workspace_limit() == 2 << 20
    with pytest.raises(ValueError, match="positive size"):
        torch_convbp.set_workspace_limit("lots")
    with pytest.raises(RuntimeError, match="must be positive"):
        torch_convbp.set_workspace_limit(0)


def test_workspace_limit_from_environment():
    import subprocess
    import sys

    code = "import torch_convbp; print(torch_convbp.get_workspace_limit())"
    env = {**__import__("os").environ, "TORCH_CONVBP_WORKSPACE_LIMIT": "64M"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == 64 << 20
