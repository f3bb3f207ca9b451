#!/usr/bin/env bash
# The conda packages of variants/offline.yaml: seed the offline channel if needed, build every
# variant into output/ (skipping those already built), verify them, print the tables.
# Where no nvcc exists the CUDA variants are left out (said so). Extra arguments go to
# `fuselet-build build` (e.g. --select fuselet-torch).
source "$(dirname "$0")/env.sh"
compiler_cache
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
# How to install: with the user's conda or mamba where there is one, else with fuselet-build
# (py-rattler solves and installs: no conda needed).
channels="-c $ROOT/output -c $ROOT/build/offline-channel"
if command -v mamba >/dev/null; then
  log "install one: mamba install --override-channels $channels fuselet-torch"
elif command -v conda >/dev/null; then
  log "install one: conda install --override-channels $channels fuselet-torch"
elif command -v pixi >/dev/null; then
  log "install one: pixi add fuselet-torch, with $ROOT/output and $ROOT/build/offline-channel in your pixi.toml's channels"
else
  fb="$VENV/bin/fuselet-build"
  [[ -x "$fb" ]] || fb="$PY -m fuselet_build"
  log "install one (no conda, mamba or pixi on PATH): $fb env create ./fuselet-env fuselet-jax \"python 3.11.*\""
fi
exit "$status"
