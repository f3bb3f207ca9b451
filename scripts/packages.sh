#!/usr/bin/env bash
# The conda packages of variants/offline.yaml: seed the offline channel if needed, build every
# variant into output/ (skipping those already built), verify them, print the tables.
# Extra arguments go to `fuselet-build build` (e.g. --select fuselet-torch).
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh" >&2
start=$(date +%s)
"$PY" -m fuselet_build seed
log "seeded in $(( $(date +%s) - start )) s"
start=$(date +%s)
status=0
"$PY" -m fuselet_build build "$@" || status=$?
log "built in $(( $(date +%s) - start )) s"
start=$(date +%s)
"$PY" -m fuselet_build verify || status=$?
log "verified in $(( $(date +%s) - start )) s"
log "install one: conda install -c $ROOT/output -c $ROOT/build/offline-channel fuselet-torch"
exit "$status"
