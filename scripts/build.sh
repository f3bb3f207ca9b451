#!/usr/bin/env bash
# Build fuselet against the frameworks in .venv and install it there (incremental:
# CMake keeps its build folder under build/). FUSELET_FRAMEWORK / FUSELET_CUDA pass through.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which installs sccache
log "building fuselet (FUSELET_FRAMEWORK=${FUSELET_FRAMEWORK:-auto}, FUSELET_CUDA=${FUSELET_CUDA:-OFF})"
start=$(date +%s)
SKBUILD_BUILD_DIR="$ROOT/build/dev${FUSELET_VENV:+-$(basename "$VENV")}" CMAKE_ARGS="$LAUNCHER_CMAKE_ARGS${CMAKE_ARGS:-}" "$PY" -m pip install --quiet --no-build-isolation --no-deps "$ROOT"
log "built and installed in $(( $(date +%s) - start )) s"
