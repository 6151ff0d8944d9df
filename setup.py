"""Builds torch_convbp._C against the torch that is already installed.

Install with `pip install --no-build-isolation -e .` so that pip does not fetch another torch.
The CUDA kernels (csrc/cuda/*.cu) are built when torch is a CUDA build and a CUDA toolkit is
found; TORCH_CONVBP_CUDA=1 forces them, TORCH_CONVBP_CUDA=0 leaves them out. TORCH_CONVBP_CUTLASS=1
adds the CUTLASS implicit-GEMM prototype (csrc/cuda/cutlass/, needs the nvidia-cutlass wheel's
headers or CUTLASS_INCLUDE_DIR; benchmarks/NOTES.md, section 33).

For a CUDA build no variable is needed, on machines without a GPU too:
- the toolkit is the one whose nvcc is on PATH (asked of nvcc itself, since the nvcc on PATH may
  be a wrapper script elsewhere); CUDA_HOME or CUDA_PATH, if set, win;
- with no GPU to read an architecture from, the kernels are built for DEFAULT_CUDA_ARCHS;
  TORCH_CUDA_ARCH_LIST, if set, wins (on a GPU machine torch builds for the GPUs it sees).

TORCH_CONVBP_SANITIZE=1 builds the C++ code with AddressSanitizer and UndefinedBehaviorSanitizer
(tools/check_sanitizers.sh runs the tests under them). TORCH_CONVBP_PCH=0 builds without the
precompiled header of torch's headers (csrc/torch_headers.h). TORCH_CONVBP_QUICK_BUILD=1 compiles
the C++ code at -O1, in about half the time, and on a CPU with AVX2 and FMA without the kernels
for CPUs lacking them: a build for checking that the code compiles, links and gives the right
values on this CPU (CI's CUDA stage), never for timing or for another machine.
"""
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import torch
from setuptools import setup

