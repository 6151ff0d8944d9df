"""The convolution cases every correctness test runs over, and an independent reference."""
from dataclasses import dataclass
from typing import Tuple, Union

import torch


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    in_channels: int
    size: Tuple[int, int]  # input H, W
    out_channels: int
    kernel: Tuple[int, int]
    stride: Union[int, tuple] = 1
    padding: Union[int, tuple, str] = 0
    dilation: Union[int, tuple] = 1
    groups: int = 1
    bias: bool = True

    def __str__(self):
        return self.name

    def tensors(self, dtype=torch.float64, device="cpu", requires_grad=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.batch, self.in_channels, *self.size, generator=g, dtype=dtype)
        w = torch.randn(self.out_channels, self.in_channels // self.groups, *self.kernel, generator=g, dtype=dtype)
        b = torch.randn(self.out_channels, generator=g, dtype=dtype) if self.bias else None
        out = [t if t is None else t.to(device).requires_grad_(requires_grad) for t in (x, w, b)]
        return out

    def args(self):
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    def explicit(self):
        """(stride pair, (top, bottom, left, right) padding, dilation pair, groups) for the references."""
        pair = lambda v: (v, v) if isinstance(v, int) else (v[0], v[-1])
        stride, dilation = pair(self.stride), pair(self.dilation)
        if self.padding == "valid":
            pads = (0, 0, 0, 0)
        elif self.padding == "same":
            total = [d * (k - 1) for d, k in zip(dilation, self.kernel)]
            pads = (total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2)
        else:
            ph, pw = pair(self.padding)
            pads = (ph, ph, pw, pw)
        return stride, pads, dilation, self.groups


CASES = [
    Case("basic", 2, 3, (7, 6), 4, (3, 3)),
    Case("stride2_pad1", 2, 3, (8, 7), 4, (3, 3), stride=2, padding=1),
    Case("asymmetric_everything", 2, 4, (9, 7), 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
    Case("stride_pairs_as_lists", 1, 2, (6, 8), 3, (2, 3), stride=[1, 2], padding=[2, 1], dilation=[2, 1], bias=False),
    Case("same_odd_kernel", 2, 3, (6, 5), 4, (3, 3), padding="same"),
    Case("same_even_kernel_dilated", 2, 3, (7, 6), 4, (4, 2), padding="same", dilation=(2, 3)),
    Case("valid", 2, 3, (6, 6), 2, (3, 3), padding="valid"),
    Case("depthwise", 2, 4, (6, 6), 4, (3, 3), padding=1, groups=4),
    Case("channel_multiplier", 2, 3, (6, 5), 6, (3, 3), padding=1, groups=3),
    Case("depthwise_asymmetric", 2, 3, (9, 8), 6, (3, 2), stride=(2, 1), padding=(0, 2), dilation=(2, 1), groups=3),
    Case("depthwise_strided_wide", 1, 2, (5, 11), 2, (2, 3), stride=(1, 3), padding=(1, 1), groups=2),
    Case("pointwise", 3, 4, (5, 6), 6, (1, 1)),
    Case("pointwise_grouped", 3, 4, (5, 6), 6, (1, 1), groups=2),
    Case("pointwise_strided", 2, 4, (7, 6), 3, (1, 1), stride=2),
    Case("dilated", 2, 3, (9, 9), 4, (3, 3), padding=2, dilation=2),
    Case("kernel_as_large_as_input", 2, 2, (4, 3), 3, (4, 3)),
    Case("stride_larger_than_kernel", 2, 2, (9, 9), 3, (2, 2), stride=3),
    Case("padding_larger_than_kernel", 1, 2, (3, 4), 2, (2, 2), padding=3, bias=False),
    Case("batch_one", 1, 3, (5, 5), 4, (3, 3), padding=1),
    Case("batch_zero", 0, 3, (5, 5), 4, (3, 3), padding=1),
    Case("many_images", 9, 2, (4, 4), 3, (3, 3), padding=1),
]


def shift_and_add_conv2d(x, w, b, stride, padding, dilation, groups):
    """A reference with no im2col and no F.conv2d: for every kernel tap (ki, kj), the strided
    slice of the padded input that the tap sees, times that tap's weights, summed. Takes the
    arguments of Case.explicit() and differentiates through autograd."""
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    n, c, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    xp = torch.nn.functional.pad(x, (pl, pr, pt, pb))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xg = xp.view(n, groups, cg, *xp.shape[2:])
    wg = w.view(groups, cout // groups, cg, kh, kw)
    out = x.new_zeros(n, groups, cout // groups, oh, ow)
    for ki in range(kh):
        for kj in range(kw):
            tap = xg[..., ki * dh : ki * dh + sh * (oh - 1) + 1 : sh, kj * dw : kj * dw + sw * (ow - 1) + 1 : sw]
            out = out + torch.einsum("ngchw,goc->ngohw", tap, wg[..., ki, kj])
    out = out.reshape(n, cout, oh, ow)
    return out if b is None else out + b.view(1, -1, 1, 1)


def loop_conv2d(x, w, b, stride, padding, dilation, groups):
    """The definition, one multiply-add at a time (forward only; tiny shapes)."""
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    n, c, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = torch.zeros(n, cout, oh, ow, dtype=torch.float64)
    xl, wl = x.double().tolist(), w.double().tolist()
    for i in range(n):
        for o in range(cout):
            g = o // (cout // groups)
            for y in range(oh):
                for z in range(ow):
                    acc = 0.0 if b is None else float(b[o])
                    for ci in range(cg):
                        for ki in range(kh):
                            for kj in range(kw):
                                r, s = y * sh - pt + ki * dh, z * sw - pl + kj * dw
                                if 0 <= r < h and 0 <= s < wd:
                                    acc += xl[i][g * cg + ci][r][s] * wl[o][ci][ki][kj]
                    out[i, o, y, z] = acc
    return out
