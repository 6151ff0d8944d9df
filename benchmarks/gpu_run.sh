#!/usr/bin/env bash
# A run on a GPU (issues 12 and 33), in one command, so that GPU time goes to measuring. The steps,
# most important first:
#   1. build (pip, no index: the GPU machine has no network);
#   2. the tests on the GPU (the whole suite; with a budget, the CUDA tests only);
#   3. compute-sanitizer: memcheck over every CUDA kernel's tests, racecheck over the depthwise
#      tests (the lane sums of the depthwise weight gradient are the one kernel with shared memory);
#   4. the layer suite on CUDA at batch 32, float32 with TF32 off: eager, then every candidate
#      captured in a CUDA graph (the host taken out); a profile of the depthwise layers; the host
#      time of a tiny step;
#   5. CPU scaling on the GPU machine's cores: ours against oneDNN at 1 to 16 threads;
#   6. the suite in TF32 and bfloat16; the slow tests;
#   7. with CUTLASS's headers in .whl/, the implicit-GEMM prototype: rebuilt, tested, timed.
# Every log, JSON and PNG lands in one folder:
#   benchmarks/gpu_run.sh [OUT]      # OUT: this argument, else $OUT, else benchmarks/results/gpu-<date>
# GPU_RUN_SECONDS=N gives the run a budget (the device tool's leases are short): each step then
# runs under a time limit of its own, cut to what is left, and a step that would start with
# under 15 s left is skipped and named. Without it every step runs to its end.
# GPU_RUN_STEPS="build tests ..." runs only the steps named (with a short lease, say).
# Without a GPU it rehearses every step on the CPU with small settings (no slow tests, one round,
# the quick suite at batch 2, no compute-sanitizer). It goes on past a failed step and exits 1 at
# the end if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-benchmarks/results/gpu-$(date +%F)}}"
mkdir -p "$OUT"
failed=0

BUDGET="${GPU_RUN_SECONDS:-0}"

