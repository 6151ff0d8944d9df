#!/usr/bin/env bash
# torch_convbp's C++ code under AddressSanitizer and UndefinedBehaviorSanitizer (gcc), as trusted
# C++ projects run it: out-of-bounds reads and writes that give the right answer by luck, use after
# free, and undefined behaviour such as signed overflow in index arithmetic all stop the run.
#
# In a virtual environment of its own (the CPU torch), it builds a copy of the tree
# (build/sanitize/src) with TORCH_CONVBP_SANITIZE=1, installed editable there: a venv shared with
# the main tree would import the sanitized copy until the main tree is installed again, so CI, which
# runs this beside the test command, keeps them apart. It runs the fast tests and a fuzz run with
# the ASan runtime (and libstdc++) preloaded into Python, which is not instrumented, and leak
# detection off (Python and torch keep memory to the end on purpose).
#
#   tools/check_sanitizers.sh             # .ci/run runs it beside the test command
#
# Settings: TORCH_CONVBP_SANITIZE_VENV (default .venv-sanitize), TORCH_CONVBP_FUZZ_EXAMPLES
# (default 300 here). With CI=true anything missing is a failure; elsewhere it says what.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/tools/common.sh"
VENV="${TORCH_CONVBP_SANITIZE_VENV:-$ROOT/.venv-sanitize}"

command -v g++ >/dev/null || missing "g++ is not on PATH: install gcc (g++)."
ASAN_RUNTIME="$(g++ -print-file-name=libasan.so)"
# Preloaded with the ASan runtime: without it, ASan finds no __cxa_throw to intercept (Python does
# not link libstdc++) and aborts at the first C++ exception, i.e. at the first refused argument.
CXX_RUNTIME="$(g++ -print-file-name=libstdc++.so)"
[ -f "$ASAN_RUNTIME" ] || missing "gcc's AddressSanitizer runtime (libasan.so) is not installed: apt-get install libasan8 (Debian 12), or your distribution's gcc sanitizer libraries."
make_venv "$VENV" torch==2.13.0 numpy pytest hypothesis

copy_tree "$ROOT/build/sanitize/src"
cd "$ROOT/build/sanitize/src"
say "building with -fsanitize=address,undefined"
"$VENV/bin/python" -c 'import sys; sys.path.insert(0, "torch_convbp"); import _build_flags; sys.exit(not _build_flags.cpu_has_avx512())' ||
  say "this CPU has no AVX-512: the build leaves out the AVX-512 kernels, which could not run here (setup.py)"
start=$SECONDS
TORCH_CONVBP_SANITIZE=1 MAX_JOBS="${MAX_JOBS:-2}" "$VENV/bin/pip" install -q --no-build-isolation --no-deps -e .
say "built in $((SECONDS - start)) s"

under_sanitizers() {
  LD_PRELOAD="$ASAN_RUNTIME $CXX_RUNTIME" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$@"
}
say "the fast tests under the sanitizers"
# Values and gradients of every case and layout, the column kernels' adjointness and row bands, the
# workspace limit down to single rows, both grad-input routes, dtypes, every error path, the family
# (volumes too, their bands and thread counts; not the large #128947 call, whose code paths the
# small banded cases take too), the transposing copy between layouts, the 1x1 weight gradient by
# products per image (the GPU's route, taken on the CPU by its tests), the GEMM driver on the
# micro-kernel in every orientation (where this CPU has it) and the pool of scratch memory. Not
# opcheck: it calls the operators on the values tests' inputs again, under torch's tracing and
# fake tensors (Python), and took 139 of these tests' 182 s (benchmarks/NOTES.md, section 84).
under_sanitizers "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_values.py tests/test_ops.py tests/test_errors.py tests/test_docs.py tests/test_dtypes.py \
  tests/test_family.py tests/test_family_3d.py tests/test_transpose_copy.py \
  tests/test_route_pointwise_by_images.py tests/test_gemm_engines.py tests/test_scratch.py \
  -k "not gradcheck and not compile and not opcheck and not 128947"
say "a fuzz run under the sanitizers"
TORCH_CONVBP_FUZZ_EXAMPLES="${TORCH_CONVBP_FUZZ_EXAMPLES:-300}" under_sanitizers "$VENV/bin/python" -m pytest -q \
  -p no:cacheprovider tests/test_reliability.py -k "random or non_finite or threads"
