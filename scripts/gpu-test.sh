#!/usr/bin/env bash
# On a machine with an NVIDIA GPU whose python has CUDA builds of torch and/or jax:
#   1. the core's CUDA tests (ctest: tests/core/test_norm_cuda.cc, test_ops_cuda.cc, every op
#      family), then each under compute-sanitizer's memcheck (leaks included), racecheck,
#      initcheck and synccheck: any report fails the run;
#   2. fuselet built with its CUDA kernels into that python, and the whole test suite (the
#      CUDA variants included);
#   3. the GPU benchmarks (Liger-Kernel beside fuselet where it installs), the training step last.
# PYTHON selects the interpreter (default python3); every step runs, the exit code is the
# first failure's. FUSELET_SANITIZER_TIMEOUT bounds each sanitizer run (default 300 s).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
export FUSELET_CUDA=ON FUSELET_CUDA_ARCHS="${FUSELET_CUDA_ARCHS:-90}" PYTHONDONTWRITEBYTECODE=1
if [[ -z "${CUDACXX:-}" ]] && command -v nvcc >/dev/null; then export CUDACXX="$(command -v nvcc)"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0
fail() { echo "==> FAILED: $*"; [[ $status -ne 0 ]] || status=1; }

# 1. The core alone, and under compute-sanitizer.
core="$ROOT/build/gpu-core"
start=$(date +%s)
cmake -S "$ROOT" -B "$core" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSELET_FRAMEWORK=none \
  -DFUSELET_CUDA=ON -DFUSELET_CUDA_ARCHS="$FUSELET_CUDA_ARCHS" -DFUSELET_TESTS=ON -DFUSELET_PYTHON=OFF \
  -DPython_EXECUTABLE="$(command -v "$PY")" >"$core.log" 2>&1 || { cat "$core.log"; exit 1; }
cmake --build "$core"
echo "==> core built with CUDA kernels (${FUSELET_CUDA_ARCHS}) in $(( $(date +%s) - start )) s"
ctest --test-dir "$core" --output-on-failure || fail "the core's tests"
sanitizer="$(command -v compute-sanitizer || true)"
for dir in ${CUDA_HOME:+"$CUDA_HOME"} /usr/local/cuda; do
  if [[ -z "$sanitizer" && -x "$dir/bin/compute-sanitizer" ]]; then sanitizer="$dir/bin/compute-sanitizer"; fi
done
if [[ -z "$sanitizer" ]]; then
  fail "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin): the CUDA kernels were not sanitized"
else
  for tool in memcheck racecheck initcheck synccheck; do
    args=(--tool "$tool" --error-exitcode 3)
    [[ $tool != memcheck ]] || args+=(--leak-check full)
    for test in test_norm_cuda test_ops_cuda; do
      log="$core/sanitize-$tool-$test.log"
      start=$(date +%s)
      rc=0
      timeout "${FUSELET_SANITIZER_TIMEOUT:-300}" "$sanitizer" "${args[@]}" "$core/tests/core/$test" >"$log" 2>&1 || rc=$?
      echo "==> compute-sanitizer $tool $test: rc $rc in $(( $(date +%s) - start )) s: $(grep -m1 'ERROR SUMMARY' "$log" || tail -n1 "$log")"
      if [[ $rc -ne 0 ]]; then
        grep -E '^=+ (ERROR|Invalid|Race|Uninitialized|Barrier|Leaked)|FAIL' "$log" | head -20 || tail -n 20 "$log"
        fail "compute-sanitizer $tool $test (rc $rc; $log)"
      fi
    done
  done
fi

# 2. The frameworks' layers with CUDA kernels, and every test.
start=$(date +%s)
SKBUILD_BUILD_DIR="$ROOT/build/gpu" "$PY" -m pip install --quiet --no-build-isolation --no-deps "$ROOT"
echo "==> built with CUDA kernels (${FUSELET_CUDA_ARCHS}) in $(( $(date +%s) - start )) s"
(cd /tmp && "$PY" -m fuselet)
cd "$ROOT"
"$PY" -m pytest tests -p no:cacheprovider -q -rs "$@" || fail "pytest"

# 3. The benchmarks, with Liger-Kernel beside fuselet where it installs (pure Python over the
# Triton of torch's CUDA wheels: --no-deps; from PyPI, or from the wheels in build/wheels on a
# machine without an index: `pip download --no-deps liger-kernel -d build/wheels` beforehand).
# One process per table: a GPU's timings do not carry the CPU VMs' per-process mapping costs.
if ! "$PY" -c "import liger_kernel" 2>/dev/null; then
  "$PY" -m pip install --quiet --no-deps ${FUSELET_WHEELS:+--find-links "$FUSELET_WHEELS"} \
    --find-links "$ROOT/build/wheels" liger-kernel 2>&1 | tail -n 2 \
    || echo "==> Liger-Kernel could not be installed: the benchmarks run without its column"
fi
"$PY" benchmarks/bench_norm.py --device cuda --repeats 5 --processes 1 || fail "bench_norm"
"$PY" benchmarks/bench_ops.py --device cuda --repeats 5 --processes 1 || fail "bench_ops"
"$PY" benchmarks/bench_rope.py --device cuda --repeats 5 --processes 1 || fail "bench_rope"
"$PY" benchmarks/bench_cross_entropy.py --device cuda --repeats 5 --processes 1 || fail "bench_cross_entropy"
"$PY" benchmarks/bench_fused_linear_cross_entropy.py --device cuda --processes 1 --methods fuselet.torch,"torch eager","torch.compile" \
  || fail "bench_fused_linear_cross_entropy"
# The training step: what a GPU user runs (bfloat16 weights), both layers, eager and compile.
"$PY" benchmarks/bench_step.py --device cuda --processes 1 --models llama --precisions bfloat16 || fail "bench_step"
exit "$status"
