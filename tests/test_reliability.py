"""Proof under stress: random configurations (hypothesis), non-finite values, threads, memory
over many steps, the workspace bound across batch sizes, and a column matrix past 2^31."""
import os
import threading

import pytest
import torch
import torch.nn.functional as F

import torch_convbp

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# CI runs a short fuzz; TORCH_CONVBP_FUZZ_EXAMPLES=5000 runs a long one.
EXAMPLES = int(os.environ.get("TORCH_CONVBP_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize="CI" in os.environ)


@st.composite
def valid_configs(draw, dims=2):
    """A convolution F accepts, of 2 or 3 spatial dimensions, with tensors small enough to fuzz."""
    small = (lambda lo, hi: st.integers(lo, min(hi, 2))) if dims == 3 else st.integers
    tuple_of = lambda strategy: tuple(draw(strategy) for _ in range(dims))
    groups = draw(st.integers(1, 3))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    kernel = tuple_of(small(1, 4))
    dilation = tuple_of(small(1, 3))
    padding = draw(st.one_of(st.just("same"), st.just("valid"), st.tuples(*[st.integers(0, 3)] * dims)))
    stride = (1,) * dims if padding == "same" else tuple_of(st.integers(1, 3))
    pads = (0,) * dims if isinstance(padding, str) else padding
    size = [max(1, d * (k - 1) + 1 - 2 * p) + draw(small(0, 4)) for d, k, p in zip(dilation, kernel, pads)]
    return dict(
        dims=dims, batch=draw(st.integers(0, 3)), cin=cin, cout=cout, size=size, kernel=kernel, stride=stride,
        padding=padding, dilation=dilation, groups=groups, bias=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "channels_last", "non_contiguous", "unbatched"])),
        limit=draw(st.sampled_from([1 << 30, 2048, 1])),
    )


