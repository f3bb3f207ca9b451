#!/usr/bin/env bash
# Static checks: ruff over the Python code, shellcheck-free bash -n over the scripts.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
log "ruff"
"$PY" -m ruff check "$ROOT/python" "$ROOT/tools" "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/scripts" "$ROOT/backend" "$ROOT/docs"
log "bash -n scripts/*.sh"
for f in "$ROOT"/scripts/*.sh "$ROOT"/.ci/run; do bash -n "$f"; done
