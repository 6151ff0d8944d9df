"""Fake (meta) kernels: what torch.compile and opcheck see of the operators.

Each mirrors the checks of csrc/checks.cpp (same conditions, same messages) and returns an empty
tensor of the right size, so that a traced program fails where the real one would.
"""
import math

import torch
from torch._prims_common import suggest_memory_format
from torch.library import register_fake

from . import _C  # noqa: F401  (the operators exist before their fakes are registered)

_FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_operands(op, **tensors):
    """Mirrors check_operands (csrc/checks.cpp): one floating dtype, device and layout."""
    (first_name, first), *_ = tensors.items()
    torch._check(
        first.dtype in _FLOAT_DTYPES,
        lambda: f"{op}: {first_name} must be float64, float32, float16 or bfloat16, got {first.dtype}",
    )
    check_same_kind(op, **tensors)


def check_same_kind(op, **tensors):
    """Mirrors check_same_kind (csrc/checks.cpp): the first tensor's dtype and device for all, strided."""
    (first_name, first), *_ = tensors.items()
    for name, t in tensors.items():
        torch._check(
            t.layout == torch.strided,
            lambda: f"{op}: {name} must be a dense (strided) tensor, got layout {t.layout}",
        )
        torch._check(
            t.dtype == first.dtype,
            lambda: f"{op}: {first_name} ({first.dtype}) and {name} ({t.dtype}) must have the same dtype",
        )
        torch._check(
            t.device == first.device,
            lambda: f"{op}: {first_name} ({first.device}) and {name} ({t.device}) must be on the same device",
        )


