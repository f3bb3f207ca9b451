#!/usr/bin/env bash
# The quick tier: lint, the core's C++ tests, the core's CUDA kernels under the CUDA emulator
# (scripts/emu-test.sh), and the library tests of both layers (tests/, at the CPU's own
# instruction set) over both cores, against fuselet built into .venv. No conda
# package, no pip build of a wheel, no other venv: what to run before every commit.
# Tests marked processes or builds (tests/conftest.py) are make test's. Extra arguments go to pytest.
# FUSELET_VENV / FUSELET_REQUIREMENTS / FUSELET_UNLOCKED choose the environment (scripts/env.sh;
# scripts/test-latest.sh runs this script in .venv-latest).
source "$(dirname "$0")/env.sh"
start=$(date +%s)
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which may have just installed sccache
"$ROOT/scripts/lint.sh"
"$ROOT/scripts/build.sh"
"$ROOT/scripts/core-test.sh"
"$ROOT/scripts/emu-test.sh"
export FUSELET_REQUIRE_IMPORTS="${FUSELET_REQUIRE_IMPORTS-$DEV_IMPORTS}"
log "pytest tests/ -m 'not processes and not builds' over $(nproc) workers"
(cd "$ROOT" && "$PY" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -n "${FUSELET_TEST_WORKERS:-$(nproc)}" \
  -m "not processes and not builds" tests "$@")
log "check: passed in $(( $(date +%s) - start )) s"
