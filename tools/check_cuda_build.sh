#!/usr/bin/env bash
# The real CUDA build of torch_convbp, checked on a machine with or without a GPU.
#
# In a virtual environment of its own with the CUDA build of torch, it builds the extension with
# its CUDA kernels (TORCH_CONVBP_CUDA=1, no other variable: setup.py finds the toolkit and picks
# the architectures), checks that every device kernel is registered for CUDA
# (tests/test_cuda_build.py, which fails rather than skips here), and runs the whole test suite
# under that build. Without a GPU the CUDA kernels cannot run, but their per-thread arithmetic
# can: tests/test_cuda_threads.py runs it on the CPU. The build happens in a copy of the tree
# (build/cuda-check/src), so the CPU build of your own checkout is left alone.
#
#   tools/check_cuda_build.sh [pytest arguments]     # .ci/run runs it beside the test command
#
# Settings: TORCH_CONVBP_CUDA_VENV (default .venv-cuda), TORCH_CONVBP_CUDA_TORCH (the torch to
# install, default torch==2.14.1, a CUDA 13.0 build), MAX_JOBS (parallel compile jobs).
# With CI=true anything missing is a failure; elsewhere the script says what is missing and how
# to get it, and exits 0 without checking.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/tools/common.sh"
VENV="${TORCH_CONVBP_CUDA_VENV:-$ROOT/.venv-cuda}"
TORCH_SPEC="${TORCH_CONVBP_CUDA_TORCH:-torch==2.14.1}"

command -v nvcc >/dev/null ||
  missing "nvcc is not on PATH. Install a CUDA toolkit whose major version matches torch's CUDA (13.x for $TORCH_SPEC) and put its bin/ on PATH, or set CUDA_HOME."
make_venv "$VENV" "$TORCH_SPEC" numpy pytest hypothesis scikit-learn expecttest
"$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is None)" ||
  missing "$TORCH_SPEC in $VENV is not a CUDA build of torch. Name a CUDA build with TORCH_CONVBP_CUDA_TORCH."

copy_tree "$ROOT/build/cuda-check/src"
cd "$ROOT/build/cuda-check/src"
say "building with CUDA kernels ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $(nvcc --version | tail -n 2 | head -n 1))"
start=$SECONDS
TORCH_CONVBP_CUDA=1 MAX_JOBS="${MAX_JOBS:-2}" "$VENV/bin/pip" install -q --no-build-isolation --no-deps -e .
say "built in $((SECONDS - start)) s"

say "running the test suite under the CUDA build"
TORCH_CONVBP_EXPECT_CUDA_KERNELS=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
