"""Builds torch_convbp._C against the torch that is already installed.

Install with `pip install --no-build-isolation -e .` so that pip does not fetch another torch.
The CUDA kernels (csrc/cuda/*.cu) are built when torch is a CUDA build and a CUDA toolkit is
found; TORCH_CONVBP_CUDA=1 forces them, TORCH_CONVBP_CUDA=0 leaves them out.
"""
import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension


def build_cuda() -> bool:
    forced = os.environ.get("TORCH_CONVBP_CUDA")
    if forced is not None:
        return forced == "1"
    return torch.version.cuda is not None and CUDA_HOME is not None


def extension():
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    cxx_flags = ["-O3", "-fopenmp"]  # -fopenmp: at::parallel_for is OpenMP in the headers
    if build_cuda():
        return CUDAExtension(
            "torch_convbp._C",
            sources + sorted(glob.glob("csrc/cuda/*.cu")),
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--use_fast_math"]},
            extra_link_args=["-fopenmp"],
        )
    return CppExtension(
        "torch_convbp._C",
        sources,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=["-fopenmp"],
    )


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
