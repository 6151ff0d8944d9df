"""The registrations, as the dispatcher has them. tools/check_cuda_build.sh builds the extension
with its CUDA kernels (the real build, with torch's own nvcc flags, on machines without a GPU too)
and runs the suite under it with TORCH_CONVBP_EXPECT_CUDA_KERNELS=1; there a build that lacks a
CUDA kernel fails here instead of skipping."""
import os

import pytest
import torch

import torch_convbp

EXPECT_CUDA = os.environ.get("TORCH_CONVBP_EXPECT_CUDA_KERNELS") == "1"
OPERATORS = ("conv2d", "conv2d_input_grad", "conv2d_weight_grad", "conv3d", "conv3d_input_grad", "conv3d_weight_grad")
DEVICE_KERNELS = ("im2col", "col2im", "im2col_nhwc", "col2im_nhwc", "depthwise_conv2d", "depthwise_input_grad",
                  "depthwise_weight_grad", "grouped_conv2d", "grouped_weight_grad")
# the CPU's GEMM micro-kernel: route implicit_nhwc; the CPU's depthwise kernels of volumes
CPU_ONLY_KERNELS = ("implicit_conv2d", "implicit_conv2d_input_grad", "implicit_conv2d_weight_grad", "implicit_conv3d",
                    "implicit_conv3d_input_grad", "implicit_conv3d_weight_grad", "depthwise_conv3d", "depthwise_conv3d_input_grad",
                    "depthwise_conv3d_weight_grad")
# A CPU kernel, and ATen's copy for every other device.
CPU_KERNEL_ELSE_ATEN = ("transpose_copy", "transpose_taps")


def registered(name, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"torch_convbp::{name}", key)


def test_the_library_has_the_operators_and_device_kernels_and_nothing_else():
    names = {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("torch_convbp::")}
    assert names == set(OPERATORS) | set(DEVICE_KERNELS) | set(CPU_ONLY_KERNELS) | set(CPU_KERNEL_ELSE_ATEN)


@pytest.mark.parametrize("name", CPU_KERNEL_ELSE_ATEN)
def test_a_cpu_kernel_and_atens_copy_for_the_other_devices(name):
    assert registered(name, "CPU") and registered(name, "CompositeExplicitAutograd")
    assert not registered(name, "CUDA")  # CUDA takes the composite one


@pytest.mark.parametrize("name", DEVICE_KERNELS + CPU_ONLY_KERNELS)
def test_every_device_kernel_has_a_cpu_kernel(name):
    assert registered(name, "CPU")
    assert not registered(name, "CompositeExplicitAutograd")


@pytest.mark.skipif(not (torch_convbp.CUDA_KERNELS or EXPECT_CUDA),
                    reason="a CPU-only build; tools/check_cuda_build.sh checks the CUDA build")
@pytest.mark.parametrize("name", DEVICE_KERNELS)
def test_the_cuda_build_registers_every_device_kernel_for_cuda(name):
    assert torch_convbp.CUDA_KERNELS, "TORCH_CONVBP_EXPECT_CUDA_KERNELS=1, but the extension was built without CUDA kernels"
    assert registered(name, "CUDA")


@pytest.mark.parametrize("name", CPU_ONLY_KERNELS)
def test_the_cpu_only_kernels_have_no_cuda_kernel(name):
    assert not registered(name, "CUDA")


@pytest.mark.parametrize("name", OPERATORS)
def test_the_orchestration_is_one_kernel_for_every_device(name):
    assert registered(name, "CompositeExplicitAutograd") and registered(name, "Autograd")
    assert not registered(name, "CPU") and not registered(name, "CUDA")
