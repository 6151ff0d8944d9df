"""The cases of the rest of the convolution family (conv1d, conv_transpose1d, conv_transpose2d,
conv3d, conv_transpose3d), and independent references for the transposed convolution and for
convolutions of any dimension."""
import itertools
from dataclasses import dataclass
from typing import Tuple, Union

import torch
import torch.nn.functional as F

import torch_convbp


@dataclass(frozen=True)
class FamilyCase:
    name: str
    function: str  # conv1d, conv_transpose1d, conv_transpose2d, conv3d or conv_transpose3d
    batch: int  # None: an unbatched input
    in_channels: int
    size: Tuple[int, ...]  # input's spatial size
    out_channels: int
    kernel: Tuple[int, ...]
    stride: Union[int, tuple] = 1
    padding: Union[int, tuple, str] = 0
    output_padding: Union[int, tuple] = 0  # transposed only
    dilation: Union[int, tuple] = 1
    groups: int = 1
    bias: bool = True

    def __str__(self):
        return f"{self.function}-{self.name}"

    @property
    def transposed(self):
        return self.function.startswith("conv_transpose")

    def tensors(self, dtype=torch.float64, requires_grad=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        leading = () if self.batch is None else (self.batch,)
        x = torch.randn(*leading, self.in_channels, *self.size, generator=g, dtype=dtype)
        if self.transposed:  # [C_in, C_out/groups, k...]
            w = torch.randn(self.in_channels, self.out_channels // self.groups, *self.kernel, generator=g, dtype=dtype)
        else:  # [C_out, C_in/groups, k...]
            w = torch.randn(self.out_channels, self.in_channels // self.groups, *self.kernel, generator=g, dtype=dtype)
        b = torch.randn(self.out_channels, generator=g, dtype=dtype) if self.bias else None
        return [t if t is None else t.requires_grad_(requires_grad) for t in (x, w, b)]

    def kwargs(self):
        args = dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)
        if self.transposed:
            args["output_padding"] = self.output_padding
        return args

    def ours(self, x, w, b):
        return getattr(torch_convbp, self.function)(x, w, b, **self.kwargs())

    def reference(self, x, w, b):
        return getattr(F, self.function)(x, w, b, **self.kwargs())


T2, T1, C1 = "conv_transpose2d", "conv_transpose1d", "conv1d"
FAMILY_CASES = [
    FamilyCase("basic", T2, 2, 3, (5, 4), 4, (3, 3)),
    FamilyCase("strided-output-padding", T2, 2, 4, (4, 5), 6, (3, 3), stride=2, padding=1, output_padding=1),
    FamilyCase("asymmetric-everything", T2, 2, 4, (5, 4), 6, (3, 2), stride=(2, 3), padding=(1, 0),
               output_padding=(1, 2), dilation=(1, 2), groups=2),
    FamilyCase("output-padding-below-dilation", T2, 2, 4, (4, 4), 2, (3, 3), stride=1, padding=2,
               output_padding=1, dilation=2, groups=2),
    FamilyCase("output-padding-past-padding", T2, 1, 2, (3, 3), 3, (2, 3), stride=(1, 2), padding=(0, 1),
               output_padding=(2, 1), dilation=(3, 2)),
    FamilyCase("depthwise", T2, 2, 4, (5, 5), 4, (3, 3), stride=2, padding=1, output_padding=1, groups=4),
    FamilyCase("channel-multiplier", T2, 1, 3, (4, 4), 6, (2, 2), stride=2, groups=3, bias=False),
    FamilyCase("kernel-4-stride-2-gan", T2, 2, 6, (4, 4), 3, (4, 4), stride=2, padding=1),
    FamilyCase("pointwise", T2, 3, 4, (3, 4), 5, (1, 1)),
    FamilyCase("large-padding", T2, 1, 2, (6, 6), 2, (3, 3), padding=3),
    FamilyCase("unbatched", T2, None, 3, (4, 3), 2, (3, 2), stride=2, output_padding=1),
    FamilyCase("batch-one", T2, 1, 3, (3, 3), 2, (3, 3), stride=3, padding=1, output_padding=2),
    FamilyCase("batch-zero", T2, 0, 3, (3, 3), 2, (3, 3), stride=2),
    FamilyCase("basic", C1, 2, 3, (9,), 4, (3,)),
    FamilyCase("strided-grouped-dilated", C1, 2, 4, (13,), 6, (3,), stride=2, padding=2, dilation=2, groups=2),
    FamilyCase("same-even-kernel", C1, 2, 3, (8,), 2, (4,), padding="same", dilation=3),
    FamilyCase("valid", C1, 1, 2, (7,), 3, (5,), padding="valid", bias=False),
    FamilyCase("depthwise", C1, 2, 4, (10,), 8, (3,), padding=1, groups=4),
    FamilyCase("unbatched", C1, None, 3, (9,), 2, (2,), stride=3, padding=(1,)),
    FamilyCase("batch-zero", C1, 0, 3, (9,), 2, (3,)),
    FamilyCase("basic", T1, 2, 3, (6,), 4, (3,)),
    FamilyCase("strided-grouped-dilated", T1, 2, 4, (5,), 6, (3,), stride=3, padding=1, output_padding=2,
               dilation=2, groups=2),
    FamilyCase("output-padding-below-dilation", T1, 1, 2, (4,), 3, (2,), stride=1, output_padding=2, dilation=3),
    FamilyCase("unbatched", T1, None, 3, (5,), 2, (4,), stride=2, padding=1, output_padding=1),
    FamilyCase("batch-zero", T1, 0, 3, (5,), 2, (2,)),
]

C3, T3 = "conv3d", "conv_transpose3d"
VOLUME_CASES = [
    FamilyCase("basic", C3, 2, 3, (4, 5, 4), 4, (3, 3, 3)),
    FamilyCase("asymmetric-everything", C3, 2, 4, (5, 6, 7), 6, (3, 2, 3), stride=(2, 1, 3), padding=(1, 0, 2),
               dilation=(1, 2, 1), groups=2),
    FamilyCase("same-even-kernel", C3, 1, 2, (4, 5, 6), 3, (2, 3, 4), padding="same", dilation=(3, 1, 2)),
    FamilyCase("valid", C3, 2, 2, (3, 4, 5), 3, (2, 2, 3), padding="valid", bias=False),
    FamilyCase("depthwise-channel-multiplier", C3, 2, 4, (4, 5, 5), 8, (3, 3, 3), padding=1, groups=4),
    FamilyCase("pointwise-strided-shortcut", C3, 2, 4, (5, 5, 5), 6, (1, 1, 1), stride=2, bias=False),
    FamilyCase("pointwise", C3, 2, 4, (3, 4, 5), 6, (1, 1, 1)),
    FamilyCase("spatial-1x3x3", C3, 2, 4, (3, 6, 6), 5, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
    FamilyCase("temporal-3x1x1", C3, 2, 5, (4, 3, 3), 4, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)),
    FamilyCase("stem-3x7x7", C3, 1, 3, (4, 9, 9), 4, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3)),
    FamilyCase("kernel-as-large-as-the-padded-input", C3, 2, 2, (2, 3, 2), 3, (4, 3, 4), padding=(1, 0, 1)),
    FamilyCase("unbatched", C3, None, 3, (4, 3, 5), 2, (2, 2, 3), stride=(1, 2, 1), padding=1),
    FamilyCase("batch-zero", C3, 0, 3, (3, 3, 3), 2, (2, 2, 2)),
    FamilyCase("basic", T3, 2, 3, (3, 4, 3), 4, (3, 3, 3)),
    FamilyCase("upsampling-2x2x2-stride-2", T3, 2, 4, (3, 3, 2), 2, (2, 2, 2), stride=2),
    FamilyCase("asymmetric-everything", T3, 2, 4, (3, 4, 3), 6, (3, 2, 3), stride=(2, 3, 1), padding=(1, 0, 1),
               output_padding=(1, 2, 0), dilation=(1, 2, 1), groups=2),
    FamilyCase("output-padding-below-dilation", T3, 1, 2, (3, 3, 3), 2, (2, 3, 2), stride=1, padding=(0, 1, 2),
               output_padding=(2, 1, 1), dilation=(3, 2, 2)),
    FamilyCase("depthwise", T3, 2, 4, (3, 4, 4), 4, (3, 3, 3), stride=2, padding=1, output_padding=1, groups=4),
    FamilyCase("pointwise", T3, 2, 4, (3, 3, 4), 5, (1, 1, 1)),
    FamilyCase("unbatched", T3, None, 3, (3, 2, 3), 2, (2, 3, 2), stride=2, output_padding=1),
    FamilyCase("batch-zero", T3, 0, 3, (2, 2, 2), 2, (2, 2, 2), stride=2),
]


def _tuple(value, n):
    return (value,) * n if isinstance(value, int) else tuple(value)


def tapwise_convolution(x, w, b, stride, padding, dilation, groups):
    """The definition of a convolution of any dimension, one kernel tap at a time: output pixel p
    sums w[:, :, tap] · x[p·stride - padding + tap·dilation] over the taps (forward only). A
    tap's inputs are one strided slice of the zero-padded input; neither F nor an im2col."""
    n, dims = x.shape[0], x.dim() - 2
    stride, padding, dilation = (_tuple(v, dims) for v in (stride, padding, dilation))
    kernel = w.shape[2:]
    padded = x.new_zeros(n, x.shape[1], *(s + 2 * p for s, p in zip(x.shape[2:], padding)))
    padded[(..., *(slice(p, p + s) for p, s in zip(padding, x.shape[2:])))] = x
    out_size = [(s - d * (k - 1) - 1) // t + 1 for s, d, k, t in zip(padded.shape[2:], dilation, kernel, stride)]
    out = x.new_zeros(n, w.shape[0], *out_size)
    c_in, c_out = x.shape[1] // groups, w.shape[0] // groups
    for tap in itertools.product(*map(range, kernel)):
        reached = padded[(..., *(slice(t * d, t * d + s * (o - 1) + 1, s)
                                 for t, d, s, o in zip(tap, dilation, stride, out_size)))]
        for g in range(groups):
            out[:, g * c_out:(g + 1) * c_out] += torch.einsum(
                "nc...,oc->no...", reached[:, g * c_in:(g + 1) * c_in], w[(slice(g * c_out, (g + 1) * c_out), slice(None), *tap)])
    return out if b is None else out + b.view(1, -1, *[1] * dims)


def tapwise_transposed_convolution(x, w, b, stride, padding, output_padding, dilation, groups):
    """The definition of a transposed convolution of any dimension, one kernel tap at a time, as a
    scatter: input pixel i adds x[i] · w[:, :, tap] to output pixel i·stride - padding + tap·dilation.
    The scatter fills an uncropped output, which then loses `padding` at each end and keeps
    `output_padding` more at the far end (forward only)."""
    n, dims = x.shape[0], x.dim() - 2
    stride, padding, output_padding, dilation = (_tuple(v, dims) for v in (stride, padding, output_padding, dilation))
    kernel, c_in, c_out = w.shape[2:], x.shape[1] // groups, w.shape[1]
    full = [(i - 1) * s + d * (k - 1) + 1 + o
            for i, s, d, k, o in zip(x.shape[2:], stride, dilation, kernel, output_padding)]
    out = x.new_zeros(n, c_out * groups, *full)
    for tap in itertools.product(*map(range, kernel)):
        target = (..., *(slice(t * d, t * d + s * (i - 1) + 1, s) for t, d, s, i in zip(tap, dilation, stride, x.shape[2:])))
        for g in range(groups):
            out[:, g * c_out:(g + 1) * c_out][target] += torch.einsum(
                "nc...,co->no...", x[:, g * c_in:(g + 1) * c_in], w[(slice(g * c_in, (g + 1) * c_in), slice(None), *tap)])
    out = out[(..., *(slice(p, f - p) for p, f in zip(padding, full)))]
    return out if b is None else out + b.view(1, -1, *[1] * dims)


def loop_conv_transpose2d(x, w, b, stride, padding, output_padding, dilation, groups):
    """The definition, as a scatter: input pixel (i, j) adds x * w[tap] to output pixel
    (i·s - p + ki·d, j·s - p + kj·d), one multiply-add at a time (forward only; tiny shapes)."""
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = map(pair, (stride, padding, output_padding, dilation))
    n, cin, h, wd = x.shape
    _, cg_out, kh, kw = w.shape
    cg_in = cin // groups
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    out = [[[[0.0 if b is None else float(b[g * cg_out + o]) for _ in range(ow)] for _ in range(oh)]
            for g in range(groups) for o in range(cg_out)] for _ in range(n)]
    xl, wl = x.double().tolist(), w.double().tolist()
    for s in range(n):
        for c in range(cin):
            g = c // cg_in
            for i in range(h):
                for j in range(wd):
                    for o in range(cg_out):
                        for ki in range(kh):
                            for kj in range(kw):
                                r, q = i * sh - ph + ki * dh, j * sw - pw + kj * dw
                                if 0 <= r < oh and 0 <= q < ow:
                                    out[s][g * cg_out + o][r][q] += xl[s][c][i][j] * wl[c][o][ki][kj]
    return torch.tensor(out, dtype=torch.float64).view(n, groups * cg_out, oh, ow)