def conv_output_size(op, dims, input_size, weight_size, stride, padding, dilation, groups):
    """Checks a convolution's sizes like check_convolution in csrc/checks.cpp (dims 2: [N, C, H, W],
    dims 3: [N, C, D, H, W]); returns the output's spatial sizes, (OH, OW) or (OD, OH, OW)."""
    input_size, weight_size = list(input_size), list(weight_size)
    volumes = dims == 3
    torch._check(
        len(input_size) == dims + 2,
        lambda: f"{op}: expected a {dims + 2}-D input [N, C, {'D, ' if volumes else ''}H, W], got size {input_size}",
    )
    torch._check(
        len(weight_size) == dims + 2,
        lambda: f"{op}: expected a {dims + 2}-D weight [out_channels, in_channels/groups, {'kD, ' if volumes else ''}"
        f"kH, kW], got size {weight_size}",
    )
    names = "3 values (depth, height, width)" if volumes else "2 values (height, width)"
    for name, values in (("stride", stride), ("padding", padding), ("dilation", dilation)):
        torch._check(len(values) == dims, lambda: f"{op}: expected {name} to have {names}, got {list(values)}")
    torch._check(all(s > 0 for s in stride), lambda: f"{op}: stride must be positive, got {list(stride)}")
    torch._check(all(d > 0 for d in dilation), lambda: f"{op}: dilation must be positive, got {list(dilation)}")
    torch._check(all(p >= 0 for p in padding), lambda: f"{op}: padding must be non-negative, got {list(padding)}")
    torch._check(groups > 0, lambda: f"{op}: groups must be positive, got {groups}")
    torch._check(all(s >= 0 for s in input_size), lambda: f"{op}: input size must be non-negative, got {input_size}")
    c, spatial = input_size[1], input_size[2:]
    c_out, c_per_group, kernel = weight_size[0], weight_size[1], weight_size[2:]
    torch._check(
        c_out > 0 and c_per_group > 0 and all(k > 0 for k in kernel),
        lambda: f"{op}: weight must have non-zero sizes, got {weight_size}",
    )
    torch._check(
        c_out % groups == 0,
        lambda: f"{op}: given groups={groups}, out_channels (weight size {weight_size}, dimension 0) must be divisible by groups",
    )
    torch._check(
        c == c_per_group * groups,
        lambda: f"{op}: given groups={groups} and weight of size {weight_size}, expected input of size "
        f"{input_size} to have {c_per_group * groups} channels, but got {c} channels instead",
    )
    torch._check(
        all(n > 0 for n in spatial),
        lambda: f"{op}: input {'depth, height' if volumes else 'height'} and width must be non-zero, got {input_size}",
    )
    padded = [n + 2 * p for n, p in zip(spatial, padding)]
    reach = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]  # the kernel's extent with dilation
    torch._check(
        all(p >= r for p, r in zip(padded, reach)),
        lambda: f"{op}: padded input size per channel ({' x '.join(map(str, padded))}) is smaller than the dilated "
        f"kernel ({' x '.join(map(str, reach))}); the kernel can't be larger than the padded input",
    )
    return tuple((p - r) // s + 1 for p, r, s in zip(padded, reach, stride))


def conv2d_output_size(op, input_size, weight_size, stride, padding, dilation, groups):
    """(OH, OW) of a 2-D convolution, checked as check_conv2d does."""
    return conv_output_size(op, 2, input_size, weight_size, stride, padding, dilation, groups)


def _check_grad_output(op, grad_output, expected):
    torch._check(
        list(grad_output.shape) == list(expected),
        lambda: f"{op}: expected grad_output of size {list(expected)} (the convolution's output), got {list(grad_output.shape)}",
    )


def _channels_last(rank):
    return torch.channels_last_3d if rank == 5 else torch.channels_last


def _result_format(activation, weight):
    """Mirrors result_format (csrc/route.h): an operator's activation result is channels_last
    (channels_last_3d for volumes) where its activation operand or the weight suggests it (as
    F.conv2d decides on the CPU), the batch is not empty, and the device is not meta (where
    F.conv2d returns contiguous tensors); never does the route decide."""
    if activation.dim() not in (4, 5) or activation.shape[0] == 0 or activation.device.type == "meta":
        return torch.contiguous_format
    channels_last = _channels_last(activation.dim())
    suggested = channels_last in (suggest_memory_format(activation), suggest_memory_format(weight))
    return channels_last if suggested else torch.contiguous_format


def _weight_grad_format(input):
    """Mirrors weight_grad_format (csrc/route.h): the weight gradient is channels_last where the
    input suggests it (the operator sees no weight), under result_format's other conditions."""
    return _result_format(input, input)


def _empty(like, size, memory_format):
    return torch.empty(size, dtype=like.dtype, device=like.device, memory_format=memory_format)


def _register_convolution_fakes(name, dims):
    """The fakes of the three operators of one dimension: name (conv2d, conv3d), name_input_grad
    and name_weight_grad."""

    @register_fake(f"torch_convbp::{name}")
    def _forward_fake(input, weight, bias, stride, padding, dilation, groups):
        op = f"torch_convbp.{name}"
        if bias is None:
            check_operands(op, input=input, weight=weight)
        else:
            check_operands(op, input=input, weight=weight, bias=bias)
        output_size = conv_output_size(op, dims, input.shape, weight.shape, stride, padding, dilation, groups)
        c_out = weight.shape[0]
        if bias is not None:
            torch._check(
                bias.dim() == 1 and bias.shape[0] == c_out,
                lambda: f"{op}: expected bias of size [{c_out}] (one per output channel), got {list(bias.shape)}",
            )
        return _empty(input, (input.shape[0], c_out, *output_size), _result_format(input, weight))

    @register_fake(f"torch_convbp::{name}_input_grad")
    def _input_grad_fake(grad_output, weight, input_size, stride, padding, dilation, groups):
        op = f"torch_convbp.{name}_input_grad"
        check_operands(op, grad_output=grad_output, weight=weight)
        output_size = conv_output_size(op, dims, input_size, weight.shape, stride, padding, dilation, groups)
        _check_grad_output(op, grad_output, (input_size[0], weight.shape[0], *output_size))
        return _empty(grad_output, input_size, _result_format(grad_output, weight))

    @register_fake(f"torch_convbp::{name}_weight_grad")
    def _weight_grad_fake(input, grad_output, weight_size, stride, padding, dilation, groups):
        op = f"torch_convbp.{name}_weight_grad"
        check_operands(op, input=input, grad_output=grad_output)
        output_size = conv_output_size(op, dims, input.shape, weight_size, stride, padding, dilation, groups)
        _check_grad_output(op, grad_output, (input.shape[0], weight_size[0], *output_size))
        return _empty(input, weight_size, _weight_grad_format(input))


_register_convolution_fakes("conv2d", dims=2)
_register_convolution_fakes("conv3d", dims=3)


def _check_columns(op, nhwc, images, columns, kernel_size, stride, padding, dilation, row_start, rows):
    """Mirrors check_columns (csrc/checks.cpp): images [N, C, H, W] or [N, C, D, H, W], whose
    output "rows" are depth slices times rows."""
    check_operands(op, images=images)
    torch._check(
        columns.layout == torch.strided,
        lambda: f"{op}: columns must be a dense (strided) tensor, got layout {columns.layout}",
    )
    volumes = images.dim() == 5
    memory_format = _channels_last(images.dim()) if nhwc else torch.contiguous_format
    torch._check(
        images.dim() in (4, 5) and images.is_contiguous(memory_format=memory_format),
        lambda: f"{op}: expected {'dense channels_last' if nhwc else 'contiguous'} images [N, C, H, W] or "
        f"[N, C, D, H, W], got size {list(images.shape)} and strides {list(images.stride())}",
    )
    torch._check(columns.is_contiguous(), lambda: f"{op}: expected a contiguous column matrix")
    # The GEMMs may run in float32 for float16 and bfloat16 images (gemm_choice.h).
    half_images = images.dtype in (torch.float16, torch.bfloat16)
    torch._check(
        columns.dtype == images.dtype or (half_images and columns.dtype == torch.float32),
        lambda: f"{op}: columns must have the images' dtype, or float32 for float16 and bfloat16 images; "
        f"got images {images.dtype} and columns {columns.dtype}",
    )
    torch._check(
        images.device == columns.device,
        lambda: f"{op}: images and columns must be on the same device, got {images.device} and {columns.device}",
    )
    dims = images.dim() - 2
    torch._check(
        len(kernel_size) == dims,
        lambda: f"{op}: expected kernel_size to have {dims} values, one per spatial dimension of the images, "
        f"got {list(kernel_size)}",
    )
    channels = images.shape[1]
    weight_size = (1, channels, *kernel_size)
    output_size = conv_output_size(op, dims, images.shape, weight_size, stride, padding, dilation, 1)
    output_rows = math.prod(output_size[:-1])
    torch._check(
        0 <= row_start and 0 <= rows and row_start + rows <= output_rows,
        lambda: f"{op}: output rows [{row_start}, {row_start + rows}) are outside the output "
        f"{'rows (depth slices times rows) ' if volumes else 'height '}{output_rows}",
    )
    pixels = images.shape[0] * rows * output_size[-1]
    column_rows = channels * math.prod(kernel_size)
    if nhwc:
        groups = columns.shape[0] if columns.dim() == 3 else 0
        torch._check(
            groups > 0 and channels % groups == 0,
            lambda: f"{op}: expected a column matrix [groups, pixels, kh*kw*channels/groups] whose groups divide "
            f"the images' {channels} channels, got size {list(columns.shape)}",
        )
        expected = [groups, pixels, column_rows // groups]
        torch._check(
            list(columns.shape) == expected,
            lambda: f"{op}: expected a column matrix of size {expected} ([groups, pixels, kh*kw*channels/groups]), "
            f"got {list(columns.shape)}",
        )
    else:
        torch._check(
            columns.numel() == column_rows * pixels,
            lambda: f"{op}: expected a column matrix of {column_rows * pixels} elements "
            f"([{column_rows}, {pixels}]), got {columns.numel()}",
        )


def _register_column_fakes(name, nhwc):
    """The fakes of im2col/col2im (and their _nhwc twins): checks only, they write in place."""
    op = f"torch_convbp.{name}"

    @register_fake(f"torch_convbp::{name}")
    def _fake(source, kernel_size, stride, padding, dilation, row_start, rows, target):
        images, columns = (source, target) if name.startswith("im2col") else (target, source)
        _check_columns(op, nhwc, images, columns, kernel_size, stride, padding, dilation, row_start, rows)


for _name in ("im2col", "col2im", "im2col_nhwc", "col2im_nhwc"):
    _register_column_fakes(_name, nhwc=_name.endswith("_nhwc"))


def _channels_last_of(dims):
    """Mirrors channels_last_of (csrc/checks.cpp): the channels-last format of tensors of `dims`
    spatial dimensions, and its name in messages."""
    return (torch.channels_last_3d, "channels_last_3d") if dims == 3 else (torch.channels_last, "channels_last")


def _check_direct_kernel_call(
    op, input, weight, output, stride, padding, dilation, groups, channels_last_weight=False, dims=2
):
    """Mirrors check_direct_kernel_call (csrc/checks.cpp); groups None: one per input channel;
    channels_last_weight: a dense channels_last weight is taken too (WeightLayouts); dims 3: volumes."""
    check_operands(op, input=input, weight=weight, output=output)
    torch._check(
        input.dim() == dims + 2,
        lambda: f"{op}: expected a {dims + 2}-D input [N, C, {'D, ' if dims == 3 else ''}H, W], "
        f"got size {list(input.shape)}",
    )
    groups = input.shape[1] if groups is None else groups
    spatial = conv_output_size(op, dims, input.shape, weight.shape, stride, padding, dilation, groups)
    expected = [input.shape[0], weight.shape[0], *spatial]
    torch._check(
        list(output.shape) == expected, lambda: f"{op}: expected output of size {expected}, got {list(output.shape)}"
    )
    if channels_last_weight:
        last, name = _channels_last_of(dims)
        torch._check(
            weight.is_contiguous() or weight.is_contiguous(memory_format=last),
            lambda: f"{op}: expected a contiguous or {name} (dense) weight, got strides {list(weight.stride())}",
        )
    else:
        torch._check(weight.is_contiguous(), lambda: f"{op}: expected a contiguous weight")


def _check_both_channels_last(op, input, output):
    """Mirrors both_channels_last (csrc/checks.cpp)."""
    both_nchw = input.is_contiguous() and output.is_contiguous()
    last, name = _channels_last_of(input.dim() - 2)
    torch._check(
        both_nchw or (input.is_contiguous(memory_format=last) and output.is_contiguous(memory_format=last)),
        lambda: f"{op}: expected input and output both contiguous or both {name} (dense), got strides "
        f"{list(input.stride())} and {list(output.stride())}",
    )


def _check_depthwise(op, input, weight, output, stride, padding, dilation):
    _check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, None)
    _check_both_channels_last(op, input, output)


@register_fake("torch_convbp::depthwise_conv2d")
def _depthwise_conv2d_fake(input, weight, stride, padding, dilation, output):
    _check_depthwise("torch_convbp.depthwise_conv2d", input, weight, output, stride, padding, dilation)


@register_fake("torch_convbp::depthwise_input_grad")
def _depthwise_input_grad_fake(grad_output, weight, stride, padding, dilation, grad_input):
    _check_depthwise("torch_convbp.depthwise_input_grad", grad_input, weight, grad_output, stride, padding, dilation)


@register_fake("torch_convbp::depthwise_weight_grad")
def _depthwise_weight_grad_fake(input, grad_output, stride, padding, dilation, grad_weight):
    _check_depthwise("torch_convbp.depthwise_weight_grad", input, grad_weight, grad_output, stride, padding, dilation)


def _check_depthwise_volumes(op, input, weight, output, stride, padding, dilation):
    """Mirrors check_depthwise_volumes (csrc/checks.cpp)."""
    _check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, None, dims=3)
    torch._check(
        input.dtype in (torch.float32, torch.float64),
        lambda: f"{op}: computes float32 and float64 only, got {input.dtype}",
    )
    _check_both_channels_last(op, input, output)


