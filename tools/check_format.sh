#!/usr/bin/env bash
# The code's style, checked: the C++ and CUDA sources against .clang-format, the Python against
# pyproject.toml's ruff configuration. Formatting only: no build, a few seconds.
#
#   tools/check_format.sh          # in a venv of the project (.ci/run calls it after the tests)
#   tools/check_format.sh --fix    # reformat the C++ in place; ruff's fixes for the Python
#
# The tools' versions are pinned: another clang-format can format the same code otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/tools/common.sh"
cd "$ROOT"
python -m pip install -q clang-format==23.1.5 ruff==0.17.6 || missing "pip could not install clang-format and ruff."
mapfile -t sources < <(git ls-files -co --exclude-standard -- 'csrc/*' 'tests/cuda_harness/*' | grep -E '\.(h|cpp|cu|cuh)$')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${sources[@]}"
  ruff check --fix .
  exit 0
fi
clang-format --dry-run --Werror "${sources[@]}"
ruff check .
say "the C++ (${#sources[@]} files) and the Python follow the project's style"