# Ampere and Ada (A100, A10/RTX 30, L4/L40/RTX 40: sm_80 code runs on 8.x GPUs of a later minor
# version), Hopper (H100/H200), and PTX for later GPUs. The kernels use nothing of 8.6 or 8.9, and
# each architecture compiled costs a minute of nvcc per .cu file on 2 cores.
DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def find_cuda_toolkit():
    """The CUDA toolkit's directory: CUDA_HOME or CUDA_PATH, else where the nvcc on PATH really
    lives (a -dryrun compile prints it as _HERE_=<toolkit>/bin), else None."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            return os.environ[variable]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "/usr/local/cuda" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    try:
        command = [nvcc, "-dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull]
        dryrun = subprocess.run(command, capture_output=True, text=True, timeout=60)
        here = re.search(r"^#\$ _HERE_=(.+)$", dryrun.stdout + dryrun.stderr, re.MULTILINE)
    except (OSError, subprocess.SubprocessError):
        here = None
    bin_dir = here.group(1).strip() if here else os.path.dirname(os.path.realpath(nvcc))
    return os.path.dirname(bin_dir)


def cuda_wanted() -> bool:
    """TORCH_CONVBP_CUDA=1 or =0 if set, else whether torch is a CUDA build."""
    forced = os.environ.get("TORCH_CONVBP_CUDA")
    return forced == "1" if forced is not None else torch.version.cuda is not None


def build_flags():
    """torch_convbp/_build_flags.py, loaded by its path: the package cannot be imported before
    its extension is built."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_convbp", "_build_flags.py")
    spec = importlib.util.spec_from_file_location("_build_flags", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extension():
    toolkit = find_cuda_toolkit() if cuda_wanted() else None
    if cuda_wanted() and toolkit is None:
        if os.environ.get("TORCH_CONVBP_CUDA") == "1":
            raise RuntimeError("TORCH_CONVBP_CUDA=1, but no CUDA toolkit was found: put its nvcc on PATH or set CUDA_HOME")
        print("torch_convbp: torch is a CUDA build, but no CUDA toolkit (nvcc) was found: building without CUDA kernels")
    if toolkit:
        os.environ["CUDA_HOME"] = toolkit  # read by torch.utils.cpp_extension when it is imported
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    # -fopenmp: at::parallel_for is OpenMP in the headers. -g0 undoes the -g of Python's own CFLAGS:
    # debug information for torch's templates took a third of each file's compile time. Loops
    # start on 32-byte boundaries: the small scalar loops of the kernels ran up to 12% apart with
    # where they happened to fall (benchmarks/NOTES.md, section 25).
    cxx_flags = ["-O3", "-g0", "-fopenmp", "-falign-loops=32"]
    link_flags = ["-fopenmp", *build_flags().shared_libstdcxx()]
    # The build of CI's side stages, which check the code their own CPU runs: without the loop
    # nests for CPUs lacking AVX2 and FMA (LaneOps, vector_ops.h) where this CPU has them; no test
    # those stages run asks for them. Half of the grouped and depthwise kernels' instantiations,
    # and of their compile time (benchmarks/NOTES.md, section 134).
    no_lane_kernels = ["-DTORCH_CONVBP_NO_LANE_KERNELS"] if build_flags().cpu_has_avx2_fma() else []
    if os.environ.get("TORCH_CONVBP_QUICK_BUILD") == "1":
        # The grouped and depthwise kernels' loop nests are most of -O3's compile time
        # (benchmarks/NOTES.md, section 107).
        cxx_flags = ["-O1", "-g0", "-fopenmp", *no_lane_kernels]
    if os.environ.get("TORCH_CONVBP_SANITIZE") == "1":
        # Every error is fatal (no recovery), with stack traces; vptr checks are left out, as the
        # classes of torch's uninstrumented libraries would give false reports. -fno-wrapv undoes
        # Python's -fwrapv, under which signed overflow is defined and so never reported.
        sanitize = ["-fsanitize=address,undefined", "-fno-sanitize=vptr", "-fno-sanitize-recover=all"]
        # -g1 (line tables) gives the reports their files and lines, at two thirds of -g's build time.
        # -fira-region=one: one register-allocation region a function, not one a loop. The grouped
        # kernels' always-inlined loop nests, instrumented, spent 42% of their compile in the
        # regional allocator; this took their two files from 110-127 s to 69-74 s each, and the
        # code's speed does not matter here (benchmarks/NOTES.md, section 107).
        cxx_flags = ["-O1", "-g1", "-fira-region=one", "-fno-omit-frame-pointer", "-fno-wrapv", "-fopenmp",
                     *sanitize]
        # It checks the code this CPU runs: without AVX-512 here, the AVX-512 kernels could never
        # run under it; they were a quarter of its grouped kernels' compile time (benchmarks/NOTES.md,
        # section 79).
        if not build_flags().cpu_has_avx512():
            cxx_flags.append("-DTORCH_CONVBP_NO_AVX512_KERNELS")
        cxx_flags += no_lane_kernels
        link_flags += sanitize
    if toolkit is None:
        extension = CppExtension(
            "torch_convbp._C", sources, extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags
        )
        return extension, with_kept_objects(BuildExtension, build_variant(cuda=False))
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCHS
        print(f"torch_convbp: no GPU visible, building the CUDA kernels for {DEFAULT_CUDA_ARCHS}")
    # The architectures, as the module reports them (torch_convbp._C.built_for_cuda_archs): tokens
    # joined by "+", stringified in module.cpp (a quoted define would not survive ninja's shell).
    archs = f"-DTORCH_CONVBP_CUDA_ARCHS={cuda_architectures()}"
    cuda_sources, include_dirs = sorted(glob.glob("csrc/cuda/*.cu")), []
    if os.environ.get("TORCH_CONVBP_CUTLASS") == "1":  # the implicit-GEMM prototype (off by default)
        cuda_sources += sorted(glob.glob("csrc/cuda/cutlass/*.cu"))
        include_dirs.append(cutlass_include_dir())
    extension = CUDAExtension(
        "torch_convbp._C",
        sources + cuda_sources,
        include_dirs=include_dirs,
        # No --use_fast_math: it flushes float32 denormals to zero, and the kernels must give the
        # CPU kernels' bits (they are memory-bound; fast math would buy nothing).
        extra_compile_args={"cxx": [*cxx_flags, archs], "nvcc": ["-O3"]},
        extra_link_args=link_flags,
    )
    return extension, with_kept_objects(BuildExtension, build_variant(cuda=True))


def with_precompiled_torch_headers(build_ext_class):
    """build_ext_class, compiling csrc/torch_headers.h once per build with the flags ninja gives
    every C++ file, into the build's objects directory, and having each file read it first
    (-include): parsing torch's headers took 6 to 10 s of each file's compile
    (benchmarks/NOTES.md, section 79). During its build it wraps torch's function that writes the
    ninja file, whose arguments hold those flags. GCC uses the precompiled header only where the
    flags match, and says so otherwise (-Winvalid-pch); with another compiler (clang refuses a
    mismatched one), where torch's function takes other arguments, or where the header does not
    compile, the build goes on without it, as before. TORCH_CONVBP_PCH=0 turns it off."""

    class BuildExtensionWithPrecompiledHeader(build_ext_class):
        def build_extensions(self):
            import torch.utils.cpp_extension as cpp_extension

            write_and_compile = cpp_extension._write_ninja_file_and_compile_objects

            def with_header(*args, **kwargs):
                if not args and {"cflags", "post_cflags", "build_directory"} <= kwargs.keys() and compiler_is_gcc():
                    header = precompile_torch_headers(kwargs["cflags"], kwargs["post_cflags"], kwargs["build_directory"])
                    if header is not None:
                        kwargs["post_cflags"] = kwargs["post_cflags"] + precompiled_header_flags(header)
                return write_and_compile(*args, **kwargs)

            if os.environ.get("TORCH_CONVBP_PCH", "1") != "0":
                cpp_extension._write_ninja_file_and_compile_objects = with_header
            try:
                super().build_extensions()
            finally:
                cpp_extension._write_ninja_file_and_compile_objects = write_and_compile

    return BuildExtensionWithPrecompiledHeader


def compiler_is_gcc():
    """Whether the C++ compiler torch's build uses is GCC (it defines __GNUC__, and not __clang__)."""
    from torch.utils.cpp_extension import get_cxx_compiler

    try:
        macros = subprocess.run([get_cxx_compiler(), "-dM", "-E", "-x", "c++", os.devnull],
                                capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "__GNUC__" in macros and "__clang__" not in macros


def precompiled_header_flags(header=None):
    """Torch's headers as system headers (GCC applies their diagnostic pragmas to templates
    instantiated from a precompiled header as to system headers only), no note on GCC 4.6's
    vector ABI (vector_ops.h's pragma for it is likewise lost), and the header read first."""
    from torch.utils.cpp_extension import include_paths

    flags = [f"-isystem{path}" for path in include_paths()] + ["-Wno-psabi", "-Winvalid-pch"]
    return flags + (["-include", header] if header else [])


def precompile_torch_headers(cflags, post_cflags, build_directory):
    """The path of build_directory/pch/torch_headers.h, with its .gch beside it, compiled again
    when the header or the flags change; None where it does not compile (the build goes on)."""
    import json
    import shlex

    from torch.utils.cpp_extension import get_cxx_compiler

    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "torch_headers.h")
    header = os.path.join(build_directory, "pch", "torch_headers.h")
    flags = shlex.split(" ".join([*cflags, *post_cflags])) + precompiled_header_flags()
    command = [get_cxx_compiler(), *flags, "-x", "c++-header", header, "-o", header + ".gch"]
    with open(source) as f:
        stamp = json.dumps([command, f.read()])
    stamp_path = header + ".stamp"
    if os.path.exists(header + ".gch") and os.path.exists(stamp_path):
        with open(stamp_path) as f:
            if f.read() == stamp:
                return header
    os.makedirs(os.path.dirname(header), exist_ok=True)
    shutil.copyfile(source, header)
    if subprocess.run(command).returncode != 0:
        print("torch_convbp: the precompiled header did not compile; building without it")
        return None
    with open(stamp_path, "w") as f:
        f.write(stamp)
    return header


def with_kept_objects(build_ext_class, variant):
    """build_ext_class, compiling into build/objects-<variant> (the Python, the torch release and
    the kind of build) instead of the directory setuptools gives it. An editable install
    (pip install -e .) is given a new temporary one each time, so every install compiled every
    file again, and a wheel built after it too; kept here, ninja compiles again only what changed
    (it compares each object's command line and the headers it read)."""

    class BuildExtensionKeepingObjects(build_ext_class):
        def finalize_options(self):
            super().finalize_options()
            self.build_temp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build", f"objects-{variant}")

    return BuildExtensionKeepingObjects


def build_variant(cuda: bool) -> str:
    """What the objects of a build depend on beyond its sources: cpython-311-torch2.13.0-cpu, say."""
    sanitized = "-sanitize" if os.environ.get("TORCH_CONVBP_SANITIZE") == "1" else ""
    quick = "-quick" if os.environ.get("TORCH_CONVBP_QUICK_BUILD") == "1" else ""
    return f"{sys.implementation.cache_tag}-torch{torch_release()}-{'cuda' if cuda else 'cpu'}{sanitized}{quick}"


def cutlass_include_dir():
    """CUTLASS's C++ headers, for TORCH_CONVBP_CUTLASS=1: CUTLASS_INCLUDE_DIR, else those of the
    nvidia-cutlass wheel (pip install nvidia-cutlass; headers only, nothing is linked)."""
    directory = os.environ.get("CUTLASS_INCLUDE_DIR")
    if not directory:
        try:
            import cutlass_library
        except ImportError:
            raise RuntimeError("TORCH_CONVBP_CUTLASS=1 needs CUTLASS's headers: pip install nvidia-cutlass, "
                               "or set CUTLASS_INCLUDE_DIR") from None
        directory = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    if not os.path.isfile(os.path.join(directory, "cutlass", "conv", "device", "implicit_gemm_convolution.h")):
        raise RuntimeError(f"TORCH_CONVBP_CUTLASS=1: no CUTLASS conv headers under {directory}")
    return directory


def cuda_architectures():
    """The architectures the CUDA kernels are built for, as torch's nvcc flags name them: sm_80 for
    machine code, compute_90 for PTX (the GPUs a build machine has, or TORCH_CUDA_ARCH_LIST)."""
    from torch.utils.cpp_extension import _get_cuda_arch_flags

    codes = re.findall(r",code=\[?([\w,]+)", " ".join(_get_cuda_arch_flags()))
    return "+".join(dict.fromkeys(c for group in codes for c in group.split(",")))


def torch_requirement():
    """The torch this build runs with: the release it was compiled against (torch has no stable C++
    ABI, so the wheel pins it, and pip refuses a mismatched torch at install time)."""
    return f"torch=={torch_release()}"


def torch_release():
    """The installed torch's release: 2.13.0 of 2.13.0+cpu."""
    return re.match(r"\d+\.\d+\.\d+", torch.__version__).group(0)


ext, build_ext = extension()
setup(ext_modules=[ext], cmdclass={"build_ext": with_precompiled_torch_headers(build_ext)},
      install_requires=[torch_requirement()])
