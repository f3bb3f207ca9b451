#!/usr/bin/env bash
# Compile every CUDA source (core kernels and their C++ tests, torch CUDA impls, JAX CUDA
# handlers) with the machine's nvcc for FUSELET_CUDA_ARCHS (default 90), against the CUDA torch
# of .venv-cuda (requirements/cuda.txt). Nothing runs: this proves the CUDA build compiles
# without a GPU, and what each core kernel compiled to (registers, shared memory, spills) beside
# the largest launch the emulated tests made of it: benchmarks/results/cuda-resource-usage.md,
# failing where a launch needs more than its kernel allows (scripts/cuda_resources.py).
# FUSELET_CUDA_FRAMEWORK=jax|none leaves the torch CUDA impls out and compiles
# with .venv instead (no 5.5 GB CUDA torch): `make test` does so, as its conda package build
# compiles them (fuselet-torch cuda130, against conda's CUDA pytorch).
source "$(dirname "$0")/env.sh"
nvcc_bin="$(command -v nvcc || true)"
if [[ -z "$nvcc_bin" ]]; then
  log "cuda-build: SKIPPED: no nvcc on PATH (install the CUDA toolkit to compile the CUDA kernels)"
  exit 0
fi
# nvcc may be a wrapper script exec'ing the real toolkit's nvcc: find the toolkit root.
real_nvcc="$(grep -o '/[^ "]*/bin/nvcc' "$nvcc_bin" 2>/dev/null | head -1 || true)"
toolkit="$(dirname "$(dirname "${real_nvcc:-$(readlink -f "$nvcc_bin")}")")"
framework="${FUSELET_CUDA_FRAMEWORK:-all}"
case "$framework" in all|torch|jax|none) ;; *)
  echo "cuda-build: FUSELET_CUDA_FRAMEWORK must be one of all, torch, jax, none; got '$framework'" >&2; exit 2;; esac
# Under pixi the active (cuda) environment is the one; else .venv-cuda from requirements/cuda.txt
# when torch's CUDA impls are compiled, .venv otherwise.
if [[ -n "${FUSELET_NO_BOOTSTRAP:-}" ]]; then cuda_venv="$VENV"
elif [[ "$framework" == all || "$framework" == torch ]]; then
  cuda_venv="${FUSELET_CUDA_VENV:-$ROOT/.venv-cuda}"
  "$ROOT/scripts/bootstrap.sh" "$cuda_venv" "$ROOT/requirements/cuda.txt"
else
  cuda_venv="$VENV"
  "$ROOT/scripts/bootstrap.sh"
fi
compiler_cache   # after bootstrap, which installs sccache
py="$cuda_venv/bin/python"
build="$ROOT/build/cuda"
log "cuda-build: nvcc from $toolkit, archs ${FUSELET_CUDA_ARCHS:-90}, frameworks $framework, python $py ($build)"
start=$(date +%s)
"$cuda_venv/bin/cmake" -S "$ROOT" -B "$build" -G Ninja "${LAUNCHER_ARGS[@]}" -DFUSELET_CUDA=ON -DFUSELET_CUDA_ARCHS="${FUSELET_CUDA_ARCHS:-90}" \
  -DFUSELET_FRAMEWORK="$framework" -DFUSELET_TESTS=ON -DFUSELET_PYTHON=ON \
  -DCUDAToolkit_ROOT="$toolkit" -DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc" -DPython_EXECUTABLE="$py" \
  -DCMAKE_CUDA_FLAGS="--resource-usage" >"$build.log" 2>&1 || { cat "$build.log"; exit 1; }
grep -E '^-- fuselet' "$build.log" || true
# The core's kernels compile every time (from the compiler cache when unchanged, which replays
# ptxas's report): their registers, shared memory and spills, for scripts/cuda_resources.py.
rm -f "$build"/csrc/core/CMakeFiles/fuselet.dir/src/cuda/*.o
"$cuda_venv/bin/cmake" --build "$build" | tee "$build-output.log"
log "cuda-build: compiled in $(( $(date +%s) - start )) s:"
find "$build" -name '*.so' -o -name 'test_norm_cuda' | sed "s|$ROOT/||"
# Each kernel's resources against the largest launch the emulated tests made of it (make
# emu-test records them; make check runs it first), into benchmarks/results.
launches="$ROOT/build/emu/launches.txt"
[[ -f "$launches" ]] || log "cuda-build: no $launches (make emu-test records the launches): resources without launches"
"$py" "$ROOT/scripts/cuda_resources.py" "$build-output.log" ${launches:+--launches "$launches"} \
  --out "$ROOT/benchmarks/results/cuda-resource-usage.md"