@register_fake("torch_convbp::depthwise_conv3d")
def _depthwise_conv3d_fake(input, weight, stride, padding, dilation, output):
    _check_depthwise_volumes("torch_convbp.depthwise_conv3d", input, weight, output, stride, padding, dilation)


@register_fake("torch_convbp::depthwise_conv3d_input_grad")
def _depthwise_conv3d_input_grad_fake(grad_output, weight, stride, padding, dilation, grad_input):
    _check_depthwise_volumes(
        "torch_convbp.depthwise_conv3d_input_grad", grad_input, weight, grad_output, stride, padding, dilation
    )


@register_fake("torch_convbp::depthwise_conv3d_weight_grad")
def _depthwise_conv3d_weight_grad_fake(input, grad_output, stride, padding, dilation, grad_weight):
    _check_depthwise_volumes(
        "torch_convbp.depthwise_conv3d_weight_grad", input, grad_weight, grad_output, stride, padding, dilation
    )


def _check_grouped(op, input, weight, output, stride, padding, dilation, groups):
    """Mirrors check_grouped (csrc/checks.cpp)."""
    _check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, groups)
    torch._check(
        input.is_contiguous(memory_format=torch.channels_last) and output.is_contiguous(memory_format=torch.channels_last),
        lambda: f"{op}: expected input and output both channels_last (dense), got strides "
        f"{list(input.stride())} and {list(output.stride())}",
    )


