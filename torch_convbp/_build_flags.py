"""What the C++ builds of this project ask of the machine: link flags for every one (the extension,
setup.py, and the test harness built at test time, tests/test_cuda_threads.py), and the CPU's
flags (whether the sanitizers' build takes the AVX-512 kernels; the benchmarks record them too).
Plain Python, importable before the extension is built (setup.py loads this file by its path)."""
import sys


def shared_libstdcxx() -> list:
    """Link flags that make a build use the shared C++ runtime, the one torch uses.

    Where a toolchain links libstdc++ statically (seen on an Ubuntu 24.04 GPU image with g++ 13:
    the built library had no libstdc++.so.6 among its needed libraries and carried its own copy
    of parts of the runtime), two copies of the C++ runtime meet in one process and disagree on
    the locale facets: the first error message that formatted a number (std::ostream << long)
    crashed Python with SIGSEGV instead of raising. Naming the shared runtime by its file name
    links it whatever the toolchain's default; elsewhere it is what -lstdc++ finds anyway."""
    return ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []


def cpu_flags(cpuinfo: str = "/proc/cpuinfo"):
    """The flags /proc/cpuinfo gives the CPU (fpu, avx2, avx512f, ...), or None where it cannot be
    read or has no flags line (not Linux on x86)."""
    try:
        with open(cpuinfo) as f:
            return next(line.split(":", 1)[1].split() for line in f if line.startswith("flags") and ":" in line)
    except (OSError, StopIteration):
        return None


def cpu_has_avx2_fma(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU this runs on has AVX2 and FMA. False where that cannot be read: a build
    leaves out the kernels for CPUs without them only where its own CPU surely has them."""
    flags = cpu_flags(cpuinfo)
    return flags is not None and "avx2" in flags and "fma" in flags


def cpu_has_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU this runs on has AVX-512 (avx512f among its flags). True where that cannot
    be read: a build leaves out only kernels its CPU cannot run (setup.py, the sanitizers' build)."""
    flags = cpu_flags(cpuinfo)
    return flags is None or "avx512f" in flags
