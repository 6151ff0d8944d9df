"""What a result depends on besides the code, recorded with every result: the machine, its
instruction sets, the libraries' versions and settings, and the build of torch_convbp."""
import os
import platform
import re
import subprocess

import torch

import torch_convbp
from torch_convbp import _build_flags


def first_processor(cpuinfo="/proc/cpuinfo"):
    """The fields /proc/cpuinfo gives its first processor ("model name", "cpu family", ...), or {}
    where it cannot be read."""
    fields = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip() and fields:
                    break  # the first processor's block ends
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def machine_description(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    model = first_processor().get("model name") or platform.processor() or platform.machine()
    return f"{model}, {torch.get_num_threads()} threads"


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
SETTINGS = ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS",
            "TORCH_CONVBP_GEMM", "TORCH_CONVBP_HALF_GEMM", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def cpu_flags():
    """The instruction-set extensions of ISA_FLAGS that this CPU reports (/proc/cpuinfo)."""
    flags = _build_flags.cpu_flags() or []
    return [flag for flag in ISA_FLAGS if flag in flags]


def cpu_identity(cpuinfo="/proc/cpuinfo", caches="/sys/devices/system/cpu/cpu0/cache"):
    """Which CPU this is, beyond its marketing name (a VM's often says only "Intel Xeon Processor"):
    the vendor, family, model and stepping /proc/cpuinfo gives (Intel's family 6 model 106 is an
    Ice Lake server, 85 a Skylake or Cascade Lake one, AMD's family 25 a Zen 3 or Zen 4), and the
    size of each cache level of its first core, as sysfs names them ("48K"). None for what it
    cannot read."""
    processor = first_processor(cpuinfo)
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping"}
    identity = {}
    for key, name in fields.items():
        value = processor.get(key)
        identity[name] = int(value) if value is not None and value.isdigit() else value

    def read(index, name):
        with open(os.path.join(caches, index, name)) as f:
            return f.read().strip()

    sizes = {}
    try:
        for index in sorted(os.listdir(caches)):
            kind = {"Data": "d", "Instruction": "i"}.get(read(index, "type"), "")
            sizes[f"L{read(index, 'level')}{kind}"] = read(index, "size")
    except OSError:
        pass
    return {**identity, "caches": sizes}


def library_versions():
    """The versions of oneDNN and MKL in this torch, as torch.__config__.show() names them."""
    config = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    return {"onednn": onednn.group(1) if onednn else None, "mkl": mkl.group(1) if mkl else None}


def source_version():
    """torch_convbp's version and, where it is imported from a git checkout, the commit and
    whether the checkout's tracked files differ from it (None for an installed wheel)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(torch_convbp.__file__)))
    version = {"version": torch_convbp.__version__, "commit": None, "dirty": None}
    if not os.path.exists(os.path.join(checkout, ".git")):  # a directory, or a worktree's file
        return version
    try:
        commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "-C", checkout, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return version
    return {**version, "commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment(device, dtype):
    """What a result depends on besides the code: the CPU's instruction sets, the libraries' and
    ATen's choices, the settings that change them, and the build of torch_convbp that ran."""
    return {
        "torch_convbp": source_version(),
        "cpu": cpu_identity(),
        "cpu_flags": cpu_flags(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **library_versions(),
        "gemm_dtype": str(torch_convbp.gemm_dtype(dtype, device)).replace("torch.", ""),
        "gemm_engine": torch_convbp.gemm_engine(dtype, device),
        "settings": {name: os.environ[name] for name in SETTINGS if name in os.environ},
    }


def environment_line(env):
    """One line for a table's heading."""
    source = env["torch_convbp"]
    build = f"torch_convbp {source.get('version', '')}".rstrip()
    if source["commit"]:
        build += f" at {source['commit'][:7]}{' (modified)' if source['dirty'] else ''}"
    settings = "".join(f", {k}={v}" for k, v in env["settings"].items())
    cpu = env.get("cpu") or {}
    identity = (f"CPU family {cpu['family']} model {cpu['model']}, L2 {cpu['caches'].get('L2', '?')} a core; "
                if cpu.get("family") is not None and cpu.get("model") is not None else "")
    return (f"{build}; {identity}ISA: {' '.join(env['cpu_flags']) or 'unknown'} (ATen {env['aten_cpu_capability']}); "
            f"oneDNN {env['onednn']}, MKL {env['mkl']}; GEMMs in {env['gemm_dtype']} on "
            f"{env.get('gemm_engine', 'aten')}{settings}")
