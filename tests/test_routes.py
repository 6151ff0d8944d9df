"""The route table: which route each operator takes (csrc/route.cpp, asked through
torch_convbp.explain), and the rule that its results' memory formats follow the operands alone,
never the route (docs/design.md, "Routes"). The routes' values are tested per route in
test_route_*.py.

The routes, for operands that are all channels_last (dense, non-empty), else in NCHW:
- pointwise (1x1, stride 1, unpadded), one group: pointwise_nhwc, GEMMs on the tensors' own
  memory; in NCHW, pointwise_by_images (forward and input grad: one batched GEMM; weight grad,
  off the CPU: a product per image, summed in halves, where that costs less than copying the
  images);
- depthwise (one input channel per group): the depthwise kernels, in either layout (on the CPU
  the forward and input grad of small output planes compute in NHWC, through copies; the weight
  gradient, in its order of rows, takes NCHW operands as they are);
- several groups of at most 32 output channels: the direct grouped kernels for the forward and
  weight grad, and for the input grad where it is a stride-1 convolution with narrow groups;
- the rest: the column matrix, in NHWC where the groups have 16 or more output channels (and,
  with several groups, 16 or more input channels), else in NCHW through layout copies; the input
  grad of stride 1 as a forward convolution (transposed_columns), else through col2im (in NHWC
  only with 16 or more input channels per group).
Volumes take the column routes (and pointwise_nhwc): the direct kernels are 2-D ones."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import torch_convbp
from route_cases import CL, operands

ops = torch.ops.torch_convbp
NCHW = torch.contiguous_format

# (name, operands' keyword arguments, stride, padding, groups, the routes of forward, input_grad
# and weight_grad as "route/layout", or one string for all three)
ROUTES = [
    ("pointwise channels_last", {}, 1, 0, 1, "pointwise_nhwc/nhwc"),
    ("batch of one", dict(n=1), 1, 0, 1, "pointwise_nhwc/nhwc"),
    # by its strides a 1x1 image is contiguous, not channels_last
    # the weight gradient's products per image would cost more than copying one pixel per image
    ("one pixel per image", dict(h=1, w=1), 1, 0, 1, ("pointwise_by_images/nchw", "pointwise_by_images/nchw", "columns/nchw")),
    # the weight gradient's products per image off the CPU; on it, the column route's chunks
    ("contiguous operands", dict(layout=NCHW), 1, 0, 1, ("pointwise_by_images/nchw", "pointwise_by_images/nchw", "by-images-off-cpu")),
    ("empty batch", dict(n=0), 1, 0, 1, ("pointwise_by_images/nchw", "pointwise_by_images/nchw", "by-images-off-cpu")),
    ("grouped pointwise, 3 channels per group", {}, 1, 0, 2, "grouped/nhwc"),
    ("grouped pointwise contiguous", dict(layout=NCHW), 1, 0, 2, ("columns/nchw", "transposed_columns/nchw", "columns/nchw")),
    ("strided pointwise, 4 output channels", {}, 2, 0, 1, "columns/nchw"),
    ("strided pointwise, 16 channels", dict(c=16, cout=16), 2, 0, 1, "columns/nhwc"),
    ("padded pointwise: padding past the reach", dict(c=16, cout=16), 1, 1, 1, "columns/nhwc"),
    ("3x3", dict(k=3, c=16, cout=16), 1, 1, 1, ("columns/nhwc", "transposed_columns/nhwc", "columns/nhwc")),
    ("3x3 strided, 16 channels per group", dict(k=3, c=32, cout=32), 2, 1, 2, ("grouped/nhwc", "columns/nhwc", "grouped/nhwc")),
    ("3x3, 4 output channels", dict(k=3, c=16), 1, 1, 1, ("columns/nchw", "transposed_columns/nchw", "columns/nchw")),
    # col2im gathers runs of the input channels per group: 3 are too few, even in one group
    ("3x3 strided, 3 input channels (an RGB stem)", dict(k=3, c=3, cout=16), 2, 1, 1, ("columns/nhwc", "columns/nchw", "columns/nhwc")),
    ("3x3 grouped, 3 input channels per group", dict(k=3, cout=32), 1, 1, 2, "grouped/nhwc"),
    ("3x3, 2 channels per group", dict(k=3, cout=6), 1, 1, 3, "grouped/nhwc"),
    # a strided grad-input is no convolution of its own: col2im, in NCHW for narrow groups
    ("3x3 strided, 4 channels per group", dict(k=3, c=8, cout=8), 2, 1, 2, ("grouped/nhwc", "columns/nchw", "grouped/nhwc")),
    # too many output channels per group for the forward's direct kernel; the grad-input's
    # convolution has 3 per group
    ("3x3 grouped, 33 output channels per group", dict(k=3, cout=66), 1, 1, 2, ("columns/nchw", "grouped/nhwc", "columns/nchw")),
    # the grad-input's convolution has one input channel per group: no direct grouped kernel
    ("3x3 grouped, 1 output channel per group", dict(k=3, cout=3), 1, 1, 3, ("grouped/nhwc", "transposed_columns/nchw", "grouped/nhwc")),
    ("3x3 contiguous", dict(k=3, c=16, cout=16, layout=NCHW), 1, 1, 1, ("columns/nchw", "transposed_columns/nchw", "columns/nchw")),
    ("3x3 empty batch", dict(n=0, k=3, c=16, cout=16), 1, 1, 1, ("columns/nchw", "transposed_columns/nchw", "columns/nchw")),
    # float32 on the CPU: where the weight (72 elements per output channel) outnumbers the output
    # gradient (16 per channel), the stride-1 grad-input reads the weight as it is, then col2im,
    # instead of flipping it for the forward convolution of dY; where it does not (84 per channel),
    # that convolution
    ("3x3 float32, a weight larger than the output gradient",
     dict(n=1, h=4, w=4, k=3, c=8, cout=16, dtype=torch.float32, layout=NCHW), 1, 1, 1,
     ("columns/nchw", "col2im-on-cpu", "columns/nchw")),
    ("3x3 float32, a weight smaller than the output gradient",
     dict(n=2, h=6, w=7, k=3, c=8, cout=16, dtype=torch.float32, layout=NCHW), 1, 1, 1,
     ("columns/nchw", "transposed_columns/nchw", "columns/nchw")),
    ("depthwise 3x3", dict(k=3, cout=6), 1, 1, 6, "depthwise/nhwc"),
    ("depthwise multiplier 2, strided", dict(k=3, cout=12), 2, 1, 6, "depthwise/nhwc"),
    # NCHW operands stay NCHW: on the CPU, output planes under 256 pixels compute with the NHWC
    # kernels on blocks of channels (the weight gradient on bands of rows) transposed in cache
    ("depthwise contiguous, small planes", dict(k=3, cout=6, layout=NCHW), 1, 1, 6, "depthwise/nchw"),
    ("depthwise contiguous, large planes", dict(k=3, cout=6, h=16, w=16, layout=NCHW), 1, 1, 6, "depthwise/nchw"),
    ("depthwise empty batch", dict(n=0, k=3, cout=6), 1, 1, 6, "depthwise/nchw"),
]


def expected_routes(expected, device):
    routes = (expected,) * 3 if isinstance(expected, str) else expected
    by_images = "columns/nchw" if device == "cpu" else "pointwise_by_images/nchw"
    col2im = "columns/nchw" if device == "cpu" else "transposed_columns/nchw"
    routes = [r.replace("by-images-off-cpu", by_images).replace("col2im-on-cpu", col2im) for r in routes]
    # "cpu:A else B": route A on the CPU, B on other devices
    return [(r[4:].split(" else ")[0 if device == "cpu" else 1] if r.startswith("cpu:") else r) for r in routes]


def result_is_channels_last(activation, weight):
    """The rule of the results' format (result_format in csrc/route.h), as F.conv2d has it."""
    suggested = CL in (torch._prims_common.suggest_memory_format(t) for t in (activation, weight))
    return suggested and activation.shape[0] > 0


