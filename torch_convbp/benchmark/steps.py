"""What is timed: one call of a candidate's pass(es), for each candidate of a layer."""
import contextlib

import math

import torch

import torch_convbp

from .layers import as_convolution, channels_last, conv_args, functions, make_operands, spatial

CANDIDATES = ("torch_convbp", "builtin", "aten_im2col", "gemm")  # timed on every device


def builtin_without_vendor_library(device):
    """The built-in convolution with oneDNN (CPU) or cuDNN (GPU) off: ATen's im2col path."""
    if device == "cuda":
        return torch.backends.cudnn.flags(enabled=False)
    return torch.backends.mkldnn.flags(enabled=False)


def conv_step(conv, x, w, layer, passes, context=contextlib.nullcontext):
    """One call of the pass(es): forward, backward (from a saved forward) or both."""
    args = conv_args(layer)
    if passes == "forward":
        def step():
            with torch.no_grad(), context():
                conv(x, w, None, *args)
        return step
    if passes == "both":
        def step():
            with context():
                y = conv(x, w, None, *args)
                torch.autograd.grad(y, (x, w), torch.ones_like(y))
        return step
    with context():
        y = conv(x, w, None, *args)
    grad_y = torch.ones_like(y)

    def step():
        with context():
            torch.autograd.grad(y, (x, w), grad_y, retain_graph=True)
    return step


def gemm_step(layer, batch, passes, device, dtype, size=None):
    """The GEMMs an im2col design must run, on ready operands, each one call over the whole batch
    ([G, M, K] @ [G, K, N] as one bmm, or one mm for a single group):
      forward      Y  [G, Cout/G, NP] = W    [G, Cout/G, K] @ col [G, K, NP]
      grad-input   dC [G, K, NP]      = W^T  [G, K, Cout/G] @ dY  [G, Cout/G, NP]
      grad-weight  dW [G, Cout/G, K]  = dY   [G, Cout/G, NP] @ col^T [G, NP, K]
    with K = Cin/G*taps and NP the output pixels of the batch, in the dtype torch_convbp's GEMMs
    run in (float32 for half-precision operands on a CPU without instructions for them). For a
    transposed layer, the GEMMs of the convolution it is the input gradient of (the same three,
    in other roles)."""
    dtype = torch_convbp.gemm_dtype(dtype, device)
    groups = layer["groups"]
    c_in, c_out, pixels = as_convolution(layer, size)
    k = c_in // groups * math.prod(spatial(layer, "kernel"))
    m, n = c_out // groups, batch * pixels
    new = lambda *shape: torch.randn(groups, *shape, device=device, dtype=dtype)
    weight, col, grad_y = new(m, k), new(k, n), new(m, n)
    y, grad_col, grad_w = new(m, n), new(k, n), new(m, k)
    mm = torch.mm if groups == 1 else torch.bmm
    squeeze = (lambda t: t[0]) if groups == 1 else (lambda t: t)
    forward = [(squeeze(weight), squeeze(col), squeeze(y))]
    backward = [(squeeze(weight.transpose(1, 2)), squeeze(grad_y), squeeze(grad_col)),
                (squeeze(grad_y), squeeze(col.transpose(1, 2)), squeeze(grad_w))]
    products = {"forward": forward, "backward": backward, "both": forward + backward}[passes]

    def step():
        for a, b, out in products:
            mm(a, b, out=out)
    return step


def cudnn_flags(deterministic=False):
    """cuDNN as every GPU row runs it: on, autotuned (cudnn.benchmark), TF32 as --tf32 set it
    (torch.backends.cuda.matmul.allow_tf32 holds that choice), deterministic or not. Through the
    context manager, since torch's own test helpers forbid setting the flags directly."""
    return torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=deterministic,
                                      allow_tf32=torch.backends.cuda.matmul.allow_tf32)


def channels_last_copies(x, w):
    """Leaf copies of the operands in channels_last (channels_last_3d for volumes: the layout cuDNN
    and oneDNN are fastest in)."""
    return tuple(t.detach().to(memory_format=channels_last(t)).requires_grad_(t.requires_grad) for t in (x, w))


def captured(step, warmups=3):
    """The step captured in a CUDA graph, as a step that replays it: the GPU's work with the
    host's taken out. Warmed up first on a side stream, as torch.cuda.graph asks (and so that
    cuDNN has chosen its algorithms before the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def candidate_steps(layer, batch, passes, device, dtype, size=None, variants=True, cuda_graphs=False):
    """The candidates' steps; with variants, also ours and the built-in fed channels_last and (on
    a GPU, where cuDNN's backward is not deterministic by default) the built-in made
    deterministic. With cuda_graphs, each step is captured in a CUDA graph and replayed."""
    x, w = make_operands(layer, batch, device, dtype, size, requires_grad=passes != "forward")
    ours, builtin = functions(layer)
    steps = {
        "torch_convbp": conv_step(ours, x, w, layer, passes),
        "builtin": conv_step(builtin, x, w, layer, passes),
        "aten_im2col": conv_step(builtin, x, w, layer, passes, lambda: builtin_without_vendor_library(device)),
        "gemm": gemm_step(layer, batch, passes, device, dtype, size),
    }
    if variants:
        x_cl, w_cl = channels_last_copies(x, w)
        steps["torch_convbp_channels_last"] = conv_step(ours, x_cl, w_cl, layer, passes)
        steps["builtin_channels_last"] = conv_step(builtin, x_cl, w_cl, layer, passes)
        if device == "cuda":
            steps["builtin_deterministic"] = conv_step(builtin, x, w, layer, passes,
                                                      lambda: cudnn_flags(deterministic=True))
    if cuda_graphs:
        steps = {name: captured(step) for name, step in steps.items()}
    return steps


def peak_memory_mib(step):
    """CUDA memory one call of step takes at its peak, above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20