@register_fake("torch_convbp::grouped_conv2d")
def _grouped_conv2d_fake(input, weight, stride, padding, dilation, groups, output):
    _check_grouped("torch_convbp.grouped_conv2d", input, weight, output, stride, padding, dilation, groups)


def _check_implicit_dtype(op, t, group_in):
    """Mirrors check_dtype (csrc/cpu/implicit_nhwc_cpu.cpp), but for the CPU's bfloat16
    arithmetic, which a fake tensor cannot see."""
    torch._check(
        t.dtype in (torch.float32, torch.bfloat16),
        lambda: f"{op}: computes float32 and bfloat16 only, got {t.dtype}",
    )
    torch._check(
        t.dtype != torch.bfloat16 or group_in % 2 == 0,
        lambda: f"{op}: computes bfloat16 with an even number of input channels per group only (pairs of "
        f"the micro-kernel's VNNI layout), got {group_in}",
    )


def _check_implicit_call(op, read, read_name, result, result_name, group_in):
    """Mirrors check_implicit_call (csrc/checks.cpp) past the shared checks, then check_dtype
    (csrc/cpu/implicit_nhwc_cpu.cpp) as _check_implicit_dtype, and its refusal of a bfloat16
    result in NCHW. Volumes: channels_last_3d."""
    nhwc, name = _channels_last_of(read.dim() - 2)
    torch._check(
        read.is_contiguous(memory_format=nhwc),
        lambda: f"{op}: expected a {name} (dense) {read_name}, got strides {list(read.stride())}",
    )
    torch._check(
        result.is_contiguous(memory_format=nhwc) or result.is_contiguous(),
        lambda: f"{op}: expected a {name} or contiguous (dense) {result_name}, got strides {list(result.stride())}",
    )
    _check_implicit_dtype(op, read, group_in)
    torch._check(
        read.dtype != torch.bfloat16 or result.is_contiguous(memory_format=nhwc),
        lambda: f"{op}: writes bfloat16 results channels_last only (contiguous ones: float32)",
    )


