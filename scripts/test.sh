#!/usr/bin/env bash
# The README's test command, what a user's install depends on: make check (lint, the core's C++
# tests, its CUDA kernels under the emulator, the library tests over both cores: scripts/check.sh)
# beside the seed of the offline channel; then two lanes side by side, each about one CPU's work:
#   - the conda packages of variants/offline.yaml (seeded, built, verified: scripts/packages.sh),
#     then the packaging tool's tests on them (tools/fuselet-build/tests);
#   - the tests that start processes or build wheels (tests/ -m "processes or builds":
#     distributed, multi-process, export across processes, pip builds, the zoo's sample), then
#     the CUDA compile check (scripts/cuda-build.sh), then the stable-ABI build's smoke under two
#     torch releases and the oldest transformers (scripts/stable-abi-test.sh).
# FUSELET_FREE_DISK=1 (.ci/run: a fresh clone, on a disk it shares) runs the stable-ABI step after
# both lanes instead, once the packages' environments (.rattler-cache, ~11 GB) are removed: its
# two torch 2.14.1 trees (~5.5 GB each, one after the other) then never lie beside them, and the
# run's peak is the packaging tests' (14.7 GB above the clone's start, measured with the seed and
# compiler caches warm; docs/development.md).
# Extra arguments go to one pytest run over what they name, after the packages. The nightly
# workflow runs what this leaves out: the whole zoo (make zoo) and the CUDA kernels' line
# coverage under the emulator (make emu-test ARGS=--coverage).
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
# Lane 2, in the background: the tests that start processes or build wheels (they need no conda
# package), the CUDA compile check (the torch CUDA impls are compiled by the package build,
# fuselet-torch cuda130, in lane 1), the stable-ABI step. Each part's exit status goes to a file.
tests_log="$ROOT/build/pytest-processes.log" cuda_log="$ROOT/build/cuda-build.log"
stable_log="$ROOT/build/stable-abi.log" lane2="$ROOT/build/lane2"
rm -rf "$lane2" && mkdir -p "$lane2"
part() {  # part NAME LOG COMMAND...: run it, its exit status and seconds to $lane2/NAME
  local name=$1 out=$2 status=0 t0
  shift 2
  t0=$(date +%s)
  "$@" >"$out" 2>&1 || status=$?
  echo "$status $(( $(date +%s) - t0 ))" >"$lane2/$name"
}
log "lane 2 (beside the package build): pytest tests/ -m 'processes or builds' ($tests_log), the CUDA compile check ($cuda_log), the stable-ABI step ($stable_log)"
(
  part tests "$tests_log" "${pytest[@]}" -q --basetemp "$TMPDIR/processes" -m "processes or builds" tests
  part cuda "$cuda_log" env FUSELET_CUDA_FRAMEWORK=jax "$ROOT/scripts/cuda-build.sh"
  [[ -n "${FUSELET_FREE_DISK:-}" ]] || part stable "$stable_log" "$ROOT/scripts/stable-abi-test.sh"
) &
lane2_pid=$!
trap 'pkill -TERM -P "$lane2_pid" 2>/dev/null; kill "$lane2_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
# Lane 1: the packages (pytest's test_verify_passes verifies them, and what verify must refuse),
# then the packaging tests, which reuse the channel and packages made here (their own seed and
# build are no-ops: mostly solves, installs and single-threaded checks).
packages_status=0 t0=$(date +%s)
FUSELET_DEV_BUILT=1 FUSELET_PACKAGES_VERIFY=0 "$ROOT/scripts/packages.sh" || packages_status=$?
packages_seconds=$(( $(date +%s) - t0 ))
tools_log="$ROOT/build/pytest-tools.log"
tools_status=0 tools_seconds=0 t0=$(date +%s)
if (( packages_status == 0 )); then
  log "pytest tools/fuselet-build/tests (log: $tools_log)"
  FUSELET_OFFLINE_CHANNEL="$ROOT/build/offline-channel" "${pytest[@]}" -q --basetemp "$TMPDIR/tools" tools/fuselet-build/tests \
    >"$tools_log" 2>&1 || tools_status=$?
  tools_seconds=$(( $(date +%s) - t0 ))
  cat "$tools_log"
fi
log "waiting for lane 2"
wait "$lane2_pid" || true
trap - EXIT
if [[ -n "${FUSELET_FREE_DISK:-}" ]]; then
  # A small disk: the packages' environments (.rattler-cache, ~11 GB) are removed before the
  # stable-ABI step makes its own (~5 GB), which then runs alone.
  log "FUSELET_FREE_DISK: removing .rattler-cache and the packaging tests' folders; then the stable-ABI step ($stable_log)"
  rm -rf "$RATTLER_CACHE_DIR" "$TMPDIR/tools"
  part stable "$stable_log" "$ROOT/scripts/stable-abi-test.sh"
fi
read_part() { cat "$lane2/$1" 2>/dev/null || echo "1 -"; }  # "STATUS SECONDS"; 1 where it did not finish
read -r tests_status tests_seconds < <(read_part tests)
read -r cuda_status cuda_seconds < <(read_part cuda)
read -r stable_status stable_seconds < <(read_part stable)
log "pytest tests/ -m 'processes or builds' (lane 2)"
cat "$tests_log"
log "the CUDA compile check (lane 2)"
cat "$cuda_log"
log "the stable-ABI step (lane 2)"
cat "$stable_log"
log "lane 1: packages ${packages_seconds} s, tools/fuselet-build/tests ${tools_seconds} s; lane 2: processes ${tests_seconds} s, CUDA compile check ${cuda_seconds} s, stable ABI ${stable_seconds} s"
if [[ -n "$FUSELET_COMPILER_LAUNCHER" ]]; then
  log "compiler cache ($SCCACHE_DIR):"
  "$FUSELET_COMPILER_LAUNCHER" --show-stats 2>/dev/null | grep -E '^(Compile requests|Cache hits|Cache misses|Cache hits rate) +[0-9]' || true
fi
if [[ "$packages_status $tests_status $cuda_status $tools_status $stable_status" != "0 0 0 0 0" ]]; then
  # what failed, last: a CI log is read from its end
  for part in "$tests_log" "$cuda_log" "$tools_log" "$stable_log"; do
    if grep -qE '^(FAILED|ERROR) |failed' "$part" 2>/dev/null; then
      log "failures in $(basename "$part"):"
      grep -hE '^(FAILED|ERROR) |^=+ .*(failed|error)|==> .*failed' "$part" | tail -n 25
    fi
  done
  log "failed: packages exit $packages_status, tests/ -m 'processes or builds' exit $tests_status, the CUDA compile check exit $cuda_status, tools/fuselet-build/tests exit $tools_status (not run when the packages failed), stable ABI exit $stable_status"
  exit 1
fi
log "test: passed in $(( $(date +%s) - start_all )) s"