@pytest.mark.parametrize("name, kwargs, stride, padding, groups, expected", ROUTES, ids=[r[0] for r in ROUTES])
def test_each_operator_takes_its_route_and_returns_the_operands_format(name, kwargs, stride, padding, groups, expected, device):
    """explain() names the route of each operator; the operators return their activation results in
    the format the operands say, and the weight gradient in the input's (weight_grad_format in
    csrc/route.h: ATen's rule without the weight, which the operator does not see), whatever
    layout the route computed in; opcheck (fake kernels included: their strides must match the
    real ones) passes for all three."""
    x, w = operands(groups=groups, device=device, **kwargs)
    args = [stride, stride], [padding, padding], [1, 1], groups
    y = ops.conv2d(x, w, None, *args)
    g = torch.randn_like(y).contiguous(memory_format=kwargs.get("layout", CL))
    explanation = torch_convbp.explain(x, w, *args, grad_output=g)
    assert [f"{r.route}/{r.layout}" for r in explanation] == expected_routes(expected, device)
    dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), *args)
    for result, operand in ((y, x), (dx, g)):
        format = CL if result_is_channels_last(operand, w) else NCHW
        assert result.is_contiguous(memory_format=format)
    assert dw.is_contiguous(memory_format=CL if result_is_channels_last(x, x) else NCHW)
    opcheck(ops.conv2d.default, (x, w, None, *args))
    opcheck(ops.conv2d_input_grad.default, (g, w, list(x.shape), *args))
    opcheck(ops.conv2d_weight_grad.default, (x, g, list(w.shape), *args))


