#!/usr/bin/env bash
# The package as a user installs it: a wheel built from this tree, installed into a fresh virtual
# environment with the same torch and nothing of the source tree on the path, where the main job
# runs (the self-check, and a small timing table).
#
#   tools/check_wheel.sh          # in the project's venv (.ci/run calls it after the tests)
#
# Settings: TORCH_CONVBP_WHEEL_VENV (default .venv-wheel), and the venv's python is the one on PATH
# (its torch is the one the wheel is built against and installed with).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/tools/common.sh"
VENV="${TORCH_CONVBP_WHEEL_VENV:-$ROOT/.venv-wheel}"
cd "$ROOT"
TORCH_VERSION="$(python -c 'import re, torch; print(re.match(r"\d+\.\d+\.\d+", torch.__version__).group(0))')"
rm -rf dist
say "building the wheel against torch $TORCH_VERSION"
python -m pip wheel -q --no-build-isolation --no-deps -w dist .
WHEEL="$(ls dist/torch_convbp-*.whl)"
say "$(basename "$WHEEL"): requires $(unzip -p "$WHEEL" '*.dist-info/METADATA' | grep '^Requires-Dist: torch' | cut -d' ' -f2-)"
rm -rf "$VENV"
python -m venv "$VENV"
# --no-compile as in make_venv (tools/common.sh).
"$VENV/bin/pip" install -q --no-compile "torch==$TORCH_VERSION" numpy "$WHEEL" || missing "pip could not install the wheel into $VENV."
say "running the main job from outside the tree"
cd "$(mktemp -d)"
"$VENV/bin/python" -m torch_convbp --version
"$VENV/bin/python" -m torch_convbp check --layers "3x3 64 @56" --batch 2 --rounds 1
