#!/usr/bin/env bash
# The whole test suite: core C++ tests, CUDA compile check, then pytest against the
# fuselet built into .venv. Extra arguments go to pytest.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
"$ROOT/scripts/core-test.sh"
"$ROOT/scripts/cuda-build.sh"
log "pytest"
cd "$ROOT"
"$PY" -m pytest tests -p no:cacheprovider "$@"