# (name, input size, weight size, stride, padding, groups, routes as in ROUTES); channels_last_3d
VOLUME_ROUTES = [
    ("pointwise (a 2-D one: pixel columns)", (2, 16, 3, 4, 5), (16, 16, 1, 1, 1), 1, 0, 1, "pointwise_nhwc/nhwc"),
    ("3x3x3", (2, 16, 3, 4, 5), (16, 16, 3, 3, 3), 1, 1, 1, ("columns/nhwc", "transposed_columns/nhwc", "columns/nhwc")),
    ("3x3x3 strided", (2, 16, 5, 6, 5), (32, 16, 3, 3, 3), 2, 1, 1, "columns/nhwc"),
    ("stem, 3 input channels, strided", (2, 3, 4, 9, 9), (16, 3, 3, 7, 7), 2, 3, 1, ("columns/nhwc", "columns/nchw", "columns/nhwc")),
    ("depthwise", (2, 8, 3, 4, 5), (8, 1, 3, 3, 3), 1, 1, 8, ("cpu:depthwise/nhwc else columns/nchw",
                                                                 "cpu:depthwise/nhwc else transposed_columns/nchw",
                                                                 "cpu:depthwise/nhwc else columns/nchw")),
    ("narrow groups", (2, 8, 3, 4, 5), (8, 4, 3, 3, 3), 1, 1, 2, ("columns/nchw", "transposed_columns/nchw", "columns/nchw")),
]


@pytest.mark.parametrize("name, x_size, w_size, stride, padding, groups, expected", VOLUME_ROUTES, ids=[r[0] for r in VOLUME_ROUTES])
def test_volumes_take_the_column_routes(name, x_size, w_size, stride, padding, groups, expected, device):
    """The direct kernels are 2-D but for the CPU's depthwise kernels of volumes: a depthwise
    volume elsewhere and narrow-grouped layers take the column matrix (in NCHW, through copies),
    where the kernel spans several slices and several pixels of a plane (else the 2-D convolution
    on views: below); the rest as for images. Values against F.conv3d."""
    g = torch.Generator().manual_seed(0)
    cl3d = torch.channels_last_3d
    x = torch.randn(x_size, generator=g, dtype=torch.float64).to(device).contiguous(memory_format=cl3d)
    w = torch.randn(w_size, generator=g, dtype=torch.float64).to(device).contiguous(memory_format=cl3d)
    args = [stride] * 3, [padding] * 3, [1] * 3, groups
    y = ops.conv3d(x, w, None, *args)
    grad = torch.randn_like(y).contiguous(memory_format=cl3d)
    explanation = torch_convbp.explain(x, w, *args, grad_output=grad)
    assert [f"{r.route}/{r.layout}" for r in explanation] == expected_routes(expected, device)
    assert y.is_contiguous(memory_format=cl3d)
    x_ref, w_ref = x.detach().requires_grad_(), w.detach().requires_grad_()
    y_ref = F.conv3d(x_ref, w_ref, None, *args)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x_ref, w_ref), grad)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ops.conv3d_input_grad(grad, w, list(x.shape), *args), dx_ref, rtol=1e-10, atol=1e-10)
    dw = ops.conv3d_weight_grad(x, grad, list(w.shape), *args)
    assert dw.is_contiguous(memory_format=cl3d)  # the input's format, as dW of F.conv3d
    torch.testing.assert_close(dw, dw_ref, rtol=1e-10, atol=1e-10)


