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
# What .venv must import (requirements/dev.txt): make check and make test export it as
# FUSELET_REQUIRE_IMPORTS, so that a broken environment fails the run instead of skipping tests.
DEV_IMPORTS="torch jax jaxlib fuselet_build.cli jsonschema check_jsonschema hypothesis yaml transformers trl kernels onnx onnxscript onnxruntime flax optax"
log() { printf '\033[1m==> %s\033[0m\n' "$*"; }
# Temporary files of the heavy steps under build/tmp, on the clone's own disk, never /tmp (often a
# small tmpfs, and another file system than the package cache, so conda environments there are
# copies, not links): make test's tmp_path folders hold conda environments (about 9 GB at once),
# and each isolated pip build installs torch with its CUDA libraries (about 6 GB).
use_build_tmp() {
  export TMPDIR="$ROOT/build/tmp"
  mkdir -p "$TMPDIR"
}
# The per-user cache, shared by every clone: the seed's downloads and packages
# (fuselet-build seed: <cache>/seed) and the compiler cache (<cache>/sccache/<tree>).
# (XDG: an unset, empty or relative XDG_CACHE_HOME means ~/.cache; ~ is the passwd entry's where
# HOME is unset.)
if [[ -z "${FUSELET_CACHE_DIR:-}" ]]; then
  if [[ "${XDG_CACHE_HOME:-}" == /* ]]; then
    FUSELET_CACHE_DIR="$XDG_CACHE_HOME/fuselet"
  else
    FUSELET_CACHE_DIR="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/fuselet"
  fi
fi
export FUSELET_CACHE_DIR
# Compiler cache: sccache (requirements/dev.txt) launches every compile of the scripts' CMake
# builds (LAUNCHER_ARGS, given at every configure, so a build folder follows the switch) and of
# the conda package builds (recipe/recipe.yaml reads FUSELET_COMPILER_LAUNCHER). One server per
# source tree, on a port and a cache folder of its own (both from the tree's path: sccache does
# not support two servers on one folder): it strips the tree's path from the cache keys
# (SCCACHE_BASEDIRS), so any build folder inside the tree (rattler-build's work folders) hits,
# and so does a fresh clone at the same path. FUSELET_COMPILER_CACHE=0 turns it off; without
# sccache, or when its server does not start, everything compiles as before.
# The scripts that compile call compiler_cache after sourcing this file (lint and docs start
# no server); until then nothing is launched through it.
FUSELET_COMPILER_LAUNCHER=""
LAUNCHER_ARGS=()
LAUNCHER_CMAKE_ARGS=""
compiler_cache() {
  FUSELET_COMPILER_LAUNCHER=""
  local sccache_bin tree_id out
  if [[ "${FUSELET_COMPILER_CACHE:-1}" != 0 ]] && sccache_bin="$(command -v sccache)"; then
    tree_id="$(printf %s "$ROOT" | cksum | cut -d' ' -f1)"
    export SCCACHE_DIR="${SCCACHE_DIR:-$FUSELET_CACHE_DIR/sccache/$(basename "$ROOT")-$tree_id}"
    export SCCACHE_SERVER_PORT="${SCCACHE_SERVER_PORT:-$(( 20000 + tree_id % 20000 ))}"
    export SCCACHE_CACHE_SIZE="${SCCACHE_CACHE_SIZE:-2G}"
    if out="$(SCCACHE_BASEDIRS="${SCCACHE_BASEDIRS:-$ROOT}" SCCACHE_IDLE_TIMEOUT="${SCCACHE_IDLE_TIMEOUT:-1800}" \
                "$sccache_bin" --start-server 2>&1)" || [[ "$out" == *"Address in use"* ]]; then
      FUSELET_COMPILER_LAUNCHER="$sccache_bin"
    else
      log "sccache's server did not start (${out//$'\n'/ }): compiling without the compiler cache" >&2
    fi
  fi
  LAUNCHER_ARGS=(-DCMAKE_C_COMPILER_LAUNCHER="$FUSELET_COMPILER_LAUNCHER" -DCMAKE_CXX_COMPILER_LAUNCHER="$FUSELET_COMPILER_LAUNCHER"
    -DCMAKE_CUDA_COMPILER_LAUNCHER="$FUSELET_COMPILER_LAUNCHER")
  printf -v LAUNCHER_CMAKE_ARGS '%q ' "${LAUNCHER_ARGS[@]}"   # the same, for scikit-build-core's CMAKE_ARGS
  export FUSELET_COMPILER_LAUNCHER
}
