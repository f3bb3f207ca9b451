#!/usr/bin/env bash
# The conda packages of variants/offline.yaml: seed the offline channel if needed, build every
# variant into output/ (skipping those already built), verify them, print the tables.
# Where no nvcc exists the CUDA variants are left out (said so). Extra arguments go to
# `fuselet-build build` (e.g. --select fuselet-torch).
source "$(dirname "$0")/env.sh"
# (scripts/test.sh has built fuselet already and runs tests against it meanwhile: a second
# install would replace the files under them)
[[ -n "${FUSELET_DEV_BUILT:-}" ]] || "$ROOT/scripts/build.sh" >&2
select=()
if ! command -v nvcc >/dev/null; then
  log "packages: no nvcc on PATH: the CUDA variants are left out (CPU packages only)"
  select=(--select=-cpu_ --select=-pyh)
fi
"$ROOT/scripts/seed.sh"
start=$(date +%s)
status=0
"$PY" -m fuselet_build build "${select[@]}" "$@" || status=$?
log "built in $(( $(date +%s) - start )) s"
if [[ "${FUSELET_PACKAGES_VERIFY:-1}" != 0 ]]; then
  start=$(date +%s)
  "$PY" -m fuselet_build verify "${select[@]}" || status=$?
  log "verified in $(( $(date +%s) - start )) s"
fi
log "install one: conda install -c $ROOT/output -c $ROOT/build/offline-channel fuselet-torch"
exit "$status"
