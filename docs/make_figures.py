"""Draws the figures of docs/backprop.md from the real im2col and col2im operators:
    python docs/make_figures.py      (needs matplotlib)"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import torch_convbp  # noqa: E402, F401  (registers the operators)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")
ops = torch.ops.torch_convbp


def im2col_layout():
    """A 2-channel 4x4 image, pixel k holding the value k+1, and its column matrix for a 3x3
    kernel with padding 1: each pixel keeps its colour wherever im2col copies it."""
    c, h, w, k = 2, 4, 4, 3
    x = torch.arange(1, c * h * w + 1, dtype=torch.float64).view(1, c, h, w)
    cols = x.new_empty(c * k * k, h * w)
    ops.im2col(x, (k, k), (1, 1), (1, 1), (1, 1), 0, h, cols)
    cmap = plt.get_cmap("tab20", c * h * w)
    fig, (ax_in, ax_col) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1, 2.6]})
    for ch in range(c):
        for i in range(h):
            for j in range(w):
                v = int(x[0, ch, i, j])
                ax_in.add_patch(plt.Rectangle((j + ch * (w + 1), h - 1 - i), 1, 1, color=cmap(v - 1)))
                ax_in.text(j + ch * (w + 1) + 0.5, h - 0.5 - i, str(v), ha="center", va="center", fontsize=8)
        ax_in.text(ch * (w + 1) + w / 2, h + 0.3, f"channel {ch}", ha="center")
    ax_in.set_xlim(0, 2 * w + 1)
    ax_in.set_ylim(0, h + 0.8)
    ax_in.set_aspect("equal")
    ax_in.axis("off")
    ax_in.set_title("input x: 1 image, 2 channels, 4x4")
    rows, ncols = cols.shape
    for r in range(rows):
        for p in range(ncols):
            v = int(cols[r, p])
            color = cmap(v - 1) if v else (1, 1, 1)
            ax_col.add_patch(plt.Rectangle((p, rows - 1 - r), 1, 1, facecolor=color, edgecolor="0.85", lw=0.4))
            if v:
                ax_col.text(p + 0.5, rows - 0.5 - r, str(v), ha="center", va="center", fontsize=6)
    ax_col.set_xlim(0, ncols)
    ax_col.set_ylim(0, rows)
    ax_col.set_aspect("equal")
    ax_col.set_xticks([p + 0.5 for p in range(ncols)], [f"{p // w},{p % w}" for p in range(ncols)], fontsize=6)
    ax_col.set_yticks([rows - 0.5 - r for r in range(rows)], [f"c{r // 9} ({r % 9 // 3},{r % 3})" for r in range(rows)], fontsize=6)
    ax_col.set_xlabel("column p = output pixel (i, j)")
    ax_col.set_ylabel("row r = (channel, kernel tap)")
    ax_col.set_title("col = im2col(x): [C*kh*kw, OH*OW] = [18, 16]; white = padding (0)")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "im2col_layout.png"), dpi=110)


def col2im_counts():
    """col2im of an all-ones column matrix: how many columns each input pixel was copied into."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, stride in zip(axes, (1, 2)):
        h = w = 8
        x = torch.zeros(1, 1, h, w, dtype=torch.float64)
        oh = (h + 2 - 3) // stride + 1
        ones = torch.ones(9, oh * oh, dtype=torch.float64)
        ops.col2im(ones, (3, 3), (stride, stride), (1, 1), (1, 1), 0, oh, x)
        im = ax.imshow(x[0, 0], cmap="viridis", vmin=0, vmax=9)
        for i in range(h):
            for j in range(w):
                ax.text(j, i, int(x[0, 0, i, j]), ha="center", va="center", color="w", fontsize=8)
        ax.set_title(f"3x3 kernel, padding 1, stride {stride}")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=axes, shrink=0.8, label="copies of the pixel in col")
    fig.suptitle("col2im(ones): how many column entries each input pixel receives")
    fig.savefig(os.path.join(OUT, "col2im_counts.png"), dpi=110)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    im2col_layout()
    col2im_counts()
    print("wrote", OUT)
