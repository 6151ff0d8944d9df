"""What the tests of the routes share: operands in either memory format, the check of the
three operators against F.conv2d and our own shift-and-add reference, and what the GEMM
micro-kernel can do here."""
import contextlib
import os

import torch
import torch.nn.functional as F

from cases import shift_and_add_conv2d

CL = torch.channels_last


@contextlib.contextmanager
def environment(name, value):
    """The environment variable `name` set to `value` while the block runs."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def has_microkernel():
    """Whether this torch and CPU have the GEMM micro-kernel (x86 with AVX2, oneDNN on): forced,
    float32 GEMMs run on it."""
    import torch_convbp

    with environment("TORCH_CONVBP_GEMM", "microkernel"):
        return torch_convbp.gemm_engine(torch.float32) == "microkernel"


def microkernel_outruns_mkl():
    """Whether float32 GEMMs run on the micro-kernel by default here (a CPU where it measured
    faster than MKL: an AVX-512 EPYC), and with them the implicit route for NCHW operands too."""
    import torch_convbp

    with environment("TORCH_CONVBP_GEMM", "auto"):
        return torch_convbp.gemm_engine(torch.float32) == "microkernel"


def microkernel_runs_narrow_gemms():
    """Whether float32 GEMMs run on the micro-kernel by default here only where their result is
    at most 256 columns wide (an AMD CPU without AVX-512: csrc/gemm_choice.cpp), the routes being
    MKL's."""
    import torch_convbp

    with environment("TORCH_CONVBP_GEMM", "auto"):
        return (not microkernel_outruns_mkl() and torch_convbp.gemm_engine(torch.float32, result=(64, 256)) == "microkernel")


def implicit_calls_outrun_mkl():
    """Whether the implicit route takes the rules of a CPU where its micro-kernel calls outrun MKL's
    column route (csrc/route.cpp, implicit_calls_outrun_mkl): where float32 GEMMs run on the
    micro-kernel (an AVX-512 EPYC), and where the narrow ones do (an AMD CPU without AVX-512),
    every call of the route writing a result at most 256 columns wide."""
    return microkernel_outruns_mkl() or microkernel_runs_narrow_gemms()


def runs_avx512_kernels():
    """Whether this CPU runs AVX-512 kernels (it has AVX-512 and oneDNN is not capped below it):
    the extension's own rule (cpu_features.h), which the routes ask."""
    from torch_convbp import _C

    return _C._cpu_allows_avx512_kernels()


def taken_here(where):
    """A route table's "where it is taken" on this CPU: True or False as written, "outruns" where the
    micro-kernel's calls outrun MKL (implicit_calls_outrun_mkl), "avx512 or outruns" there and where
    AVX-512 kernels run (runs_avx512_kernels)."""
    if where == "outruns":
        return implicit_calls_outrun_mkl()
    if where == "avx512 or outruns":
        return runs_avx512_kernels() or implicit_calls_outrun_mkl()
    assert isinstance(where, bool), where
    return where


def has_bfloat16_microkernel():
    """Whether the micro-kernel computes bfloat16 here (AVX512_BF16 or AMX-BF16): asked of the
    driver's own entry, which refuses bfloat16 elsewhere."""
    from torch_convbp import _C

    try:
        _C._microkernel_gemm(torch.empty(1, 1, 1), *(torch.ones(1, 1, 1, dtype=torch.bfloat16),) * 2, False)
    except RuntimeError:
        return False
    return True


def operands(n=3, c=6, h=5, w=7, cout=4, k=1, groups=1, dtype=torch.float64, device="cpu", layout=CL, seed=0):
    """An input [n, c, h, w] and a weight [cout, c/groups, k, k], both in `layout`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype).to(device).contiguous(memory_format=layout)
    wt = torch.randn(cout, c // groups, k, k, generator=g, dtype=dtype).to(device).contiguous(memory_format=layout)
    return x, wt


def dense_operands(shape, cout, kernel, groups, dtype=torch.float64, device="cpu", seed=0):
    """A channels_last input of `shape` and a contiguous weight [cout, C/groups, *kernel]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    w = torch.randn(cout, shape[1] // groups, *kernel, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    return x.contiguous(memory_format=CL), w


def assert_formats(ours, builtin):
    """The output comes in F.conv2d's format: on the CPU a channels_last call gives channels_last,
    on CUDA float64 stays NCHW (cuDNN would not compute it in channels_last) and our rule follows
    (docs/design.md, "Memory formats"). The grad-input comes in the output gradient's format,
    here channels_last (F.conv2d's comes NCHW on CUDA in float64; only torch.autograd.grad shows
    it: .grad of a leaf takes the leaf's layout)."""
    (y, dx), (y_ref, _) = ours[:2], builtin[:2]
    assert y.is_contiguous(memory_format=CL) == y_ref.is_contiguous(memory_format=CL)
    assert y.is_contiguous() == y_ref.is_contiguous()
    assert dx.is_contiguous(memory_format=CL)
    if y.device.type == "cpu":
        assert y.is_contiguous(memory_format=CL)


def assert_matches_the_references(ours, x, w, b, g, stride, padding, dilation, groups):
    """ours = (y, dx, dw, db) against F.conv2d's and our shift-and-add reference's, in float64, for
    the output gradient g; returns F.conv2d's."""
    y_ref = F.conv2d(x, w, b, stride, padding, dilation, groups)
    ref = (y_ref, *torch.autograd.grad(y_ref, (x, w, b), g))
    pads = (padding[0], padding[0], padding[1], padding[1])
    y_own = shift_and_add_conv2d(x, w, b, stride, pads, dilation, groups)
    own = (y_own, *torch.autograd.grad(y_own, (x, w, b), g))
    for a, r, o in zip(ours, ref, own):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a, o, rtol=1e-10, atol=1e-10)
    return ref


def forward_and_gradients(x, w, b, stride, padding, dilation, groups, layout=CL):
    """torch_convbp.conv2d's output and its gradients (x, w, b) for a random output gradient in
    `layout`; returns ((y, dx, dw, db), g)."""
    import torch_convbp

    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    y = torch_convbp.conv2d(x, w, b, stride, padding, dilation, groups)
    g = torch.randn_like(y).contiguous(memory_format=layout)
    return (y, *torch.autograd.grad(y, (x, w, b), g)), g


def assert_same_bits_on_one_and_three_threads(compute, expected):
    """compute() gives `expected` bit for bit on 1 and on 3 threads (the thread count restored)."""
    before = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            assert torch.equal(compute(), expected)
    finally:
        torch.set_num_threads(before)
