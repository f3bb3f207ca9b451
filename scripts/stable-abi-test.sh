#!/usr/bin/env bash
# The torch layer's stable-ABI build (FUSELET_TORCH_ABI=stable: LibTorch's stable C ABI, for every
# torch >= FUSELET_TORCH_TARGET, 2.12) proven across torch releases: built ONCE against .venv's
# torch into build/stable-abi/site. First the pip user's way: an isolated `pip wheel .` with
# FUSELET_TORCH_ABI=stable against torch 2.14.1 (pip's CUDA wheel: a CPU-only library, built
# without any CUDA toolkit), whose wheel must require torch>=2.12 and nothing narrower, installed
# from that wheel and its torch smoke (tests/conftest.py SMOKE_TESTS: every op's schema by
# opcheck, numerics, bad input, torch.compile; and tests/torch/test_stable_abi.py) run under
# .venv's 2.13.0: a torch older than the headers it was compiled with. Then the same smoke
# against the one build under .venv-stable-abi's newer torch (requirements/stable-abi.txt: torch
# 2.14.1 and the oldest transformers fuse() supports, whose tests/torch/test_transformers.py runs
# there too). The library's whole torch suite runs once, on the exact build, in make check.
# FUSELET_FREE_DISK=1 (.ci/run) removes .venv-stable-abi when its tests are done.
# FUSELET_EXPECT_TORCH_ABI=stable makes tests/torch/test_stable_abi.py fail if any other build
# was imported. Extra arguments go to each pytest run.
# FUSELET_STABLE_ABI_HERE=1 (scripts/test-latest.sh: the newest torch) runs only the smoke under
# $VENV's torch, the one it was built with: no second torch, no pip wheel; FUSELET_STABLE_ABI_OUT moves the build's folder
# (build/stable-abi) elsewhere.
source "$(dirname "$0")/env.sh"
use_build_tmp   # the isolated pip build's environment: torch 2.14.1 with its CUDA libraries
"$ROOT/scripts/bootstrap.sh"
compiler_cache
out="${FUSELET_STABLE_ABI_OUT:-$ROOT/build/stable-abi}"
site="$out/site"
log "stable ABI: building the torch layer once, against $("$PY" -c 'import torch; print(torch.__version__)') ($site)"
start=$(date +%s)
rm -rf "$site"
FUSELET_TORCH_ABI=stable FUSELET_FRAMEWORK=torch SKBUILD_BUILD_DIR="$out/build" \
  CMAKE_ARGS="$LAUNCHER_CMAKE_ARGS${CMAKE_ARGS:-}" \
  "$PY" -m pip install --quiet --no-build-isolation --no-deps --target "$site" "$ROOT"
log "stable ABI: built in $(( $(date +%s) - start )) s"
status=0
suite() {  # suite SITE VENV [PYTEST ARGS]: the torch smoke against the build in SITE under VENV's torch
  local version
  version="$("$2/bin/python" -c 'import torch; print(torch.__version__)')"
  log "stable ABI: the torch smoke against $1 under torch $version"
  # what requirements/stable-abi.txt installs must import (make test exports its own list)
  (cd "$ROOT" && PYTHONPATH="$1" FUSELET_EXPECT_TORCH_ABI=stable \
    FUSELET_REQUIRE_IMPORTS="torch numpy ml_dtypes hypothesis transformers onnx onnxscript onnxruntime" \
    "$2/bin/python" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -n 2 \
    -m smoke tests/torch tests/bad_input -k "not jax" "${@:3}") ||
    { status=1; log "stable ABI: the torch smoke against $1 under torch $version failed"; }
}
if [[ -n "${FUSELET_STABLE_ABI_HERE:-}" ]]; then
  suite "$site" "$VENV" "$@"
  exit "$status"
fi
# The isolated build's environment (torch 2.14.1 with its CUDA libraries, ~4.7 GB, removed by pip
# when the build ends) comes before .venv-stable-abi (~5.8 GB, the same torch) is made: the two
# never lie on the disk together.
wheels="$out/wheel" pipsite="$out/pip-site"
log "stable ABI: an isolated pip build against torch 2.14.1 ($wheels)"
start=$(date +%s)
rm -rf "$wheels" "$pipsite"
FUSELET_TORCH_ABI=stable FUSELET_FRAMEWORK=torch FUSELET_TORCH_VERSION=2.14.1 \
  "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" "$ROOT"
wheel="$(echo "$wheels"/fuselet-*.whl)"
log "stable ABI: built $(basename "$wheel") in $(( $(date +%s) - start )) s"
# what it requires of torch, and what it was built as
read -r requires built < <("$PY" - "$wheel" <<'EOF'
import json, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    info = json.loads(z.read("fuselet/torch/_build_info.json"))
torch = [r.split(":", 1)[1].strip() for r in meta.splitlines() if r.startswith("Requires-Dist: torch")]
print(",".join(torch), f"{info['abi']}-{info['version']}")
EOF
)
if [[ "$requires" != "torch>=2.12" || "$built" != "stable-2.14.1"* ]]; then
  log "stable ABI: the wheel requires '$requires' and was built as '$built'; expected torch>=2.12, stable-2.14.1"
  exit 1
fi
"$PY" -m pip install --quiet --no-deps --target "$pipsite" "$wheel"
suite "$pipsite" "$VENV" "$@"
# (its smoke under the torch it was built with is left out here: the isolated pip wheel above is
# built against 2.14.1 and its smoke runs under .venv's older torch, this one under the newer)
second="${FUSELET_STABLE_ABI_VENV:-$ROOT/.venv-stable-abi}"
"$ROOT/scripts/bootstrap.sh" "$second" "$ROOT/requirements/stable-abi.txt"
suite "$site" "$second" "$@"
log "stable ABI: fuse() under the oldest transformers it supports (requirements/stable-abi.txt)"
(cd "$ROOT" && PYTHONPATH="$site" FUSELET_EXPECT_TORCH_ABI=stable FUSELET_REQUIRE_IMPORTS="torch transformers" \
  "$second/bin/python" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -n 2 tests/torch/test_transformers.py "$@") ||
  { status=1; log "stable ABI: fuse() under the oldest transformers failed"; }
if [[ -n "${FUSELET_FREE_DISK:-}" ]]; then
  log "stable ABI: removing $second (FUSELET_FREE_DISK)"
  rm -rf "$second"
fi
exit "$status"
