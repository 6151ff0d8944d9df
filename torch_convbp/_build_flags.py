"""What the C++ builds of this project ask of the machine: link flags for every one (the extension,
setup.py, and the test harness built at test time, tests/test_cuda_threads.py), and whether the
CPU has AVX-512 (the sanitizers' build). Plain Python, importable before the extension is built
(setup.py loads this file by its path)."""
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


def cpu_has_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU this runs on has AVX-512 (avx512f among /proc/cpuinfo's flags). True where
    that cannot be read: a build leaves out only kernels its CPU cannot run (setup.py, the
    sanitizers' build)."""
    try:
        with open(cpuinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return True
    flags = [line.split(":", 1)[1].split() for line in lines if line.startswith("flags") and ":" in line]
    return not flags or "avx512f" in flags[0]