def _register_implicit_fakes(dims):
    """The fakes of the implicit forward, input gradient and weight gradient of images (dims 2) or
    volumes (dims 3): checks only, they write in place. Mirror implicit_forward and
    implicit_input_grad (csrc/cpu/implicit_nhwc_cpu.cpp) and implicit_weight_grad_cpu
    (csrc/cpu/implicit_weight_grad_cpu.cpp)."""
    forward, input_grad = f"implicit_conv{dims}d", f"implicit_conv{dims}d_input_grad"
    weight_grad = f"implicit_conv{dims}d_weight_grad"

    @register_fake(f"torch_convbp::{forward}")
    def _forward_fake(input, weight, stride, padding, dilation, groups, output):
        op = f"torch_convbp.{forward}"
        _check_direct_kernel_call(op, input, weight, output, stride, padding, dilation, groups, channels_last_weight=True, dims=dims)
        _check_implicit_call(op, input, "input", output, "output", weight.shape[1])

    @register_fake(f"torch_convbp::{input_grad}")
    def _input_grad_fake(grad_output, weight, stride, padding, dilation, groups, grad_input):
        op = f"torch_convbp.{input_grad}"
        _check_direct_kernel_call(
            op, grad_input, weight, grad_output, stride, padding, dilation, groups, channels_last_weight=True, dims=dims
        )
        _check_implicit_call(op, grad_output, "output", grad_input, "input", weight.shape[0] // groups)

    @register_fake(f"torch_convbp::{weight_grad}")
    def _weight_grad_fake(input, grad_output, stride, padding, dilation, groups, grad_weight):
        op = f"torch_convbp.{weight_grad}"
        _check_direct_kernel_call(
            op, input, grad_weight, grad_output, stride, padding, dilation, groups, channels_last_weight=True, dims=dims
        )
        _check_both_channels_last(op, input, grad_output)
        torch._check(
            input.dtype in (torch.float32, torch.bfloat16),
            lambda: f"{op}: computes float32 and bfloat16 only, got {input.dtype}",
        )
        torch._check(list(stride) == [1] * dims, lambda: f"{op}: computes stride 1 only, got stride {list(stride)}")


for _dims in (2, 3):
    _register_implicit_fakes(_dims)


@register_fake("torch_convbp::grouped_weight_grad")
def _grouped_weight_grad_fake(input, grad_output, stride, padding, dilation, groups, grad_weight):
    _check_grouped("torch_convbp.grouped_weight_grad", input, grad_weight, grad_output, stride, padding, dilation, groups)


@register_fake("torch_convbp::transpose_taps")
def _transpose_taps_fake(source, target, reverse_taps):
    """Mirrors check_transpose_taps (csrc/checks.cpp)."""
    op = "torch_convbp.transpose_taps"
    check_same_kind(op, source=source, target=target)
    torch._check(
        source.element_size() <= 8,
        lambda: f"{op}: elements of {source.element_size()} bytes are not supported (at most 8)",
    )
    torch._check(
        source.dim() == 4 and source.is_contiguous(),
        lambda: f"{op}: expected a contiguous 4-D source [G, A, B, taps], got size {list(source.shape)} "
        f"and strides {list(source.stride())}",
    )
    transposed = [source.shape[0], source.shape[2], source.shape[1], source.shape[3]]
    torch._check(
        list(target.shape) == transposed,
        lambda: f"{op}: expected a target of size {transposed} (each group's A and B swapped), got {list(target.shape)}",
    )
    torch._check(
        torch._debug_has_internal_overlap(target) != 1,  # 1: MemOverlap::Yes
        lambda: f"{op}: the target has elements that share memory (an expanded tensor?); expected each to have its own",
    )


@register_fake("torch_convbp::transpose_copy")
def _transpose_copy_fake(source, target):
    """Mirrors check_transpose_copy (csrc/checks.cpp)."""
    op = "torch_convbp.transpose_copy"
    check_same_kind(op, source=source, target=target)
    torch._check(
        source.element_size() <= 8,
        lambda: f"{op}: elements of {source.element_size()} bytes are not supported (at most 8)",
    )
    torch._check(source.dim() == 3, lambda: f"{op}: expected a 3-D source [B, R, C], got {list(source.shape)}")
    transposed = [source.shape[0], source.shape[2], source.shape[1]]
    torch._check(
        list(target.shape) == transposed,
        lambda: f"{op}: expected a target of size {transposed} (the source's matrices transposed), got {list(target.shape)}",
    )
    for name, t in (("source", source), ("target", target)):
        torch._check(
            t.shape[2] <= 1 or t.stride(2) == 1,
            lambda: f"{op}: expected the {name}'s rows contiguous (unit last stride), got strides {list(t.stride())}",
        )
    torch._check(
        torch._debug_has_internal_overlap(target) != 1,  # 1: MemOverlap::Yes
        lambda: f"{op}: the target has elements that share memory (an expanded tensor?); expected each to have its own",
    )
    # Whether the source and the target share memory depends on storage a fake tensor does not have.
