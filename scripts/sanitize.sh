#!/usr/bin/env bash
# fuselet under the compilers' sanitizers, each build in a folder of its own; any report fails
# the run:
#   1. the core's C++ tests (ctest) under AddressSanitizer + UndefinedBehaviorSanitizer (every
#      kernel, every ISA copy the CPU runs, the C API's error paths);
#   1b. the core's CUDA kernels under fuselet's CUDA emulator (scripts/emu-test.sh's tests, one
#      thread order) under ASan + UBSan: a kernel's read or write outside its tensors or its
#      shared memory, or a misaligned vector access, is reported (a GPU's memcheck, on the CPU);
#   2. the same under ThreadSanitizer (the thread pool: concurrent callers, a resize while they
#      run, fork after use: tests/core/test_parallel.cc);
#   3. against an ASan + UBSan build of all three libraries, in .venv's own (uninstrumented)
#      python: the C ABI's tests, every bad input of every entry point (tests/bad_input/),
#      and the layer smoke of both layers (-m smoke, tests/conftest.py SMOKE_TESTS: each op's
#      schema, numerics, bad input, compile / jit / vmap), over both cores;
#   4. libFuzzer over the C ABI, 100000 inputs from a fixed seed under ASan + UBSan, after its regression inputs
#      (scripts/fuzz.sh: clang, tests/fuzz/).
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which installs sccache
mkdir -p "$ROOT/build"
run() {  # run NAME FLAGS...: configure, build and ctest the core with FLAGS (and RUN_CMAKE / RUN_CTEST's arguments)
  local name=$1; shift
  local build="$ROOT/build/$name" flags="$* -fno-omit-frame-pointer -g"
  log "sanitize: $name ($*) in $build"
  cmake -S "$ROOT" -B "$build" -G Ninja "${LAUNCHER_ARGS[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSELET_FRAMEWORK=none \
    -DFUSELET_TESTS=ON -DFUSELET_PYTHON=OFF -DPython_EXECUTABLE="$PY" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$*" -DCMAKE_SHARED_LINKER_FLAGS="$*" "${RUN_CMAKE[@]}" >"$build.log" 2>&1 ||
    { cat "$build.log"; exit 1; }
  cmake --build "$build"
  ctest --test-dir "$build" --output-on-failure "${RUN_CTEST[@]}"
}
RUN_CMAKE=() RUN_CTEST=()
start=$(date +%s)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
asan="-fsanitize=address,undefined -fno-sanitize-recover=all"
run asan $asan
RUN_CMAKE=(-DFUSELET_CUDA_EMU=ON -DFUSELET_EMU_ORDERS=forward) RUN_CTEST=(-R '^emu\.' -j "$(nproc)")
run asan-emu $asan
RUN_CMAKE=() RUN_CTEST=()
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
run tsan -fsanitize=thread

# 3. The layers. python is not instrumented: the ASan runtime is preloaded, and libstdc++ with
# it, for ASan's __cxa_throw interceptor finds the real one only if it is loaded at start (else
# fuselet's C++ errors, thrown through torch's dispatcher, abort the process). Leaks are not
# checked: CPython, torch and XLA keep their allocations until exit by design.
flags="$asan -fno-omit-frame-pointer -g"
target="$ROOT/build/asan-py"
log "sanitize: the torch and JAX layers, fuselet built with $flags into $target"
rm -rf "$target"
SKBUILD_BUILD_DIR="$ROOT/build/asan-layers" SKBUILD_CMAKE_BUILD_TYPE=RelWithDebInfo \
  CMAKE_ARGS="$LAUNCHER_CMAKE_ARGS-DCMAKE_C_FLAGS='$flags' -DCMAKE_CXX_FLAGS='$flags' -DCMAKE_SHARED_LINKER_FLAGS='$asan'" \
  "$PY" -m pip install --quiet --no-build-isolation --no-deps --target "$target" "$ROOT"
# Reports go to files (pytest's capture would swallow them with the aborted process), from the
# test processes and the subprocesses they start alike; any file fails the run.
preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
reports="$ROOT/build/asan-layers-reports"
rm -rf "$reports" && mkdir -p "$reports"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$reports/asan"
export UBSAN_OPTIONS="$UBSAN_OPTIONS:log_path=$reports/ubsan"
rc=0
sanitized() {
  (cd "$ROOT/build" && LD_PRELOAD="$preload" PYTHONPATH="$target" FUSELET_SANITIZED="$target" \
    "$PY" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -n "$(nproc)" "$@")
}
sanitized "$ROOT/tests/test_c_abi.py" "$ROOT/tests/bad_input" "$ROOT/tests/test_cpu_isa.py" || rc=$?
sanitized -m "smoke and not processes" "$ROOT/tests/torch" "$ROOT/tests/jax" || rc=$?
if compgen -G "$reports/*" >/dev/null; then
  for report in "$reports"/*; do log "sanitize: $report"; head -n 40 "$report"; done
  exit 1
fi
[[ $rc -eq 0 ]] || exit "$rc"
"$ROOT/scripts/fuzz.sh"
log "sanitize: no reports ($(( $(date +%s) - start )) s)"