# (name, input size, weight size, stride, padding, dilation, groups, the form): 3-D convolutions
# that are 2-D ones on views (csrc/volume_planes.h): a kernel one slice deep of depth stride 1 and
# no depth padding ("slices": each depth slice an image), or one pixel in each plane of stride 1
# and no padding in the plane ("columns": each plane one image row, the kernel [kd, 1])
PLANAR_VOLUMES = [
    ("R(2+1)D spatial, strided", (2, 16, 3, 9, 8), (24, 16, 1, 3, 3), (1, 2, 2), (0, 1, 1), (1, 1, 1), 1, "slices"),
    ("asymmetric, dilated in the plane", (2, 3, 2, 5, 6), (4, 3, 1, 3, 2), (1, 1, 2), (0, 1, 0), (3, 2, 1), 1, "slices"),
    ("depthwise slices", (2, 8, 3, 9, 9), (8, 1, 1, 3, 3), 1, (0, 1, 1), 1, 8, "slices"),
    ("narrow groups, batch of one", (1, 16, 3, 6, 7), (16, 4, 1, 3, 3), 1, (0, 1, 1), 1, 4, "slices"),
    ("R(2+1)D temporal, strided", (2, 16, 5, 4, 6), (24, 16, 3, 1, 1), (2, 1, 1), (1, 0, 0), (1, 1, 1), 1, "columns"),
    ("temporal, dilated, groups", (2, 4, 6, 3, 2), (6, 2, 3, 1, 1), 1, (2, 0, 0), (2, 1, 1), 2, "columns"),
    ("1x1x1, batch of one", (1, 4, 3, 5, 6), (8, 4, 1, 1, 1), 1, 0, 1, 1, "columns"),
]


GRADIENT_CHECKED = ("asymmetric, dilated in the plane", "temporal, dilated, groups")


def as_planes(t, form):
    """The test's own views: [N, C, D, H, W] as [N*D, C, H, W] or [N, C, D, H*W]."""
    n, c, d, h, w = t.shape
    planes = t.transpose(1, 2).reshape(n * d, c, h, w) if form == "slices" else t.reshape(n, c, d, h * w)
    # a batch of one keeps a stride of no meaning, which hides channels_last: its own strides
    return planes.clone(memory_format=CL) if planes.is_contiguous(memory_format=CL) else planes


