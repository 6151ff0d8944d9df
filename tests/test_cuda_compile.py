"""Every CUDA source compiles (nvcc -c), on machines without a GPU too, so CUDA code that does not
compile cannot land. The CPU torch wheel carries the CUDA headers but one generated file,
c10/cuda/impl/cuda_cmake_macros.h, for which a one-line stand-in is made here."""
import glob
import os
import shutil
import subprocess
import sysconfig

import pytest
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
NVCC = shutil.which("nvcc") or next(iter(glob.glob("/usr/local/cuda*/bin/nvcc")), None)

# The flags torch.utils.cpp_extension gives nvcc for an extension (and the header stand-in).
NVCC_FLAGS = [
    "-std=c++17",
    "-O0",
    "-arch=sm_90",
    "--expt-relaxed-constexpr",
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "-DTORCH_EXTENSION_NAME=_C",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-Xcompiler=-fPIC",
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=os.path.basename)
def test_cuda_source_compiles(source, tmp_path):
    stand_in = tmp_path / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
    includes = [str(tmp_path / "include"), *cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    command = [NVCC, "-c", source, "-o", str(tmp_path / "out.o"), *NVCC_FLAGS, *(f"-I{p}" for p in includes)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"


def test_there_are_cuda_sources():
    assert CUDA_SOURCES, "csrc/cuda/*.cu is empty"
