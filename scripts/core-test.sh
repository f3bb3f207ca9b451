#!/usr/bin/env bash
# The core alone: configure with no framework, build, run the C++ tests (ctest), install
# to a prefix and build a tiny C++ consumer with find_package(fuselet).
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which installs sccache
build="$ROOT/build/core"
mkdir -p "$ROOT/build"   # the configure log lies beside the build folder
log "core: build + ctest ($build)"
cmake -S "$ROOT" -B "$build" -G Ninja "${LAUNCHER_ARGS[@]}" -DFUSELET_FRAMEWORK=none -DFUSELET_TESTS=ON -DFUSELET_PYTHON=OFF \
  -DCMAKE_INSTALL_PREFIX="$build/prefix" -DPython_EXECUTABLE="$PY" >"$build.log" 2>&1 || { cat "$build.log"; exit 1; }
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
cmake --install "$build" >/dev/null
log "core: find_package(fuselet) from an installed prefix"
cmake -S "$ROOT/tests/core/consumer" -B "$build/consumer" -G Ninja "${LAUNCHER_ARGS[@]}" -DCMAKE_PREFIX_PATH="$build/prefix" >/dev/null
cmake --build "$build/consumer" >/dev/null
"$build/consumer/consumer"
