# Sourced by the other scripts: the project's paths and the .venv they use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FUSELET_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"
# Bytecode of the tests stays out of the tree; rattler's cache stays inside it.
export PYTHONDONTWRITEBYTECODE=1
export RATTLER_CACHE_DIR="${RATTLER_CACHE_DIR:-$ROOT/.rattler-cache}"
log() { printf '\033[1m==> %s\033[0m\n' "$*"; }
