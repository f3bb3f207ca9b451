#!/usr/bin/env bash
# The GPU check, sized for a lease of a GPU machine (no network; torch, jax, nvcc and
# compute-sanitizer are there; Liger-Kernel is carried as a wheel): one command whose phases run
# in priority order, each under a time budget of its own, writing what it found to a results
# folder as it goes, so that a run cut short still returns every phase it finished.
#   scripts/gpu-test.sh             run every phase (on the GPU machine)
#   scripts/gpu-test.sh --plan      print the phases and their budgets, check the carried wheels
#                                   (no GPU needed), last line "total: N s"
#   scripts/gpu-test.sh --prepare   download the wheels to carry (requirements/gpu.txt) for the GPU
#                                   machine's python (FUSELET_GPU_PYTHON, 3.12) into .device/wheels
#                                   (needs an index; run it where there is one)
#   scripts/gpu-test.sh PHASE...    only those phases (names as --plan prints them)
# PYTHON selects the interpreter (default python3). Results: $FUSELET_GPU_RESULTS, else $OUT/gpu
# (the device tool's folder), else build/gpu-results: summary.txt (one line a phase: name,
# status, seconds) and one log a phase. The exit code is 1 if any phase failed or ran out of time.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${FUSELET_GPU_WHEELS:-$ROOT/.device/wheels}"
# name:budget (seconds): the order is the priority. The budgets add up to 8 minutes, within one
# command's 10 and a lease's 15 with room for a second run.
PHASES=(build:150 core:20 layers:110 memcheck:60 sanitizers:45 bench:55 step:40)

carried() {  # the wheels of requirements/gpu.txt that lie in .device/wheels; 1 if one is missing
  local missing=0 req name version
  while read -r req; do
    name="${req%%==*}" version="${req#*==}"
    if compgen -G "$WHEELS/${name//-/_}-$version-*.whl" >/dev/null; then
      echo "carried: $(basename "$(compgen -G "$WHEELS/${name//-/_}-$version-*.whl" | head -1)")"
    else
      echo "missing: $req in .device/wheels (run scripts/gpu-test.sh --prepare here, where PyPI is reachable)"
      missing=1
    fi
  done < <(grep -Ev '^\s*(#|$)' "$ROOT/requirements/gpu.txt")
  return "$missing"
}