def make_tensors(cfg, dtype=torch.float64):
    x = torch.randn(cfg["batch"], cfg["cin"], *cfg["size"], dtype=dtype)
    if cfg["layout"] == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d if x.dim() == 5 else torch.channels_last)
    elif cfg["layout"] == "non_contiguous":
        x = x.transpose(2, 3).contiguous().transpose(2, 3)
    elif cfg["layout"] == "unbatched":
        x = torch.randn(cfg["cin"], *cfg["size"], dtype=dtype)
    w = torch.randn(cfg["cout"], cfg["cin"] // cfg["groups"], *cfg["kernel"], dtype=dtype)
    b = torch.randn(cfg["cout"], dtype=dtype) if cfg["bias"] else None
    return [t if t is None else t.requires_grad_() for t in (x, w, b)]


def conv_args(cfg):
    return cfg["stride"], cfg["padding"], cfg["dilation"], cfg["groups"]


def functions(cfg):
    """(ours, F's) for the configuration's dimensions."""
    name = f"conv{cfg['dims']}d"
    return getattr(torch_convbp, name), getattr(F, name)


@pytest.mark.parametrize("dims", [2, 3])
@FUZZ
@given(data=st.data())
def test_random_valid_configurations_match_f(dims, data):
    cfg = data.draw(valid_configs(dims))
    ours, reference = functions(cfg)
    x, w, b = make_tensors(cfg)
    with torch_convbp.workspace_limit(cfg["limit"]):
        y = ours(x, w, b, *conv_args(cfg))
    y_ref = reference(x, w, b, *conv_args(cfg))
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    if y.numel():
        g = torch.randn_like(y)
        inputs = [t for t in (x, w, b) if t is not None]
        with torch_convbp.workspace_limit(cfg["limit"]):
            got = torch.autograd.grad(y, inputs, g)
        for a, e in zip(got, torch.autograd.grad(y_ref, inputs, g)):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


INVALID = {  # each takes the arguments and the number of spatial dimensions
    "stride": lambda a, n: {**a, "stride": (0,) + (1,) * (n - 1)},
    "negative stride": lambda a, n: {**a, "stride": -2},
    "dilation": lambda a, n: {**a, "dilation": (1,) * (n - 1) + (0,)},
    "padding": lambda a, n: {**a, "padding": (-1,) + (0,) * (n - 1)},
    "groups zero": lambda a, n: {**a, "groups": 0},
    "groups not dividing": lambda a, n: {**a, "groups": a["groups"] + 1},
    "padding string": lambda a, n: {**a, "padding": "full"},
    "stride too long": lambda a, n: {**a, "stride": (1,) * (n + 1)},
}


@pytest.mark.parametrize("dims", [2, 3])
@FUZZ
@given(data=st.data(), how=st.sampled_from(sorted(INVALID)), what=st.sampled_from(["args", "dtype", "rank", "kernel", "bias"]))
def test_random_invalid_configurations_raise_cleanly(dims, data, how, what):
    cfg = data.draw(valid_configs(dims))
    ours, _ = functions(cfg)
    x, w, b = (t if t is None else t.detach() for t in make_tensors(cfg))
    args = dict(stride=cfg["stride"], padding=cfg["padding"], dilation=cfg["dilation"], groups=cfg["groups"])
    if what == "args":
        args = INVALID[how](args, dims)
        if how == "groups not dividing" and cfg["cin"] % args["groups"] == 0 and cfg["cout"] % args["groups"] == 0:
            args["groups"] = cfg["cin"] + cfg["cout"] + 1
    elif what == "dtype":
        w = w.float()
    elif what == "rank":
        x = x[None, None] if x.dim() == dims + 1 else x[None]  # one more than batched
    elif what == "kernel":
        w = torch.randn(cfg["cout"], cfg["cin"] // cfg["groups"], 40, *[3] * (dims - 1), dtype=w.dtype)
        args["padding"] = 0
    elif what == "bias":
        b = torch.randn(cfg["cout"] + 1, dtype=w.dtype)
    # Always refused with a message (F.conv2d itself lets a few of these through on empty batches).
    with pytest.raises((RuntimeError, ValueError)) as info:
        ours(x, w, b, **args)
    assert "torch_convbp" in str(info.value)


@pytest.mark.parametrize("where", ["input", "input_inf", "grad_output"])
def test_non_finite_values_propagate_like_f_conv2d(where):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        if where == "input":
            x[0, 1, 4, 4] = float("nan")
        elif where == "input_inf":
            x[1, 2, 0, 8] = float("inf")
            x[1, 0, 5, 5] = float("-inf")
        else:
            g[0, 2, 1, 3] = float("nan")
            g[1, 0, 4, 4] = float("inf")
    results = []
    for conv in (torch_convbp.conv2d, F.conv2d):
        y = conv(x, w, None, 2, 1)
        results.append((y, *torch.autograd.grad(y, (x, w), g)))
    for a, e in zip(*results):
        assert torch.equal(torch.isnan(a), torch.isnan(e))
        assert torch.equal(torch.isposinf(a), torch.isposinf(e)) and torch.equal(torch.isneginf(a), torch.isneginf(e))
        finite = torch.isfinite(e)
        torch.testing.assert_close(a[finite], e[finite])


def test_concurrent_calls_from_threads_match_serial_calls():
    torch.manual_seed(0)
    jobs = [(torch.randn(6, 8, 14, 14, requires_grad=True), torch.randn(8, 4, 3, 3, requires_grad=True)) for _ in range(6)]

    def run(x, w):
        y = torch_convbp.conv2d(x, w, None, 1, 1, 1, 2)
        return (y.detach(), *torch.autograd.grad(y, (x, w), torch.cos(y)))

    serial = [run(*job) for job in jobs]
    results = [None] * len(jobs)
    errors = []

    def worker(i):
        try:
            for _ in range(3):
                results[i] = run(*jobs[i])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, serial):
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def _resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_no_memory_growth_over_many_steps():
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    conv = torch_convbp.Conv2d(8, 8, 3, padding=1)

    def step():
        y = conv(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)  # double backward too
        gx.sum().backward()

    for _ in range(300):
        step()
    before = _resident_bytes()
    for _ in range(2000):
        step()
    growth = _resident_bytes() - before
    assert growth < 8 << 20, f"resident memory grew by {growth / 2**20:.1f} MiB over 2000 steps"


@pytest.mark.parametrize("batch", [1, 7, 64, 512])
def test_workspace_limit_holds_for_any_batch(batch):
    x = torch.randn(batch, 8, 16, 16, requires_grad=True)
    w = torch.randn(8, 8, 3, 3, requires_grad=True)
    limit = 64 << 10
    with torch_convbp.workspace_limit(limit):
        torch_convbp.workspace_peak(reset=True)
        y = torch_convbp.conv2d(x, w, padding=1)
        torch.autograd.grad(y, (x, w), torch.ones_like(y))
        assert 0 < torch_convbp.workspace_peak() <= limit
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_column_matrix_past_2_to_the_31_elements_is_chunked():
    """The column matrix of this call has 2.4e9 elements (9.7 GB); with the default 1 GiB limit
    it is taken a band of rows at a time, and the result matches oneDNN's."""
    torch.manual_seed(0)
    x = torch.randn(1, 64, 2048, 2048)
    w = torch.randn(2, 64, 3, 3)
    assert 64 * 9 * 2048 * 2048 > 2**31
    torch_convbp.workspace_peak(reset=True)
    y = torch_convbp.conv2d(x, w, padding=1)
    assert torch_convbp.workspace_peak() <= torch_convbp.get_workspace_limit()
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-3)
    g = torch.randn_like(y)
    gw = torch.ops.torch_convbp.conv2d_weight_grad(x, g, [2, 64, 3, 3], (1, 1), (1, 1), (1, 1), 1)
    gw_ref = torch.ops.aten.convolution_backward(g, x, w, None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1, (False, True, False))[1]
    # Sums of 4 million float32 products: compare relative to the gradient's scale.
    torch.testing.assert_close(gw, gw_ref, rtol=0, atol=1e-4 * gw_ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pointwise_forward_and_input_grad_need_no_workspace(device, dtype):
    """A 1x1, stride-1 call with one group is one batched GEMM over the images, each image its own
    column matrix: the forward and the grad-input allocate no column matrix and no staging."""
    x = torch.randn(6, 8, 9, 7, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(12, 8, 1, 1, device=device, dtype=dtype, requires_grad=True)
    torch_convbp.workspace_peak(reset=True)
    y = torch_convbp.conv2d(x, w)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch_convbp.workspace_peak() == 0
    x_ref = x.detach().requires_grad_()
    y_ref = F.conv2d(x_ref, w)
    (gx_ref,) = torch.autograd.grad(y_ref, x_ref, torch.ones_like(y_ref))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)
