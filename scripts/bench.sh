#!/usr/bin/env bash
# Build fuselet into .venv, then run every benchmark of benchmarks/ (arguments pass through).
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
for bench in "$ROOT"/benchmarks/bench_*.py; do
  log "$(basename "$bench") $*"
  "$PY" "$bench" "$@"
done