case "${1:-}" in
  --prepare)
    mkdir -p "$WHEELS"
    # for the GPU machine's python (FUSELET_GPU_PYTHON, default 3.12: the device notes), not this one's
    exec python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${FUSELET_GPU_PYTHON:-3.12}" \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$WHEELS" -r "$ROOT/requirements/gpu.txt" ;;
  --plan)
    total=0
    for phase in "${PHASES[@]}"; do
      printf '%-11s %4d s\n' "${phase%%:*}" "${phase#*:}"
      total=$(( total + ${phase#*:} ))
    done
    status=0
    carried || status=1
    echo "total: $total s"
    exit "$status" ;;
esac
selected=("$@")
results="${FUSELET_GPU_RESULTS:-${OUT:+$OUT/gpu}}"
results="${results:-$ROOT/build/gpu-results}"
mkdir -p "$results"
export FUSELET_CUDA=ON FUSELET_CUDA_ARCHS="${FUSELET_CUDA_ARCHS:-90}" PYTHONDONTWRITEBYTECODE=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if [[ -z "${CUDACXX:-}" ]] && command -v nvcc >/dev/null; then export CUDACXX="$(command -v nvcc)"; fi
core="$ROOT/build/gpu-core"
sanitizer="$(command -v compute-sanitizer || true)"
for dir in ${CUDA_HOME:+"$CUDA_HOME"} /usr/local/cuda; do
  [[ -n "$sanitizer" || ! -x "$dir/bin/compute-sanitizer" ]] || sanitizer="$dir/bin/compute-sanitizer"
done

phase_build() {  # the core with its CUDA tests, and the layers with CUDA kernels, all cores
  cmake -S "$ROOT" -B "$core" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSELET_FRAMEWORK=none \
    -DFUSELET_CUDA=ON -DFUSELET_CUDA_ARCHS="$FUSELET_CUDA_ARCHS" -DFUSELET_TESTS=ON -DFUSELET_PYTHON=OFF \
    -DPython_EXECUTABLE="$(command -v "$PY")" && cmake --build "$core" || return 1
  SKBUILD_BUILD_DIR="$ROOT/build/gpu" "$PY" -m pip install --quiet --no-build-isolation --no-deps "$ROOT" || return 1
  (cd /tmp && "$PY" -m fuselet)
}
phase_core() {  # the core's tests, the CUDA kernels of every op family among them
  ctest --test-dir "$core" --output-on-failure
}
phase_layers() {  # the CUDA variants of every op family's tests, in both layers
  (cd "$ROOT" && "$PY" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -m cuda -rs \
    tests/torch tests/jax tests/bad_input)
}
sanitize() {  # sanitize TOOL TEST [ARGS...]: one test binary under one compute-sanitizer tool
  local tool=$1 test=$2; shift 2
  [[ -n "$sanitizer" ]] || { echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)"; return 1; }
  "$sanitizer" --tool "$tool" --error-exitcode 3 "$@" "$core/tests/core/$test"
}
phase_memcheck() {  # every CUDA kernel of the core under memcheck, leaks included
  sanitize memcheck test_ops_cuda --leak-check full && sanitize memcheck test_norm_cuda --leak-check full
}
phase_sanitizers() {  # racecheck, initcheck, synccheck on the smaller test binary (the norms)
  local tool rc=0
  for tool in racecheck initcheck synccheck; do sanitize "$tool" test_norm_cuda || rc=1; done
  return "$rc"
}
phase_bench() {  # per-op tables against torch eager, torch.compile, Liger-Kernel
  "$PY" -c "import liger_kernel" 2>/dev/null || echo "Liger-Kernel is not installed (.device/wheels): its columns are absent"
  local rc=0 bench
  for bench in bench_norm bench_ops bench_rope; do
    "$PY" "$ROOT/benchmarks/$bench.py" --device cuda --repeats 5 --quick || rc=1
  done
  "$PY" "$ROOT/benchmarks/bench_cross_entropy.py" --device cuda --repeats 5 || rc=1
  "$PY" "$ROOT/benchmarks/bench_fused_linear_cross_entropy.py" --device cuda --processes 1 \
    --methods fuselet.torch,"torch eager","torch.compile" || rc=1
  return "$rc"
}
phase_step() {  # the training step a GPU user runs: bfloat16 weights, eager and compiled
  "$PY" "$ROOT/benchmarks/bench_step.py" --device cuda --processes 1 --models llama --precisions bfloat16
}

# What the tests and benchmarks import that the machine may lack, from the carried wheels: once,
# before any phase, so that every phase (or a selection of them) finds it.
"$PY" -m pip install --quiet --no-deps --no-index --find-links "$WHEELS" -r "$ROOT/requirements/gpu.txt" \
  >"$results/carried.log" 2>&1 || echo "the carried wheels (.device/wheels) could not all be installed: $results/carried.log"
status=0
summary="$results/summary.txt"
: >"$summary"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$results/gpu.txt" 2>&1 || true
for phase in "${PHASES[@]}"; do
  name="${phase%%:*}" budget="${phase#*:}"
  if [[ ${#selected[@]} -gt 0 && " ${selected[*]} " != *" $name "* ]]; then continue; fi
  start=$(date +%s)
  rc=0
  # each phase in a shell of its own, killed with everything it started at its budget
  timeout --kill-after=5 "$budget" bash -c "$(declare -f "phase_$name" sanitize); $(declare -p ROOT PY WHEELS core sanitizer); phase_$name" \
    >"$results/$name.log" 2>&1 || rc=$?
  took=$(( $(date +%s) - start ))
  case $rc in 0) verdict=passed ;; 124|137) verdict="out of time (budget $budget s)" ;; *) verdict="FAILED (rc $rc)" ;; esac
  printf '%-11s %-28s %4d s\n' "$name" "$verdict" "$took" | tee -a "$summary"
  if [[ $rc -ne 0 ]]; then
    status=1
    tail -n 25 "$results/$name.log"
    [[ $name != build ]] || break   # nothing after it can run without the build
  fi
done
# the benchmark tables the phases wrote, beside the summary
cp "$ROOT"/benchmarks/results/*-cuda* "$ROOT"/benchmarks/results/*h200* "$results/" 2>/dev/null || true
exit "$status"
