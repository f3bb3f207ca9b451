#!/usr/bin/env bash
# The core's CUDA kernels run on this CPU under fuselet's CUDA emulator (csrc/emu), on any
# machine: no GPU, no nvcc (the CUDA headers come from .venv's nvidia-cuda-* wheels).
#   scripts/emu-test.sh [CTEST ARGS]   (make emu-test; make check runs it)
#       the core built with FUSELET_CUDA_EMU=ON (build/emu); the emulator's own tests
#       (tests/emu/test_simt.cc); the core's CUDA tests (tests/core/test_*_cuda.cc), each in two
#       thread orders, forward and seeded random (with the grid capped at 5 blocks, so that the
#       rows are grid-strided), that must give bit-identical outputs
#       (tests/emu/orders.cmake), with no emulator report (a barrier not every thread reaches,
#       a bad shuffle mask, shared memory or a launch beyond CUDA's limits) allowed.
#   scripts/emu-test.sh --coverage     (make test runs it)
#       the same tests, in the forward order, against a build with gcov counters on the
#       kernels compiled without optimization (build/emu-coverage, so that every line counts
#       exactly); then their line coverage must be at least 95 %, every line no test runs named
#       with its reason in tests/emu/uncovered.txt (scripts/emu_coverage.py), and the table
#       goes to benchmarks/results/emu-coverage.md.
# Extra arguments go to ctest (-R norm: the norm tests only).
source "$(dirname "$0")/env.sh"
coverage=""
if [[ "${1:-}" == --coverage ]]; then coverage=1; shift; fi
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which installs sccache
build="$ROOT/build/emu${coverage:+-coverage}"
orders="forward,random:7@5"
[[ -z "$coverage" ]] || orders="forward"
mkdir -p "$ROOT/build"
start=$(date +%s)
log "emu-test: the CUDA kernels under the emulator${coverage:+, with their line coverage} ($build)"
cmake -S "$ROOT" -B "$build" -G Ninja "${LAUNCHER_ARGS[@]}" -DFUSELET_FRAMEWORK=none -DFUSELET_TESTS=ON -DFUSELET_PYTHON=OFF \
  -DFUSELET_CUDA_EMU=ON -DFUSELET_CUDA_EMU_COVERAGE="${coverage:-0}" -DFUSELET_EMU_ORDERS="$orders" \
  -DPython_EXECUTABLE="$PY" >"$build.log" 2>&1 || { cat "$build.log"; exit 1; }
cmake --build "$build"
if [[ -n "$coverage" ]]; then find "$build" -name '*.gcda' -delete; fi   # this run's counts only
# Every kernel's largest launch (scripts/cuda_resources.py, in make cuda-build, reads them).
rm -f "$build/launches.txt"
export FUSELET_EMU_LAUNCHES="$build/launches.txt"
ctest --test-dir "$build" -R '^emu\.' -j "$(nproc)" --output-on-failure "$@"
if [[ -n "$coverage" ]]; then
  "$PY" "$ROOT/scripts/emu_coverage.py" "$build" --out "$ROOT/benchmarks/results/emu-coverage.md"
fi
log "emu-test: passed in $(( $(date +%s) - start )) s"
