#!/usr/bin/env bash
# The README's test command, what a user's install depends on: make check (lint, the core's C++
# tests, its CUDA kernels under the emulator, the library tests over both cores: scripts/check.sh)
# beside the seed of the offline channel; the CUDA compile check; then the conda packages of
# variants/offline.yaml (seeded, built, verified: scripts/packages.sh) beside the tests that start processes or build wheels
# (tests/ -m "processes or builds": distributed, multi-process, export across processes, pip
# builds, the zoo's sample); last the packaging tool's tests (tools/fuselet-build/tests, on those packages) beside
# the stable-ABI build's smoke under two torch releases and the oldest transformers
# (scripts/stable-abi-test.sh). Extra arguments go to one pytest run over what they name, after
# the packages. The nightly workflow runs what this leaves out: the whole zoo (make zoo) and the
# CUDA kernels' line coverage under the emulator (make emu-test ARGS=--coverage).
source "$(dirname "$0")/env.sh"
use_build_tmp
start_all=$(date +%s)
"$ROOT/scripts/bootstrap.sh"
compiler_cache   # after bootstrap, which may have just installed sccache
# What the compiler cache (scripts/env.sh) served this run: printed at the end.
[[ -z "$FUSELET_COMPILER_LAUNCHER" ]] || "$FUSELET_COMPILER_LAUNCHER" --zero-stats >/dev/null 2>&1 || true
# The seed of the offline channel (downloads, disk, ~5 min cold) runs beside make check, which
# keeps the CPUs busy; scripts/packages.sh then finds it done.
mkdir -p "$ROOT/build"
seed_log="$ROOT/build/seed.log"
log "seed: started beside make check (log: $seed_log)"
"$ROOT/scripts/seed.sh" >"$seed_log" 2>&1 &
seed_pid=$!
# (background jobs of a script ignore SIGINT: stop them with SIGTERM if this script fails)
trap 'pkill -TERM -P "$seed_pid" 2>/dev/null; kill "$seed_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
"$ROOT/scripts/check.sh"
# The torch CUDA impls are compiled by the package build (fuselet-torch cuda130) below.
FUSELET_CUDA_FRAMEWORK=jax "$ROOT/scripts/cuda-build.sh"
if ! wait "$seed_pid"; then
  tail -n 40 "$seed_log"
  log "seed failed (log: $seed_log)"
  exit 1
fi
trap - EXIT
grep -E '^seeded |==> seeded' "$seed_log" || true
export FUSELET_REQUIRE_IMPORTS="${FUSELET_REQUIRE_IMPORTS-$DEV_IMPORTS}"
pytest=("$PY" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider)
cd "$ROOT"
if [[ $# -gt 0 ]]; then
  # arguments for pytest: one run, after the packages
  FUSELET_DEV_BUILT=1 FUSELET_PACKAGES_VERIFY=0 "$ROOT/scripts/packages.sh"
  log "pytest $*"
  FUSELET_OFFLINE_CHANNEL="$ROOT/build/offline-channel" "${pytest[@]}" "$@"
  exit
fi
# The tests that start processes or build wheels need no conda package: they run beside the
# package build, which keeps about one of the CPUs busy.
tests_log="$ROOT/build/pytest-processes.log"
log "pytest tests/ -m 'processes or builds': started beside the package build (log: $tests_log)"
"${pytest[@]}" -q --basetemp "$TMPDIR/processes" -m "processes or builds" tests >"$tests_log" 2>&1 &
tests_pid=$!
trap 'kill "$tests_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
# pytest's test_verify_passes verifies the packages (and what verify must refuse).
FUSELET_DEV_BUILT=1 FUSELET_PACKAGES_VERIFY=0 "$ROOT/scripts/packages.sh"
tests_status=0
wait "$tests_pid" || tests_status=$?
trap - EXIT
log "pytest tests/ -m 'processes or builds' (ran beside the package build)"
cat "$tests_log"
# The packaging tests reuse the channel and packages made above (their own seed/build are no-ops,
# mostly solves, installs and single-threaded checks): beside the stable-ABI build of the torch
# layer and its smoke under two torch releases, which compiles.
tools_log="$ROOT/build/pytest-tools.log"
log "pytest tools/fuselet-build/tests: started beside the stable-ABI step (log: $tools_log)"
FUSELET_OFFLINE_CHANNEL="$ROOT/build/offline-channel" "${pytest[@]}" -q --basetemp "$TMPDIR/tools" tools/fuselet-build/tests \
  >"$tools_log" 2>&1 &
tools_pid=$!
trap 'kill "$tools_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
stable_status=0 stable_log="$ROOT/build/stable-abi.log"
"$ROOT/scripts/stable-abi-test.sh" 2>&1 | tee "$stable_log" || stable_status=$?
tools_status=0
wait "$tools_pid" || tools_status=$?
trap - EXIT
log "pytest tools/fuselet-build/tests (ran beside the stable-ABI step)"
cat "$tools_log"
if [[ -n "$FUSELET_COMPILER_LAUNCHER" ]]; then
  log "compiler cache ($SCCACHE_DIR):"
  "$FUSELET_COMPILER_LAUNCHER" --show-stats 2>/dev/null | grep -E '^(Compile requests|Cache hits|Cache misses|Cache hits rate) +[0-9]' || true
fi
if (( tests_status || tools_status || stable_status )); then
  # what failed, last: a CI log is read from its end
  for part in "$tests_log" "$tools_log" "$stable_log"; do
    if grep -qE '^(FAILED|ERROR) |failed' "$part" 2>/dev/null; then
      log "failures in $(basename "$part"):"
      grep -hE '^(FAILED|ERROR) |^=+ .*(failed|error)|==> .*failed' "$part" | tail -n 25
    fi
  done
  log "pytest failed: tests/ -m 'processes or builds' exit $tests_status, tools/fuselet-build/tests exit $tools_status, stable ABI exit $stable_status"
  exit 1
fi
log "test: passed in $(( $(date +%s) - start_all )) s"