def planar_arguments(form, stride, padding, dilation):
    if form == "slices":
        return stride[1:], padding[1:], dilation[1:]
    return [stride[0], 1], [padding[0], 0], [dilation[0], 1]


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d], ids=["ncdhw", "channels_last_3d"])
@pytest.mark.parametrize(
    "name, x_size, w_size, stride, padding, dilation, groups, form", PLANAR_VOLUMES, ids=[r[0] for r in PLANAR_VOLUMES]
)
def test_volumes_that_are_planar_take_the_2d_routes(name, x_size, w_size, stride, padding, dilation, groups, form, memory_format, device):
    """Each operator gives the bits of the 2-D operator on the views, its route, and F.conv3d's
    values in F.conv3d's format (of the operands); opcheck, gradcheck and gradgradcheck. Depth
    slices are images only as views of channels_last_3d operands: NCDHW ones keep the 3-D
    route (a copy into images, and the 2-D route's, took longer)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_size, generator=g, dtype=torch.float64).to(device).contiguous(memory_format=memory_format)
    w = torch.randn(w_size, generator=g, dtype=torch.float64).to(device).contiguous(memory_format=memory_format)
    args = (*([a] * 3 if isinstance(a, int) else list(a) for a in (stride, padding, dilation)), groups)
    y = ops.conv3d(x, w, None, *args)
    grad = torch.randn(y.shape, generator=g, dtype=torch.float64).to(device).contiguous(memory_format=memory_format)
    dx = ops.conv3d_input_grad(grad, w, list(x_size), *args)
    dw = ops.conv3d_weight_grad(x, grad, list(w_size), *args)
    # the 2-D operators on the test's own views
    planar = (*planar_arguments(form, *args[:3]), groups)
    w2 = w.squeeze(2) if form == "slices" else w.squeeze(4)
    x2, grad2 = as_planes(x, form), as_planes(grad, form)
    y2 = ops.conv2d(x2, w2, None, *planar)
    dx2 = ops.conv2d_input_grad(grad2, w2, list(x2.shape), *planar)
    dw2 = ops.conv2d_weight_grad(x2, grad2, list(w2.shape), *planar)
    routes = torch_convbp.explain(x, w, *args, grad_output=grad)
    if form == "columns" or memory_format == torch.channels_last_3d:
        assert torch.equal(as_planes(y, form), y2) and torch.equal(as_planes(dx, form), dx2)
        assert torch.equal(dw, dw2.view(w_size))
        planar_routes = torch_convbp.explain(x2, w2, *planar, grad_output=grad2)
        assert [r.route for r in routes] == [r.route for r in planar_routes]
        assert all(r.reason.startswith("a 3-D convolution") for r in routes)
    else:
        assert not any(r.reason.startswith("a 3-D convolution") for r in routes)
    # F.conv3d's values; its format on the CPU (oneDNN's, float32: channels_last_3d for a
    # channels_last_3d operand)
    x_ref, w_ref = x.detach().requires_grad_(), w.detach().requires_grad_()
    y_ref = F.conv3d(x_ref, w_ref, None, *args)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x_ref, w_ref), grad)
    for ours, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    channels_last = memory_format == torch.channels_last_3d
    for result in (y, dx, dw):
        assert result.is_contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    opcheck(ops.conv3d.default, (x, w, None, *args))
    opcheck(ops.conv3d_input_grad.default, (grad, w, list(x_size), *args))
    opcheck(ops.conv3d_weight_grad.default, (x, grad, list(w_size), *args))
    if name in GRADIENT_CHECKED and memory_format == torch.contiguous_format:  # one per form
        fn = lambda x, w: torch_convbp.conv3d(x, w, None, *args)
        assert torch.autograd.gradcheck(fn, (x_ref, w_ref))
        assert torch.autograd.gradgradcheck(fn, (x_ref, w_ref))


# (name, input size, weight size, stride, padding, dilation, groups): 3-D convolutions deeper than
# one slice, of depth stride 1, whose slices' 2-D route in channels_last_3d float32 is one with no
# column matrix, the implicit one: that route computes the volume's forward and input gradient
# (csrc/cpu/implicit_nhwc_cpu.cpp, a volume's kernel rows its (depth tap, kernel row) pairs), and
# the weight gradient of stride 1 where the slices' forward takes it
# (csrc/cpu/implicit_weight_grad_cpu.cpp, its padded depth slices one plane;
# csrc/implicit_volumes.h). A depthwise volume, whose slices would take the depthwise
# kernels, has kernels of its own (tests/test_route_depthwise.py).
DEEP_VOLUMES = [
    ("r3d 3x3x3", (2, 16, 4, 14, 15), (16, 16, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ("asymmetric, strided in the plane", (1, 16, 5, 16, 14), (24, 16, 2, 3, 3), (1, 2, 1), (0, 1, 1), (1, 1, 1), 1),
    ("dilated in depth, padded past its reach", (2, 16, 3, 14, 14), (16, 16, 3, 3, 3), (1, 1, 1), (3, 1, 1), (2, 1, 1), 1),
    ("taps that reach no slice", (1, 16, 1, 14, 14), (16, 16, 3, 3, 3), (1, 1, 1), (2, 1, 1), (2, 1, 1), 1),
    ("groups of 16", (2, 32, 3, 14, 14), (32, 16, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 2),
    # where AVX-512 kernels run, the slices' 2-D weight gradient would take the column route (over
    # 128 channels, channels_last), the volume's the implicit kernel (the forward's rule)
    ("256 channels", (1, 256, 3, 14, 14), (256, 256, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ("depthwise 3x3x3", (2, 16, 4, 10, 11), (16, 1, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 16),
]
IMPLICIT_VOLUME = "a volume whose depth slices take the implicit route"


def slices(t, n, begin, end):
    return t[n].transpose(0, 1)[begin:end]  # [end - begin, C, H, W], channels_last


@pytest.mark.parametrize("name, x_size, w_size, stride, padding, dilation, groups", DEEP_VOLUMES, ids=[r[0] for r in DEEP_VOLUMES])
def test_deep_volumes_whose_slices_take_the_implicit_route(name, x_size, w_size, stride, padding, dilation, groups):
    """Where the slices' 2-D route is the implicit one (a depthwise volume takes the kernels of
    volumes), the forward and the input gradient take the implicit route on the volume, each
    volume's result the same bits alone as in the batch, and so does the weight gradient of
    stride 1 where the slices' forward does (its alternative, vol2col, writes kd times the columns
    the slices' rule weighs), with the implicit kernel's bits on the operands as given; explain()
    says so. Elsewhere the
    3-D route. Either way F.conv3d's values in channels_last_3d, and opcheck. NCDHW operands give
    the same bits in NCDHW (the forward and input gradient through copies into channels_last_3d,
    the weight gradient read as they are) where the plane's kernel reads at least as many values
    as the plane holds, else take the 3-D route; float64 never takes it (gradcheck of the
    operators: the 3-D tests)."""
    g = torch.Generator().manual_seed(0)
    cl3d = torch.channels_last_3d
    x = torch.randn(x_size, generator=g).contiguous(memory_format=cl3d)
    w = torch.randn(w_size, generator=g).contiguous(memory_format=cl3d)
    args = (list(stride), list(padding), list(dilation), groups)
    y = ops.conv3d(x, w, None, *args)
    grad = torch.randn(y.shape, generator=g).contiguous(memory_format=cl3d)
    dx = ops.conv3d_input_grad(grad, w, list(x_size), *args)
    dw = ops.conv3d_weight_grad(x, grad, list(w_size), *args)
    for result in (y, dx, dw):
        assert result.is_contiguous(memory_format=cl3d)
    x64, w64, grad64 = x.double().requires_grad_(), w.double().requires_grad_(), grad.double()
    y_ref = F.conv3d(x64, w64, None, *args)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x64, w64), grad64)
    for ours, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        torch.testing.assert_close(ours.double(), ref, rtol=1e-4, atol=1e-3)

    n_volumes, depth, out_depth = x_size[0], x_size[2], y.shape[2]
    planar = (list(stride[1:]), list(padding[1:]), list(dilation[1:]), groups)
    count = min(depth, out_depth)
    planar_routes = torch_convbp.explain(slices(x, 0, 0, count), w[:, :, 0], *planar, grad_output=slices(grad, 0, 0, count))
    routes = torch_convbp.explain(x, w, *args, grad_output=grad)
    for route in routes:
        weight_grad = route.operator == "weight_grad"
        planar_route = planar_routes["forward" if weight_grad else route.operator]
        # a depthwise volume has kernels of its own (tests/test_route_depthwise.py)
        own_kernel = planar_route.route == "depthwise"
        assert route.reason.startswith("one input channel per group, a volume") == own_kernel, route
        implicit = planar_route.route == "implicit_nhwc" and not own_kernel
        implicit = implicit and not (weight_grad and stride[1:] != (1, 1))  # its kernel: stride 1
        assert route.reason.startswith(IMPLICIT_VOLUME) == implicit, route
        if not implicit:
            continue
        assert route.route == "implicit_nhwc"
        if route.operator == "forward":
            for n in range(n_volumes):  # a volume's tiles' sums do not depend on the batch
                assert torch.equal(y[n:n + 1], ops.conv3d(x[n:n + 1], w, None, *args))
        elif route.operator == "input_grad":
            for n in range(n_volumes):
                assert torch.equal(dx[n:n + 1], ops.conv3d_input_grad(grad[n:n + 1], w, [1, *x_size[1:]], *args))
        else:  # the kernel's bits, on the operands as they are (tests/test_route_implicit_weight_grad.py)
            expected = torch.empty(w_size).contiguous(memory_format=cl3d)
            ops.implicit_conv3d_weight_grad(x, grad, *args, expected)
            assert torch.equal(dw, expected)
    assert not any(r.reason.startswith(IMPLICIT_VOLUME)  # float64 never
                   for r in torch_convbp.explain(x.double(), w.double(), *args))
    # NCDHW operands take these routes where channels_last_3d ones do and the plane's kernel
    # reads at least as many values as the plane holds (kh*kw*OH*OW >= H*W), through copies into
    # that format: the same bits, in their own format.
    copies_pay = w_size[3] * w_size[4] * y.shape[3] * y.shape[4] >= x_size[3] * x_size[4]
    x_, w_, grad_ = x.contiguous(), w.contiguous(), grad.contiguous()
    results = {"forward": (ops.conv3d(x_, w_, None, *args), y),
               "input_grad": (ops.conv3d_input_grad(grad_, w_, list(x_size), *args), dx),
               "weight_grad": (ops.conv3d_weight_grad(x_, grad_, list(w_size), *args), dw)}
    for route, ncdhw_route in zip(routes, torch_convbp.explain(x_, w_, *args, grad_output=grad_)):
        ncdhw, channels_last = results[route.operator]
        assert ncdhw.is_contiguous()
        if route.reason.startswith(IMPLICIT_VOLUME) and copies_pay:
            assert ncdhw_route.reason == route.reason and torch.equal(ncdhw, channels_last)
        else:
            assert not ncdhw_route.reason.startswith(IMPLICIT_VOLUME)
            torch.testing.assert_close(ncdhw, channels_last, rtol=1e-4, atol=1e-3)
    opcheck(ops.conv3d.default, (x, w, None, *args))
    opcheck(ops.conv3d_input_grad.default, (grad, w, list(x_size), *args))
    opcheck(ops.conv3d_weight_grad.default, (x, grad, list(w_size), *args))


def test_a_volume_whose_padded_copies_pass_the_workspace_limit_keeps_the_bound():
    """The implicit weight gradient copies one volume at least (its padded depth slices and its
    extended output gradient: 162 KB here): under a smaller workspace limit the volume's weight
    gradient takes the 3-D column route, which takes bands of rows, and stays within the limit."""
    g = torch.Generator().manual_seed(6)
    cl3d = torch.channels_last_3d
    x = torch.randn(2, 16, 4, 14, 15, generator=g).contiguous(memory_format=cl3d)
    w = torch.randn(16, 16, 3, 3, 3, generator=g)
    grad = torch.randn(2, 16, 4, 14, 15, generator=g).contiguous(memory_format=cl3d)
    assert torch_convbp.explain(x, w, 1, 1, grad_output=grad)["weight_grad"].reason.startswith(IMPLICIT_VOLUME)
    limit = 100_000
    with torch_convbp.workspace_limit(limit):
        route = torch_convbp.explain(x, w, 1, 1, grad_output=grad)["weight_grad"]
        assert route.route == "columns", route
        torch_convbp.workspace_peak(reset=True)
        dw = ops.conv3d_weight_grad(x, grad, list(w.shape), [1, 1, 1], [1, 1, 1], [1, 1, 1], 1)
        assert 0 < torch_convbp.workspace_peak() <= limit
    expected = torch.nn.grad.conv3d_weight(x.double(), w.shape, grad.double(), 1, 1)
    torch.testing.assert_close(dw.double(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("input_layout, weight_layout", [(NCHW, CL), (CL, NCHW)], ids=["channels_last weight", "channels_last input"])
def test_a_mixed_call_returns_f_conv2ds_format(input_layout, weight_layout, device):
    """One channels_last operand is enough for a channels_last output, as with F.conv2d; the route
    computes where the activations are (NCHW for a contiguous input, through copies)."""
    x, w = operands(n=2, c=16, h=6, w=5, cout=16, k=3, device=device)
    x, w = x.contiguous(memory_format=input_layout), w.contiguous(memory_format=weight_layout)
    y, y_ref = torch_convbp.conv2d(x, w, padding=1), F.conv2d(x, w, padding=1)
    assert y.is_contiguous(memory_format=CL) == y_ref.is_contiguous(memory_format=CL)
    if device == "cpu":  # on CUDA in float64 F.conv2d gives NCHW, and so do we
        assert y.is_contiguous(memory_format=CL)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    layout = torch_convbp.explain(x, w, padding=1)["forward"].layout
    assert layout == ("nhwc" if input_layout == CL else "nchw")


@pytest.mark.parametrize("grad_layout", [CL, NCHW], ids=["channels_last", "contiguous"])
def test_a_mixed_backward_takes_nchw_and_gives_the_same_values(grad_layout, device):
    """A channels_last input with a contiguous output gradient: the weight gradient needs both in
    NHWC, so it takes the NCHW route; the values agree either way."""
    x, w = operands(device=device)
    g = torch.randn(3, 4, 5, 7, dtype=x.dtype, device=device).contiguous(memory_format=grad_layout)
    args = [1, 1], [0, 0], [1, 1], 1
    routes = torch_convbp.explain(x, w, *args, grad_output=g)
    assert routes["weight_grad"].layout == ("nhwc" if grad_layout == CL else "nchw")
    dw = ops.conv2d_weight_grad(x, g, list(w.shape), *args)
    dw_nchw = ops.conv2d_weight_grad(x.contiguous(), g.contiguous(), list(w.shape), *args)
    torch.testing.assert_close(dw, dw_nchw, rtol=1e-12, atol=1e-12)
    dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
    assert dx.is_contiguous(memory_format=CL if grad_layout == CL else NCHW)  # a 1x1 weight suggests NCHW


@pytest.mark.parametrize("layout", [NCHW, CL], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("padding, dilation", [(1, 1), (0, 1), (2, 2), ((1, 0), (1, 2))], ids=["same", "valid", "dilated", "asymmetric"])
def test_a_stride_1_input_gradient_through_col2im_has_the_convolutions_values(layout, padding, dilation, device):
    """float32, a weight that outnumbers the output gradient: on the CPU the grad-input's GEMM reads
    the weight as it is, then col2im (csrc/route.cpp, input_grad_pays_col2im). Its values are
    F.conv2d's gradient's, within float32's rounding of float64's, for a batch of one and of two."""
    for n in (1, 2):
        x, w = operands(n=n, h=4, w=5, k=3, c=8, cout=24, dtype=torch.float32, device=device, layout=layout)
        pair = lambda v: list(v) if isinstance(v, tuple) else [v, v]  # noqa: E731
        args = [1, 1], pair(padding), pair(dilation), 1
        y = ops.conv2d(x, w, None, *args)
        g = torch.randn_like(y)
        if device == "cpu":
            (_, route, _) = torch_convbp.explain(x, w, *args, grad_output=g)
            assert route.route == "columns"
        dx = ops.conv2d_input_grad(g, w, list(x.shape), *args)
        expected = torch.nn.grad.conv2d_input(list(x.shape), w.double(), g.double(), 1, *args[1:])
        torch.testing.assert_close(dx.double(), expected, rtol=1e-5, atol=1e-5)


def test_explain_takes_the_functions_arguments_and_prints_a_table(monkeypatch):
    monkeypatch.setenv("TORCH_CONVBP_GEMM", "mkl")  # the column routes, on any CPU
    x = torch.randn(2, 16, 9, 9).contiguous(memory_format=CL)
    w = torch.randn(32, 16, 3, 3)
    explanation = torch_convbp.explain(x, w, stride=2, padding="valid")
    assert [r.operator for r in explanation] == ["forward", "input_grad", "weight_grad"]
    assert explanation["input_grad"].route == "columns" and "col2im" in explanation["input_grad"].reason
    lines = str(explanation).splitlines()
    assert len(lines) == 3 and lines[0].startswith("forward") and "columns (nhwc)" in lines[0]
    # unbatched input, 1-D convolutions, and meta tensors: nothing is computed
    assert torch_convbp.explain(x[0], w, padding=1)["forward"].route == "columns"
    assert torch_convbp.explain(torch.randn(2, 8, 50), torch.randn(8, 1, 5), groups=8)[0].route == "depthwise"
    meta = torch_convbp.explain(torch.empty(2, 4, 8, 8, device="meta"), torch.empty(6, 4, 1, 1, device="meta"))
    assert meta["forward"].route == "pointwise_by_images"


def test_explain_refuses_what_the_operators_refuse():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    with pytest.raises(RuntimeError, match="expected input of size"):
        torch_convbp.explain(x, w, groups=2)
    with pytest.raises(ValueError, match="expected grad_output of size"):
        torch_convbp.explain(x, w, grad_output=torch.randn(2, 6, 8, 8))
    with pytest.raises(KeyError, match="no operator 'backward'"):
        torch_convbp.explain(x, w)["backward"]
