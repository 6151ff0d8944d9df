"""The package refuses a build made for another torch, instead of crashing in the first call."""
import re
import sys

import pytest
import torch

import torch_convbp


def test_the_build_records_the_torch_it_was_compiled_against():
    release = re.match(r"\d+\.\d+\.\d+", torch.__version__).group(0)
    assert torch_convbp._C.built_with_torch == release


@pytest.mark.parametrize("running", ["2.13.0", "2.13.0+cpu", "2.13.0+cu130"])
def test_the_same_release_is_accepted(running):
    torch_convbp._check_built_with("2.13.0", running)


@pytest.mark.parametrize("running", ["2.14.1+cu130", "2.13.1", "3.13.0"])
def test_another_release_is_refused_with_how_to_rebuild(running):
    with pytest.raises(ImportError, match=r"compiled against torch 2\.13\.0, but this is torch .*rebuild"):
        torch_convbp._check_built_with("2.13.0", running)


def needed_libraries(path):
    """The DT_NEEDED entries of a shared library, read by readelf (binutils, beside every gcc)."""
    import shutil
    import subprocess

    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared libraries")
def test_the_extension_uses_the_shared_cxx_runtime_that_torch_uses():
    """A toolchain that linked libstdc++ statically gave the extension its own C++ runtime, and
    every error it raised crashed Python (SIGSEGV) instead of raising (H100 image, 2026-11-22)."""
    assert "libstdc++.so.6" in needed_libraries(torch_convbp._C.__file__)


def test_an_error_from_cpp_that_formats_numbers_raises():
    """The call that crashed there: a C++ check whose message prints sizes (std::ostream << long)."""
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 2, 3, 3)
    with pytest.raises(RuntimeError, match=r"weight of size \[4, 2, 3, 3\].*input of size \[1, 3, 8, 8\]"):
        torch.ops.torch_convbp.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1)


@pytest.mark.parametrize("cpuinfo, has", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n", True),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512_vnni_but_not_f\n", False),
    ("processor\t: 0\nFeatures\t: fp asimd\n", True),  # no x86 flags line: nothing is left out
    (None, True),  # unreadable: nothing is left out
])
def test_the_sanitizers_build_leaves_out_avx512_kernels_only_where_the_cpu_has_no_avx512(tmp_path, cpuinfo, has):
    """setup.py's sanitized build compiles the AVX-512 kernels only where avx512f is among the
    CPU's flags: where it is not, they could never run under the sanitizers."""
    from torch_convbp._build_flags import cpu_has_avx512

    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    assert cpu_has_avx512(str(path)) is has


@pytest.mark.parametrize("cpuinfo, has", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n", True),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2\n", False),  # AVX2 without FMA
    ("processor\t: 0\nflags\t\t: fpu sse2 avx fma\n", False),
    ("processor\t: 0\nFeatures\t: fp asimd\n", False),  # no x86 flags line: nothing is left out
    (None, False),  # unreadable: nothing is left out
])
def test_ci_builds_leave_out_the_baseline_loop_nests_only_where_the_cpu_has_avx2_and_fma(tmp_path, cpuinfo, has):
    """setup.py's sanitized and quick builds (CI's side stages) leave out the loop nests for CPUs
    without AVX2 and FMA only where the CPU's flags name both: elsewhere those are the ones that
    run."""
    from torch_convbp._build_flags import cpu_has_avx2_fma

    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    assert cpu_has_avx2_fma(str(path)) is has
