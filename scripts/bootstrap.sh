#!/usr/bin/env bash
# Create a virtual environment from PyPI (skipped when already up to date):
#   scripts/bootstrap.sh [VENV [REQUIREMENTS]]   default: $FUSELET_VENV (.venv) with $FUSELET_REQUIREMENTS
#                                                (requirements/dev.txt)
# Where REQUIREMENTS has a lock beside it (requirements/NAME.lock, scripts/lock.sh), the lock is
# what gets installed: exact versions, every file checked against its hash, no dependency
# resolved here; the local projects it names (-e ./PATH) are installed after it, without theirs
# (the lock holds them). FUSELET_UNLOCKED=1 installs the requirements file itself instead, at the
# newest releases it allows (scripts/test-latest.sh).
source "$(dirname "$0")/env.sh"
[[ -n "${FUSELET_NO_BOOTSTRAP:-}" ]] && exit 0
# pip warns once per package about an index folder of the machine's pip config that lacks it
quiet_index() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }
venv="${1:-$VENV}"
requirements="${2:-${FUSELET_REQUIREMENTS:-$ROOT/requirements/dev.txt}}"
lock="${requirements%.txt}.lock"
[[ -f "$lock" && -z "${FUSELET_UNLOCKED:-}" ]] || lock=""
stamp="$venv/.fuselet-requirements"
# What the environment was made from: the requirements (or their lock) and the pyproject.toml of
# each local project they install (-e ./PATH, relative to the source tree).
made_from() {
  cat "$requirements" ${lock:+"$lock"}
  echo "unlocked=${FUSELET_UNLOCKED:-}"
  sed -n 's|^-e \./||p' "$requirements" | while read -r project; do cat "$ROOT/$project/pyproject.toml"; done
}
if [[ -x "$venv/bin/python" && -f "$stamp" ]] && cmp -s "$stamp" <(made_from); then
  exit 0
fi
log "creating $venv (${lock:+the lock }$(basename "${lock:-$requirements}"))"
start=$(date +%s)
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip 2> >(quiet_index)
if [[ -n "$lock" ]]; then
  (cd "$ROOT" && "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r <(grep -v '^-e ' "$lock") 2> >(quiet_index))
  sed -n 's|^-e \./||p' "$requirements" | while read -r project; do
    (cd "$ROOT" && "$venv/bin/python" -m pip install --quiet --no-deps -e "./$project" 2> >(quiet_index))
  done
  "$venv/bin/python" -m pip check >/dev/null || { "$venv/bin/python" -m pip check; log "$lock: inconsistent (make lock)"; exit 1; }
else
  (cd "$ROOT" && "$venv/bin/python" -m pip install --quiet --upgrade -r "$requirements" 2> >(quiet_index))
fi
made_from >"$stamp"
log "created $venv in $(( $(date +%s) - start )) s"
