#!/usr/bin/env bash
# The torch layer's stable-ABI build (FUSELET_TORCH_ABI=stable: LibTorch's stable C ABI, for every
# torch >= FUSELET_TORCH_TARGET, 2.12) proven across torch releases: built ONCE against .venv's
# torch into build/stable-abi/site, then the torch tests run against that one build under .venv's
# torch (requirements/dev.txt) and under .venv-stable-abi's (requirements/stable-abi.txt).
# FUSELET_EXPECT_TORCH_ABI=stable makes tests/torch/test_stable_abi.py fail if any other build
# was imported. Extra arguments go to each pytest run.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
compiler_cache
out="$ROOT/build/stable-abi"
site="$out/site"
log "stable ABI: building the torch layer once, against $("$PY" -c 'import torch; print(torch.__version__)') ($site)"
start=$(date +%s)
rm -rf "$site"
FUSELET_TORCH_ABI=stable FUSELET_FRAMEWORK=torch SKBUILD_BUILD_DIR="$out/build" \
  CMAKE_ARGS="$LAUNCHER_CMAKE_ARGS${CMAKE_ARGS:-}" \
  "$PY" -m pip install --quiet --no-build-isolation --no-deps --target "$site" "$ROOT"
log "stable ABI: built in $(( $(date +%s) - start )) s"
second="${FUSELET_STABLE_ABI_VENV:-$ROOT/.venv-stable-abi}"
"$ROOT/scripts/bootstrap.sh" "$second" "$ROOT/requirements/stable-abi.txt"
status=0
for venv in "$VENV" "$second"; do
  version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  log "stable ABI: the torch tests against $site under torch $version"
  # what requirements/stable-abi.txt installs must import (make test exports its own list)
  (cd "$ROOT" && PYTHONPATH="$site" FUSELET_EXPECT_TORCH_ABI=stable \
    FUSELET_REQUIRE_IMPORTS="torch numpy ml_dtypes hypothesis transformers onnx onnxscript onnxruntime" \
    "$venv/bin/python" -m pytest -c "$ROOT/pyproject.toml" -p no:cacheprovider -q \
    tests/torch tests/test_bad_input.py -k "not jax" "$@") || status=1
done
exit "$status"
