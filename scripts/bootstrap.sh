#!/usr/bin/env bash
# Create a virtual environment from PyPI (skipped when already up to date):
#   scripts/bootstrap.sh [VENV [REQUIREMENTS]]   default: .venv with requirements/dev.txt
source "$(dirname "$0")/env.sh"
[[ -n "${FUSELET_NO_BOOTSTRAP:-}" ]] && exit 0
venv="${1:-$VENV}"
requirements="${2:-$ROOT/requirements/dev.txt}"
stamp="$venv/.fuselet-requirements"
# What the environment was made from: the requirements and the pyproject.toml of each local
# project they install (-e ./PATH, relative to the source tree).
made_from() {
  cat "$requirements"
  sed -n 's|^-e \./||p' "$requirements" | while read -r project; do cat "$ROOT/$project/pyproject.toml"; done
}
if [[ -x "$venv/bin/python" && -f "$stamp" ]] && cmp -s "$stamp" <(made_from); then
  exit 0
fi
log "creating $venv ($(basename "$requirements"))"
start=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
(cd "$ROOT" && "$venv/bin/python" -m pip install --quiet -r "$requirements")
made_from >"$stamp"
log "created $venv in $(( $(date +%s) - start )) s"
