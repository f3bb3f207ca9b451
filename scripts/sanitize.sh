#!/usr/bin/env bash
# The core's C++ tests (ctest) under the compilers' sanitizers, each in a build folder of its
# own: AddressSanitizer + UndefinedBehaviorSanitizer (every kernel, every ISA copy the CPU
# runs, the C API's error paths), then ThreadSanitizer (the thread pool: concurrent callers, a
# resize while they run, fork after use: tests/core/test_parallel.cc). Any report fails the run.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
mkdir -p "$ROOT/build"
run() {  # run NAME FLAGS...: configure, build and ctest the core with FLAGS
  local name=$1; shift
  local build="$ROOT/build/$name" flags="$* -fno-omit-frame-pointer -g"
  log "sanitize: $name ($*) in $build"
  cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSELET_FRAMEWORK=none \
    -DFUSELET_TESTS=ON -DFUSELET_PYTHON=OFF -DPython_EXECUTABLE="$PY" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$*" -DCMAKE_SHARED_LINKER_FLAGS="$*" >"$build.log" 2>&1 || { cat "$build.log"; exit 1; }
  cmake --build "$build"
  ctest --test-dir "$build" --output-on-failure
}
start=$(date +%s)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
run asan -fsanitize=address,undefined -fno-sanitize-recover=all
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
run tsan -fsanitize=thread
log "sanitize: no reports ($(( $(date +%s) - start )) s)"
