#!/usr/bin/env bash
# Build fuselet into .venv, then run every benchmark of benchmarks/ (arguments pass through).
# The peers that .venv lacks (requirements/bench.txt: Liger-Kernel) are installed from their lock
# (exact versions, every file checked against its hash, no dependencies) into build/bench-site,
# again whenever the lock changes, and put on the benchmarks' PYTHONPATH only; where they cannot
# be installed (no index), the benchmarks leave their columns out.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
site="$ROOT/build/bench-site" lock="$ROOT/requirements/bench.lock"
if ! cmp -s "$lock" "$site/.fuselet-lock"; then
  log "bench peers: $(basename "$lock") -> build/bench-site"
  rm -rf "$site"
  # (pip warns once per package about an index folder of the machine's pip config that lacks it)
  if "$PY" -m pip install --quiet --no-deps --require-hashes --target "$site" -r "$lock" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true); then
    cp "$lock" "$site/.fuselet-lock"
  else
    log "bench peers: not installed (pip failed above): their columns are left out"
  fi
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
for bench in "$ROOT"/benchmarks/bench_*.py; do
  log "$(basename "$bench") $*"
  "$PY" "$bench" "$@"
done
