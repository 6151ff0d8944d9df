"""Shared fixtures: the devices to test on, and the matrix of convolution cases."""
import pytest
import torch

import torch_convbp

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and torch_convbp.CUDA_KERNELS else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _restore_workspace_limit():
    limit = torch_convbp.get_workspace_limit()
    yield
    torch_convbp.set_workspace_limit(limit)
