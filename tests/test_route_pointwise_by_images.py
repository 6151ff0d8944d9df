"""Route pointwise_by_images: a 1x1, stride-1, unpadded, ungrouped convolution in NCHW is one
batched GEMM over the images for the forward and the input gradient, and, off the CPU, for the
weight gradient a product per image (one batched GEMM on views, no copies) summed in halves, in an
order fixed by the batch size (csrc/conv2d.cpp), where the products cost less than copying the
images and fit the workspace limit (csrc/route.cpp). On the CPU the tests take that weight
gradient with TORCH_CONVBP_POINTWISE_WEIGHT_GRAD=by_images: the same code the GPU runs."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp
from cases import shift_and_add_conv2d
from route_cases import operands

NCHW = torch.contiguous_format
ops = torch.ops.torch_convbp
CHOICE = "TORCH_CONVBP_POINTWISE_WEIGHT_GRAD"


@pytest.fixture(autouse=True)
def _by_images(monkeypatch):
    monkeypatch.setenv(CHOICE, "by_images")


def weight_grad_route(x, w):
    return torch_convbp.explain(x, w)["weight_grad"].route


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8])
def test_weight_gradient_against_f_conv2d_and_a_reference_of_our_own(n, device):
    """Every batch size sums its halves differently (an odd count leaves a middle image for the
    next round); all give the gradient."""
    x, w = operands(n=n, c=8, h=6, w=5, cout=12, device=device, layout=NCHW)
    assert weight_grad_route(x, w) == "pointwise_by_images"
    x.requires_grad_(), w.requires_grad_()
    g = torch.randn(n, 12, 6, 5, dtype=x.dtype, device=device)
    ours = torch.autograd.grad(torch_convbp.conv2d(x, w), w, g)[0]
    ref = torch.autograd.grad(F.conv2d(x, w), w, g)[0]
    own = torch.autograd.grad(shift_and_add_conv2d(x, w, None, (1, 1), (0, 0, 0, 0), (1, 1), 1), w, g)[0]
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours, own, rtol=1e-10, atol=1e-10)
    assert ours.is_contiguous() and ours.shape == w.shape


def test_the_gradient_holds_its_own_memory_not_the_products():
    """The products of all the images are scratch: the gradient returned is a weight's worth."""
    x, w = operands(n=6, c=8, h=6, w=5, cout=12, layout=NCHW)
    g = torch.randn(6, 12, 6, 5, dtype=x.dtype)
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), [1, 1], [0, 0], [1, 1], 1)
    assert dw.untyped_storage().nbytes() == w.numel() * w.element_size()


def test_the_products_count_against_the_workspace_limit():
    """They are counted in workspace_peak; under a limit they do not fit, the column route."""
    x, w = operands(n=6, c=8, h=6, w=5, cout=12, layout=NCHW)
    g = torch.randn(6, 12, 6, 5, dtype=x.dtype)
    products = 6 * w.numel() * w.element_size()
    torch_convbp.workspace_peak(reset=True)
    ops.conv2d_weight_grad(x, g, list(w.shape), [1, 1], [0, 0], [1, 1], 1)
    assert torch_convbp.workspace_peak() >= products
    with torch_convbp.workspace_limit(products - 1):
        assert weight_grad_route(x, w) == "columns"
        torch_convbp.workspace_peak(reset=True)
        dw = ops.conv2d_weight_grad(x, g, list(w.shape), [1, 1], [0, 0], [1, 1], 1)
        assert torch_convbp.workspace_peak() <= products - 1
    torch.testing.assert_close(dw, torch.nn.grad.conv2d_weight(x, w.shape, g), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape, cout, dtype, route", [
    # the products (5 weights per 2 images' copies) against the copies of (Cin + Cout) x pixels
    ((4, 64, 56, 56), 256, torch.float32, "pointwise_by_images"),
    ((4, 1024, 14, 14), 256, torch.float32, "columns"),
    ((4, 8, 1, 1), 12, torch.float64, "columns"),
    # products in the operands' dtype: half precision sums in float32, by the column route
    ((4, 64, 56, 56), 256, torch.bfloat16, "columns"),
    ((4, 64, 56, 56), 256, torch.float16, "columns"),
], ids=str)
def test_the_rule(shape, cout, dtype, route):
    x = torch.empty(shape, dtype=dtype, device="meta")
    w = torch.empty(cout, shape[1], 1, 1, dtype=dtype, device="meta")
    assert weight_grad_route(x, w) == route


