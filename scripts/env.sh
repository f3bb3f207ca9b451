# Sourced by the other scripts: the project's paths and the .venv they use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Under pixi the active environment already holds everything: use it, bootstrap nothing.
if [[ -n "${PIXI_ENVIRONMENT_NAME:-}" && -n "${CONDA_PREFIX:-}" ]]; then
  VENV="$CONDA_PREFIX"
  export FUSELET_NO_BOOTSTRAP=1
else
  VENV="${FUSELET_VENV:-$ROOT/.venv}"
fi
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"
# Bytecode of the tests stays out of the tree; rattler's cache stays inside it.
export PYTHONDONTWRITEBYTECODE=1 FUSELET_ROOT="$ROOT"
export RATTLER_CACHE_DIR="${RATTLER_CACHE_DIR:-$ROOT/.rattler-cache}"
log() { printf '\033[1m==> %s\033[0m\n' "$*"; }