# step NAME LIMIT COMMAND...: runs it, its output in $OUT/NAME.log; under a budget, for LIMIT
# seconds at most (cut to what is left of the budget).
step() {
  local name="$1" limit="$2" start=$SECONDS
  shift 2
  if [ -n "${GPU_RUN_STEPS:-}" ] && [[ " $GPU_RUN_STEPS " != *" $name "* ]]; then
    return
  fi
  local run=("$@")
  if [ "$BUDGET" -gt 0 ]; then
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then
      echo "gpu_run: $name SKIPPED: the budget of $BUDGET s is spent"
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    run=(timeout --kill-after=5 "$limit" "$@")
  fi
  "${run[@]}" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ "$rc" = 0 ]; then
    echo "gpu_run: $name ok ($((SECONDS - start)) s)"
  elif [ "$BUDGET" -gt 0 ] && { [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then
    echo "gpu_run: $name STOPPED at its time limit ($((SECONDS - start)) s): $OUT/$name.log"
    failed=1
  else
    echo "gpu_run: $name FAILED ($((SECONDS - start)) s): $OUT/$name.log"
    failed=1
  fi
}

summary() {  # summary NAME: the last line of a pytest log, where the step ran
  if [ -f "$OUT/$1.log" ]; then tail -n 1 "$OUT/$1.log"; fi
}

# Test dependencies the GPU image lacks (expecttest, for tests/test_opinfo.py) travel as wheels
# in .whl/ (fetch them with `pip download --no-deps --only-binary=:all: -d .whl expecttest`).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gpu_run_site .whl/*.whl && export PYTHONPATH=/tmp/gpu_run_site
fi
step build 300 python3 -m pip install --no-build-isolation --no-deps --no-index -e .
GPU="$(python3 -c 'import torch; print(int(torch.cuda.is_available()))')"
if [ "$GPU" = 1 ]; then
  DEVICE=cuda BATCH=32 SUITE=2d ROUNDS="${GPU_RUN_ROUNDS:-7}"
else
  echo "gpu_run: no GPU: a rehearsal on the CPU"
  DEVICE=cpu BATCH=2 SUITE=quick ROUNDS=1
fi
step environment 60 python3 - "$OUT/environment.json" <<'PY'
import datetime, json, sys, torch, torch_convbp
cuda = torch.cuda.is_available()
info = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version() if cuda else None,
            gpu=torch.cuda.get_device_name() if cuda else None, cuda_kernels=torch_convbp.CUDA_KERNELS)
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)
PY
# With pytest-xdist, 12 processes of one thread each (3 min on an H100 machine's 16 cores), and
# a crash costs one test, not the run. Under a budget, the tests that run on the GPU: those with
# cuda in their names (the device fixture's CUDA cases, the CUDA-only files), less the CPU harness
# of the CUDA threads, which the CPU's CI runs. The slow tests run later, alone: the largest needs
# 40 GB of free GPU memory.
PARALLEL=()
if [ "$GPU" = 1 ] && python3 -c "import xdist" 2>/dev/null; then PARALLEL=(-n 12); fi
SELECTED=()
[ "$BUDGET" -gt 0 ] && [ "$GPU" = 1 ] && SELECTED=(-k "cuda and not cuda_threads")
[ ${#PARALLEL[@]} -gt 0 ] && export OMP_NUM_THREADS=1
step tests 240 python3 -m pytest -q -p no:cacheprovider -m "not slow" "${PARALLEL[@]}" "${SELECTED[@]}"
unset OMP_NUM_THREADS
summary tests > "$OUT/pytest-summary.txt"
if [ "$GPU" = 1 ]; then
  if command -v compute-sanitizer >/dev/null; then
    # Every CUDA kernel: the CUDA-only tests, and the CUDA cases of each route's tests (the NHWC
    # columns, the narrow groups' kernels, depthwise, pointwise) and of the transposing copy.
    # Under a budget, the kernels that had never run under it (NHWC columns, grouped, depthwise),
    # less their gradients of any order (gradgradcheck under the sanitizer takes minutes).
    SANITIZED=(tests/test_route_columns_nhwc.py tests/test_route_grouped.py tests/test_route_depthwise.py)
    [ "$BUDGET" -gt 0 ] || SANITIZED+=(tests/test_cuda.py tests/test_route_pointwise.py
      tests/test_route_pointwise_by_images.py tests/test_route_implicit.py tests/test_transpose_copy.py)
    PYTEST=(python3 -m pytest -q -p no:cacheprovider -m "not slow" -k "cuda and not any_order")
    step memcheck 100 compute-sanitizer --tool memcheck --error-exitcode 1 "${PYTEST[@]}" "${SANITIZED[@]}"
    # racecheck sees shared memory only, so only the depthwise weight gradient's lane sums: over
    # the NHWC-column tests too it ran 22 tests in 120 s (NOTES section 116)
    step racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 1 "${PYTEST[@]}" tests/test_route_depthwise.py
  else
    echo "gpu_run: compute-sanitizer is not on PATH: memcheck and racecheck skipped"
    failed=1
  fi
fi
BENCH=(python3 benchmarks/bench_conv.py --device "$DEVICE" --batch "$BATCH" --suite "$SUITE" --rounds "$ROUNDS" --quiet)
plot() {  # plot NAME: --plot OUT/NAME.png where matplotlib is there (the tables and JSON are not held up)
  if python3 -c "import matplotlib" 2>/dev/null; then echo --plot "$OUT/$1.png"; fi
}
MEMORY=()
[ "$BUDGET" -gt 0 ] || MEMORY=(--memory)
step bench-float32 150 "${BENCH[@]}" "${MEMORY[@]}" --json "$OUT/bench-float32.json" $(plot bench-float32)
if [ "$GPU" = 1 ]; then  # the same, every candidate captured in a CUDA graph: the host taken out
  step bench-float32-graphs 150 "${BENCH[@]}" --cuda-graphs --json "$OUT/bench-float32-graphs.json"
  step profile-depthwise 60 python3 benchmarks/profile_layers.py --layers dw --batch "$BATCH"
fi
step host 40 python3 -m torch_convbp host --json "$OUT/host.json"
if [ "$GPU" = 1 ]; then  # the CPU at 1 to 16 threads, ours against oneDNN (the GPU idle)
  step cpu-scaling 120 python3 benchmarks/cpu_scaling.py --threads 1 2 4 8 16 --model resnet50 \
    --json "$OUT/cpu-scaling.json"
fi
step bench-tf32 150 "${BENCH[@]}" --tf32 --json "$OUT/bench-tf32.json" $(plot bench-tf32)
step bench-bfloat16 150 "${BENCH[@]}" --dtype bfloat16 --json "$OUT/bench-bfloat16.json" $(plot bench-bfloat16)
if [ "$GPU" = 1 ]; then
  step slow-tests 300 python3 -m pytest -q -p no:cacheprovider -m slow
  summary slow-tests >> "$OUT/pytest-summary.txt"
fi
# Last, as it rebuilds the extension: the CUTLASS implicit-GEMM prototype (NOTES section 33), when
# CUTLASS's headers came along (the nvidia-cutlass wheel in .whl/, like expecttest's).
if [ "$GPU" = 1 ] && python3 -c "import cutlass_library" 2>/dev/null; then
  step build-cutlass 300 env TORCH_CONVBP_CUTLASS=1 python3 -m pip install --no-build-isolation --no-deps --no-index -e .
  step cutlass-tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_cutlass_prototype.py
  step bench-cutlass 120 python3 benchmarks/bench_cutlass.py --batch "$BATCH" --json "$OUT/bench-cutlass.json"
fi
echo "gpu_run: everything is in $OUT"
exit $failed