@pytest.mark.parametrize("choice", ["auto", "columns"])
def test_the_choice(choice, device, monkeypatch):
    """auto: off the CPU only (on it a step took longer: NOTES section 33); columns: never."""
    monkeypatch.setenv(CHOICE, choice)
    x, w = operands(n=4, c=8, h=6, w=5, cout=12, device=device, layout=NCHW)
    expected = "pointwise_by_images" if choice == "auto" and device != "cpu" else "columns"
    assert weight_grad_route(x, w) == expected


def test_an_unknown_choice_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(CHOICE, "fastest")
    x, w = operands(n=2, c=8, h=6, w=5, cout=12, layout=NCHW)
    with pytest.raises(RuntimeError, match="TORCH_CONVBP_POINTWISE_WEIGHT_GRAD must be auto, by_images or columns"):
        torch_convbp.conv2d(x.requires_grad_(), w.requires_grad_()).sum().backward()


@pytest.mark.parametrize("n", [5, 8])
def test_same_bits_on_any_thread_count(n):
    """The products are cut into blocks of whole images, each one thread's GEMM, and the halves
    are added elementwise: the thread count decides nothing."""
    x = torch.randn(n, 12, 9, 9)
    g = torch.randn(n, 20, 9, 9)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            results.append(ops.conv2d_weight_grad(x, g, [20, 12, 1, 1], [1, 1], [0, 0], [1, 1], 1))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(r, results[0]) for r in results)


def input_grad(g, w, x_shape, threads=None):
    """The input gradient, on `threads` threads if given."""
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        return ops.conv2d_input_grad(g, w, list(x_shape), [1, 1], [0, 0], [1, 1], 1)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("plane", [(7, 7), (8, 8), (1, 1), (3, 5), (9, 9), (14, 14)], ids=str)
@pytest.mark.parametrize("n, c, cout", [(3, 40, 24), (1, 16, 48), (2, 96, 17)], ids=str)
@pytest.mark.parametrize("weight_layout", [NCHW, torch.channels_last], ids=["w-nchw", "w-cl"])
def test_float32_input_gradient_reads_the_weight_as_it_is(plane, n, c, cout, weight_layout, device):
    """dX = W^T @ dY per image, the weight read through a transposed view (no flipped copy); on
    planes of up to 64 pixels the CPU's micro-kernel driver computes it (gemm_choice.h), on larger
    ones the CPU's rule: either way F.conv2d's gradient, and the same bits on any thread count."""
    x, w = operands(n=n, c=c, h=plane[0], w=plane[1], cout=cout, dtype=torch.float32, device=device, layout=NCHW)
    w = w.contiguous(memory_format=weight_layout)
    g = torch.randn(n, cout, *plane, device=device)
    assert torch_convbp.explain(x, w)["input_grad"].route == "pointwise_by_images"
    ours = input_grad(g, w, x.shape)
    ref = torch.nn.grad.conv2d_input(x.shape, w.double(), g.double())
    torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=1e-5)
    assert ours.is_contiguous() and ours.dtype == torch.float32
    if device == "cpu":
        assert all(torch.equal(input_grad(g, w, x.shape, t), ours) for t in (1, 2, 3))


def test_float32_input_gradient_of_an_empty_batch():
    w = torch.randn(24, 40, 1, 1)
    g = torch.empty(0, 24, 7, 7)
    dx = input_grad(g, w, (0, 40, 7, 7))
    assert dx.shape == (0, 40, 7, 7)
