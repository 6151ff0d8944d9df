"""Everything F.conv2d refuses is refused, with a message that names the problem."""
import pytest
import torch

import torch_convbp

ops = torch.ops.torch_convbp
x = torch.randn(2, 4, 6, 6)
w = torch.randn(6, 2, 3, 3)
x_cl = x.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: torch_convbp.conv2d(x.double(), w), RuntimeError, r"input \(torch.float64\) and weight \(torch.float32\) must have the same dtype"),
        (lambda: torch_convbp.conv2d(x, w, torch.zeros(6, dtype=torch.float64), groups=2), RuntimeError, r"bias .* must have the same dtype"),
        (lambda: torch_convbp.conv2d(x.long(), w.long()), RuntimeError, "must be float64, float32, float16 or bfloat16"),
        (lambda: torch_convbp.conv2d(x, w.to("meta"), groups=2), RuntimeError, "must be on the same device"),
        (lambda: torch_convbp.conv2d(x, w, stride=0, groups=2), RuntimeError, "stride must be positive"),
        (lambda: torch_convbp.conv2d(x, w, stride=(1, -1), groups=2), RuntimeError, "stride must be positive"),
        (lambda: torch_convbp.conv2d(x, w, dilation=0, groups=2), RuntimeError, "dilation must be positive"),
        (lambda: torch_convbp.conv2d(x, w, padding=-1, groups=2), RuntimeError, "padding must be non-negative"),
        (lambda: torch_convbp.conv2d(x, w, groups=0), RuntimeError, "groups must be positive"),
        (lambda: torch_convbp.conv2d(x, w, groups=-2), RuntimeError, "groups must be positive"),
        (lambda: torch_convbp.conv2d(x, torch.randn(6, 4, 3, 3), groups=3), RuntimeError, "expected input .* to have 12 channels, but got 4"),
        (lambda: torch_convbp.conv2d(x, torch.randn(5, 2, 3, 3), groups=2), RuntimeError, "out_channels .* must be divisible by groups"),
        (lambda: torch_convbp.conv2d(x, torch.randn(6, 3, 3, 3)), RuntimeError, "to have 3 channels, but got 4 channels"),
        (lambda: torch_convbp.conv2d(x[0, 0], w), RuntimeError, r"expected 3D \(unbatched\) or 4D \(batched\) input"),
        (lambda: torch_convbp.conv2d(x[None], w), RuntimeError, r"expected 3D \(unbatched\) or 4D \(batched\) input"),
        (lambda: torch_convbp.conv2d(x, w[0]), RuntimeError, "expected a 4-D weight"),
        (lambda: torch_convbp.conv2d(x, w[0], padding="same"), RuntimeError, "expected a 4-D weight"),
        (lambda: torch_convbp.conv2d(x, torch.randn(6, 2, 9, 3), groups=2), RuntimeError, "smaller than the dilated kernel"),
        (lambda: torch_convbp.conv2d(x, w, dilation=4, groups=2), RuntimeError, "smaller than the dilated kernel"),
        (lambda: torch_convbp.conv2d(x, w, torch.zeros(5), groups=2), RuntimeError, r"expected bias of size \[6\]"),
        (lambda: torch_convbp.conv2d(x, w, torch.zeros(6, 1), groups=2), RuntimeError, r"expected bias of size \[6\]"),
        (lambda: torch_convbp.conv2d(x, w, padding="full", groups=2), ValueError, "invalid padding string 'full'"),
        (lambda: torch_convbp.conv2d(x, w, stride=2, padding="same", groups=2), ValueError, "'same' is not supported for strided"),
        (lambda: torch_convbp.conv2d(x, w, stride=(1, 1, 1), groups=2), ValueError, "stride to be a single integer value or a list of 2"),
        (lambda: torch_convbp.conv2d(x, w, padding=1.5, groups=2), ValueError, "padding to be a single integer"),
        (lambda: torch_convbp.conv2d(x, w, groups=2.0), ValueError, "groups to be an integer"),
        (lambda: torch_convbp.conv2d(x.to_sparse(), w, groups=2), RuntimeError, "dense"),
        (lambda: ops.conv2d_input_grad(torch.randn(2, 6, 5, 5), w, [2, 4, 6, 6], (1, 1), (0, 0), (1, 1), 2), RuntimeError, r"expected grad_output of size \[2, 6, 4, 4\]"),
        (lambda: ops.conv2d_weight_grad(x, torch.randn(2, 6, 4, 4), [6, 2, 3, 3], (1, 1), (0, 0), (1, 1), 4), RuntimeError, "must be divisible by groups"),
        (lambda: ops.conv2d(x, w, None, (1,), (0, 0), (1, 1), 2), RuntimeError, "stride"),
        (lambda: ops.im2col(x, (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, torch.empty(5)), RuntimeError, "expected a column matrix of"),
        (lambda: ops.im2col(x, (3, 3), (1, 1), (0, 0), (1, 1), 2, 4, torch.empty(4 * 9 * 2 * 4 * 4)), RuntimeError, r"output rows \[2, 6\) are outside"),
        (lambda: ops.im2col_nhwc(x, (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, torch.empty(1, 32, 36)), RuntimeError, "expected dense channels_last images"),
        (lambda: ops.im2col_nhwc(x_cl, (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, torch.empty(32, 36)), RuntimeError, "whose groups divide the images' 4 channels"),
        (lambda: ops.im2col_nhwc(x_cl, (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, torch.empty(3, 32, 12)), RuntimeError, "whose groups divide the images' 4 channels"),
        (lambda: ops.col2im_nhwc(torch.empty(2, 32, 9), (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, x_cl), RuntimeError, r"expected a column matrix of size \[2, 32, 18\]"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_refused_with_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: ops.conv2d(x.to("meta"), w.to("meta"), None, (1, 1), (0, 0), (1, 1), 3),
        lambda: ops.conv2d(x.to("meta"), w.to("meta"), None, (0, 1), (0, 0), (1, 1), 2),
        lambda: ops.conv2d_input_grad(torch.empty(2, 6, 5, 5, device="meta"), w.to("meta"), [2, 4, 6, 6], (1, 1), (0, 0), (1, 1), 2),
    ],
)
def test_fake_kernels_refuse_what_the_operators_refuse(call):
    with pytest.raises(RuntimeError, match="torch_convbp"):
        call()


def test_same_error_as_f_conv2d_for_every_invalid_case_still_raises_there():
    """Sanity: the cases above are ones F.conv2d refuses too (where it has the same argument)."""
    import torch.nn.functional as F

    for call in (
        lambda: F.conv2d(x, torch.randn(5, 2, 3, 3), groups=2),
        lambda: F.conv2d(x, w, groups=0),
        lambda: F.conv2d(x, torch.randn(6, 2, 9, 3), groups=2),
        lambda: F.conv2d(x, w, stride=2, padding="same", groups=2),
    ):
        with pytest.raises((RuntimeError, ValueError)):
            call()


@pytest.mark.parametrize(
    "images, columns, match",
    [
        (x, torch.empty(1, 32, 36), "expected dense channels_last images"),
        (x_cl, torch.empty(3, 32, 12), "whose groups divide the images' 4 channels"),
        (x_cl, torch.empty(2, 32, 9), r"expected a column matrix of size \[2, 32, 18\]"),
    ],
    ids=["contiguous images", "groups", "size"],
)
@pytest.mark.parametrize("op", ["im2col_nhwc", "col2im_nhwc"])
def test_nhwc_column_kernels_and_their_fakes_give_the_same_message(op, images, columns, match):
    for device in ("cpu", "meta"):
        meta_images = images.to(device).contiguous(memory_format=torch.channels_last if images is x_cl else torch.contiguous_format)
        args = (columns.to(device), meta_images) if op.startswith("col2im") else (meta_images, columns.to(device))
        with pytest.raises(RuntimeError, match=match):
            getattr(ops, op)(args[0], (3, 3), (1, 1), (0, 0), (1, 1), 0, 4, args[1])
