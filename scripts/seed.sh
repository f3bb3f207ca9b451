#!/usr/bin/env bash
# The offline conda channel (build/offline-channel): `fuselet-build seed`, without the CUDA
# packages where no nvcc exists (said so). A second run with nothing changed does nothing.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh" >&2
seed_args=()
if ! command -v nvcc >/dev/null; then
  log "seed: no nvcc on PATH: the CUDA packages are left out"
  seed_args=(--no-cuda)
fi
start=$(date +%s)
"$PY" -m fuselet_build seed "${seed_args[@]}" "$@"
log "seeded in $(( $(date +%s) - start )) s"
