#!/usr/bin/env bash
# The real CUDA build of torch_convbp, checked on a machine with or without a GPU.
#
# In a virtual environment of its own with the CUDA build of torch, it builds the extension with
# its CUDA kernels (TORCH_CONVBP_CUDA=1, no other variable: setup.py finds the toolkit and picks
# the architectures), checks that every device kernel is registered for CUDA, and runs the whole
# test suite under that build. Without a GPU the CUDA kernels cannot run, but their per-thread
# arithmetic can: tests/test_cuda_threads.py runs it on the CPU. The build happens in a copy of
# the tree (build/cuda-check/src), so the CPU build of your own checkout is left alone.
#
#   tools/check_cuda_build.sh              # .ci/run calls it after the README's test command
#
# Settings: TORCH_CONVBP_CUDA_VENV (default .venv-cuda), TORCH_CONVBP_CUDA_TORCH (the torch to
# install, default torch==2.14.1, a CUDA 13.0 build), MAX_JOBS (parallel compile jobs).
# With CI=true anything missing is a failure; elsewhere the script says what is missing and how
# to get it, and exits 0 without checking.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${TORCH_CONVBP_CUDA_VENV:-$ROOT/.venv-cuda}"
TORCH_SPEC="${TORCH_CONVBP_CUDA_TORCH:-torch==2.14.1}"
WORK="$ROOT/build/cuda-check"
say() { echo "check_cuda_build: $*"; }

missing() {
  say "MISSING: $1" >&2
  if [ "${CI:-}" = "true" ]; then
    say "FAILED: CI checks the CUDA build, and it could not be made" >&2
    exit 1
  fi
  say "skipped: the CUDA build was NOT checked" >&2
  exit 0
}

command -v nvcc >/dev/null ||
  missing "nvcc is not on PATH. Install a CUDA toolkit whose major version matches torch's CUDA (13.x for $TORCH_SPEC) and put its bin/ on PATH, or set CUDA_HOME."
command -v git >/dev/null || missing "git is needed to copy the tree."

if [ ! -x "$VENV/bin/python" ]; then
  say "making $VENV with $TORCH_SPEC (a CUDA build of torch: several GB, a few minutes)"
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q "$TORCH_SPEC" numpy pytest hypothesis scikit-learn expecttest ||
  missing "pip could not install $TORCH_SPEC (a CUDA build) into $VENV. Check the network or a local wheel; TORCH_CONVBP_CUDA_TORCH names another torch."
"$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is None)" ||
  missing "$TORCH_SPEC in $VENV is not a CUDA build of torch. Name a CUDA build with TORCH_CONVBP_CUDA_TORCH."

say "copying the tree to $WORK/src"
mkdir -p "$WORK/src"
find "$WORK/src" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
git -C "$ROOT" ls-files -co --exclude-standard -z | tar -C "$ROOT" --null -T - -cf - | tar -C "$WORK/src" -xf -

cd "$WORK/src"
say "building with CUDA kernels ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $(nvcc --version | tail -n 2 | head -n 1))"
start=$SECONDS
TORCH_CONVBP_CUDA=1 MAX_JOBS="${MAX_JOBS:-2}" "$VENV/bin/pip" install -q --no-build-isolation --no-deps -e .
say "built in $((SECONDS - start)) s"

say "running the test suite under the CUDA build"
TORCH_CONVBP_EXPECT_CUDA_KERNELS=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
