#!/usr/bin/env bash
# The first run on a GPU (issue 12), in one command, so that GPU time goes to measuring:
#   1. build (pip, no index: the GPU machine has no network);
#   2. the whole test suite, slow CUDA tests included;
#   3. compute-sanitizer over the CUDA tests: memcheck, and racecheck for the kernels that use
#      shared memory (the depthwise weight gradient);
#   4. the benchmark suite on CUDA at batch 32: float32 with TF32 off, TF32, bfloat16, and float32
#      with every candidate captured in a CUDA graph; the host time of a tiny step;
#   5. with CUTLASS's headers in .whl/, the implicit-GEMM prototype: rebuilt, tested, timed.
# Every log, JSON and PNG lands in one folder:
#   benchmarks/gpu_run.sh [OUT]      # OUT: this argument, else $OUT, else benchmarks/results/gpu-<date>
# Without a GPU it rehearses every step on the CPU with small settings (no slow tests, one round,
# the quick suite at batch 2, no compute-sanitizer). It goes on past a failed step and exits 1 at
# the end if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-benchmarks/results/gpu-$(date +%F)}}"
mkdir -p "$OUT"
failed=0

step() {  # step NAME COMMAND...: runs it, its output in $OUT/NAME.log
  local name="$1"
  shift
  local start=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then
    echo "gpu_run: $name ok ($((SECONDS - start)) s)"
  else
    echo "gpu_run: $name FAILED ($((SECONDS - start)) s): $OUT/$name.log"
    failed=1
  fi
}

# Test dependencies the GPU image lacks (expecttest, for tests/test_opinfo.py) travel as wheels
# in .whl/ (fetch them with `pip download --no-deps --only-binary=:all: -d .whl expecttest`).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/gpu_run_site .whl/*.whl && export PYTHONPATH=/tmp/gpu_run_site
fi
step build python3 -m pip install --no-build-isolation --no-deps --no-index -e .
GPU="$(python3 -c 'import torch; print(int(torch.cuda.is_available()))')"
if [ "$GPU" = 1 ]; then
  DEVICE=cuda BATCH=32 SUITE=all ROUNDS=7
else
  echo "gpu_run: no GPU: a rehearsal on the CPU"
  DEVICE=cpu BATCH=2 SUITE=quick ROUNDS=1
fi
step environment python3 - "$OUT/environment.json" <<'PY'
import datetime, json, sys, torch, torch_convbp
cuda = torch.cuda.is_available()
info = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version() if cuda else None,
            gpu=torch.cuda.get_device_name() if cuda else None, cuda_kernels=torch_convbp.CUDA_KERNELS)
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)
PY
# With pytest-xdist, 12 processes of one thread each (3 min on an H100 machine's 16 cores), and
# a crash costs one test, not the run. The slow tests run after, alone: the largest needs 40 GB
# of free GPU memory.
PARALLEL=()
if [ "$GPU" = 1 ] && python3 -c "import xdist" 2>/dev/null; then PARALLEL=(-n 12); fi
[ ${#PARALLEL[@]} -gt 0 ] && export OMP_NUM_THREADS=1
step tests python3 -m pytest -q -p no:cacheprovider -m "not slow" "${PARALLEL[@]}"
unset OMP_NUM_THREADS
tail -n 1 "$OUT/tests.log" > "$OUT/pytest-summary.txt"
if [ "$GPU" = 1 ]; then
  step slow-tests python3 -m pytest -q -p no:cacheprovider -m slow
  tail -n 1 "$OUT/slow-tests.log" >> "$OUT/pytest-summary.txt"
  if command -v compute-sanitizer >/dev/null; then
    # Every CUDA kernel: the CUDA-only tests, and the CUDA cases of each route's tests (the NHWC
    # columns, the narrow groups' kernels, depthwise, pointwise) and of the transposing copy.
    SANITIZED=(python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/test_cuda.py
               tests/test_route_columns_nhwc.py tests/test_route_grouped.py tests/test_route_depthwise.py
               tests/test_route_pointwise.py tests/test_route_pointwise_by_images.py tests/test_route_implicit.py
               tests/test_transpose_copy.py)
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "${SANITIZED[@]}" -k "cuda or not cpu"
    step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "${SANITIZED[@]}" -k "depthwise or grouped"
  else
    echo "gpu_run: compute-sanitizer is not on PATH: memcheck and racecheck skipped"
    failed=1
  fi
fi
BENCH=(python3 benchmarks/bench_conv.py --device "$DEVICE" --batch "$BATCH" --suite "$SUITE" --rounds "$ROUNDS" --quiet)
plot() {  # plot NAME: --plot OUT/NAME.png where matplotlib is there (the tables and JSON are not held up)
  if python3 -c "import matplotlib" 2>/dev/null; then echo --plot "$OUT/$1.png"; fi
}
step bench-float32 "${BENCH[@]}" --memory --json "$OUT/bench-float32.json" $(plot bench-float32)
step bench-tf32 "${BENCH[@]}" --tf32 --json "$OUT/bench-tf32.json" $(plot bench-tf32)
step bench-bfloat16 "${BENCH[@]}" --dtype bfloat16 --json "$OUT/bench-bfloat16.json" $(plot bench-bfloat16)
if [ "$GPU" = 1 ]; then  # the same, every candidate captured in a CUDA graph: the host taken out
  step bench-float32-graphs "${BENCH[@]}" --cuda-graphs --json "$OUT/bench-float32-graphs.json"
fi
step host python3 -m torch_convbp host --json "$OUT/host.json"
# Last, as it rebuilds the extension: the CUTLASS implicit-GEMM prototype (NOTES section 33), when
# CUTLASS's headers came along (the nvidia-cutlass wheel in .whl/, like expecttest's).
if [ "$GPU" = 1 ] && python3 -c "import cutlass_library" 2>/dev/null; then
  step build-cutlass env TORCH_CONVBP_CUTLASS=1 python3 -m pip install --no-build-isolation --no-deps --no-index -e .
  step cutlass-tests python3 -m pytest -q -p no:cacheprovider tests/test_cutlass_prototype.py
  step bench-cutlass python3 benchmarks/bench_cutlass.py --batch "$BATCH" --json "$OUT/bench-cutlass.json"
fi
echo "gpu_run: everything is in $OUT"
exit $failed
