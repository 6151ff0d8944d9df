"""The CUTLASS implicit-GEMM prototype (TORCH_CONVBP_CUTLASS=1 builds it; benchmarks/NOTES.md,
section 33): the forward of a bfloat16 channels_last convolution, against F.conv2d and a float64
reference, repeatable to the bit, and its refusals. Needs a GPU and a build with the prototype."""
import pytest
import torch
import torch.nn.functional as F

import torch_convbp

BUILT = hasattr(torch.ops.torch_convbp, "cutlass_fprop_bf16")
pytestmark = pytest.mark.skipif(
    not (BUILT and torch.cuda.is_available() and torch_convbp.CUDA_KERNELS),
    reason="needs a GPU and a build with TORCH_CONVBP_CUTLASS=1",
)

# (input [N, C, H, W], weight [Cout, C, kh, kw], stride, padding, dilation)
LAYERS = {
    "3x3 64@56": ((8, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1)),
    "3x3/2 64>128@56": ((8, 64, 56, 56), (128, 64, 3, 3), (2, 2), (1, 1), (1, 1)),
    "1x1 256>64@56": ((4, 256, 56, 56), (64, 256, 1, 1), (1, 1), (0, 0), (1, 1)),
    "asymmetric, dilated": ((3, 16, 17, 23), (24, 16, 3, 5), (2, 1), (2, 0), (2, 3)),
    "batch 1, 7x7": ((1, 32, 7, 7), (8, 32, 3, 3), (1, 1), (1, 1), (1, 1)),
}


def operands(layer, seed=0):
    x_size, w_size, *args = LAYERS[layer]
    torch.manual_seed(seed)
    cl = dict(memory_format=torch.channels_last)
    x = torch.randn(x_size, device="cuda").to(torch.bfloat16).contiguous(**cl)
    w = (torch.randn(w_size, device="cuda") / (w_size[1] * w_size[2] * w_size[3]) ** 0.5).to(torch.bfloat16).contiguous(**cl)
    return x, w, args


@pytest.mark.parametrize("layer", list(LAYERS))
def test_matches_a_float64_reference_as_closely_as_cudnn(layer):
    x, w, (stride, padding, dilation) = operands(layer)
    y = torch.ops.torch_convbp.cutlass_fprop_bf16(x, w, stride, padding, dilation)
    reference = F.conv2d(x.double(), w.double(), None, stride, padding, dilation)
    cudnn = F.conv2d(x, w, None, stride, padding, dilation)
    assert y.shape == reference.shape and y.dtype == torch.bfloat16
    assert y.is_contiguous(memory_format=torch.channels_last)
    ours_error = (y.double() - reference).abs().max().item()
    cudnn_error = (cudnn.double() - reference).abs().max().item()
    # float32 accumulation, one bfloat16 rounding of the result: within two of cuDNN's error
    assert ours_error <= 2 * cudnn_error + 1e-3, (ours_error, cudnn_error)


def test_repeated_calls_give_the_same_bits():
    x, w, args = operands("3x3 64@56")
    first = torch.ops.torch_convbp.cutlass_fprop_bf16(x, w, *args)
    for _ in range(3):
        assert torch.equal(torch.ops.torch_convbp.cutlass_fprop_bf16(x, w, *args), first)


@pytest.mark.parametrize("change, message", [
    (lambda x, w: (x.float(), w.float()), "computes in bfloat16"),
    (lambda x, w: (x.contiguous(), w), "input must be dense channels_last"),
    (lambda x, w: (x[:, :12].contiguous(memory_format=torch.channels_last), w[:, :12].contiguous(memory_format=torch.channels_last)),
     "multiples of 8"),
    (lambda x, w: (x, w[:, :16].contiguous(memory_format=torch.channels_last)), "channels"),
])
def test_refuses_what_it_cannot_compute_by_name(change, message):
    x, w, args = operands("batch 1, 7x7")
    x, w = change(x, w)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.torch_convbp.cutlass_fprop_bf16(x, w, *args)
