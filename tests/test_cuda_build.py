"""The CUDA build's registrations. tools/check_cuda_build.sh builds the extension with its CUDA
kernels (the real build, with torch's own nvcc flags, on machines without a GPU too) and runs the
whole suite under it with TORCH_CONVBP_EXPECT_CUDA_KERNELS=1; there a build that lacks a CUDA
kernel fails here instead of skipping."""
import glob
import os
import re

import pytest
import torch

import torch_convbp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECT_CUDA = os.environ.get("TORCH_CONVBP_EXPECT_CUDA_KERNELS") == "1"


def registered_kernels(pattern, key):
    """The operators that the sources register for a dispatch key, from their
    TORCH_LIBRARY_IMPL(torch_convbp, key, m) blocks."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", pattern)):
        text = open(path).read()
        for block in re.findall(rf"TORCH_LIBRARY_IMPL\(torch_convbp, {key}, m\) \{{(.*?)\n\}}", text, re.DOTALL):
            names.update(re.findall(r'm\.impl\("(\w+)"', block))
    return names


CPU_KERNELS = registered_kernels("cpu/*.cpp", "CPU")
CUDA_KERNELS = registered_kernels("cuda/*.cu", "CUDA")


def test_every_cpu_kernel_has_a_cuda_twin():
    assert CPU_KERNELS >= {"im2col", "col2im", "depthwise_conv2d"}
    assert CUDA_KERNELS == CPU_KERNELS


@pytest.mark.skipif(not (torch_convbp.CUDA_KERNELS or EXPECT_CUDA),
                    reason="a CPU-only build; tools/check_cuda_build.sh checks the CUDA build")
@pytest.mark.parametrize("name", sorted(CUDA_KERNELS))
def test_the_cuda_build_registers_every_cuda_kernel(name):
    assert torch_convbp.CUDA_KERNELS, "TORCH_CONVBP_EXPECT_CUDA_KERNELS=1, but the extension was built without CUDA kernels"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torch_convbp::{name}", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torch_convbp::{name}", "CPU")


def test_the_orchestration_is_one_kernel_for_every_device():
    for name in ("conv2d", "conv2d_input_grad", "conv2d_weight_grad"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torch_convbp::{name}", "CompositeExplicitAutograd")
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"torch_convbp::{name}", "CUDA")
