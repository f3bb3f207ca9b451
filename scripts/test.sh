#!/usr/bin/env bash
# The whole test suite: core C++ tests, CUDA compile check, the conda packages of
# variants/offline.yaml (seeded, built, verified: scripts/packages.sh), then pytest against
# the fuselet built into .venv and those packages: the library's tests and the configuration
# checks (tests/, beside the package build) and the packaging tool's (tools/fuselet-build/tests,
# after it); last, the torch tests against one stable-ABI build under two torch releases
# (scripts/stable-abi-test.sh). Extra arguments go to one pytest run over what they name, after the packages.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which may have just installed sccache
# What the compiler cache (scripts/env.sh) served this run: printed at the end.
[[ -z "$FUSELET_COMPILER_LAUNCHER" ]] || "$FUSELET_COMPILER_LAUNCHER" --zero-stats >/dev/null 2>&1 || true
# The seed of the offline channel (downloads, disk, ~5 min cold) runs beside the compiles
# below, which keep the CPUs busy; scripts/packages.sh then finds it done.
mkdir -p "$ROOT/build"
seed_log="$ROOT/build/seed.log"
log "seed: started beside the builds (log: $seed_log)"
"$ROOT/scripts/seed.sh" >"$seed_log" 2>&1 &
seed_pid=$!
# (background jobs of a script ignore SIGINT: stop them with SIGTERM if this script fails)
trap 'pkill -TERM -P "$seed_pid" 2>/dev/null; kill "$seed_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
"$ROOT/scripts/build.sh"
"$ROOT/scripts/core-test.sh"
# The torch CUDA impls are compiled by the package build (fuselet-torch cuda130) below.
FUSELET_CUDA_FRAMEWORK=jax "$ROOT/scripts/cuda-build.sh"
if ! wait "$seed_pid"; then
  tail -n 40 "$seed_log"
  log "seed failed (log: $seed_log)"
  exit 1
fi
trap - EXIT
grep -E '^seeded |==> seeded' "$seed_log" || true
# What .venv must import (requirements/dev.txt): a broken one fails the run, never skips it.
export FUSELET_REQUIRE_IMPORTS="${FUSELET_REQUIRE_IMPORTS-torch jax jaxlib fuselet_build.cli jsonschema check_jsonschema hypothesis yaml transformers onnx onnxscript onnxruntime flax optax}"
pytest=("$PY" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider)
cd "$ROOT"
if [[ $# -gt 0 ]]; then
  # arguments for pytest: one run, after the packages
  FUSELET_DEV_BUILT=1 FUSELET_PACKAGES_VERIFY=0 "$ROOT/scripts/packages.sh"
  log "pytest $*"
  FUSELET_OFFLINE_CHANNEL="$ROOT/build/offline-channel" "${pytest[@]}" "$@"
  exit
fi
# The library's tests and the configuration checks (tests/) need no conda package: they run
# beside the package build, which keeps about one of the CPUs busy; the packaging tool's tests
# (tools/fuselet-build/tests) use its packages and channel, so they run after it.
tests_log="$ROOT/build/pytest-tests.log"
log "pytest tests/: started beside the package build (log: $tests_log)"
"${pytest[@]}" tests >"$tests_log" 2>&1 &
tests_pid=$!
trap 'kill "$tests_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
# pytest's test_verify_passes verifies the packages (and what verify must refuse).
FUSELET_DEV_BUILT=1 FUSELET_PACKAGES_VERIFY=0 "$ROOT/scripts/packages.sh"
tests_status=0
wait "$tests_pid" || tests_status=$?
trap - EXIT
log "pytest tests/ (ran beside the package build)"
cat "$tests_log"
log "pytest tools/fuselet-build/tests"
# The packaging tests reuse the channel and packages made above (their own seed/build are no-ops).
tools_status=0
FUSELET_OFFLINE_CHANNEL="$ROOT/build/offline-channel" "${pytest[@]}" tools/fuselet-build/tests || tools_status=$?
# One stable-ABI build of the torch layer, its torch tests under two torch releases.
stable_status=0
"$ROOT/scripts/stable-abi-test.sh" || stable_status=$?
if [[ -n "$FUSELET_COMPILER_LAUNCHER" ]]; then
  log "compiler cache ($SCCACHE_DIR):"
  "$FUSELET_COMPILER_LAUNCHER" --show-stats 2>/dev/null | grep -E '^(Compile requests|Cache hits|Cache misses|Cache hits rate) ' || true
fi
if (( tests_status || tools_status || stable_status )); then
  log "pytest failed: tests/ exit $tests_status, tools/fuselet-build/tests exit $tools_status, stable ABI exit $stable_status"
  exit 1
fi
