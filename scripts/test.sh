#!/usr/bin/env bash
# The whole test suite: core C++ tests, CUDA compile check, the conda packages of
# variants/offline.yaml (seeded, built, verified: scripts/packages.sh), then pytest against
# the fuselet built into .venv and those packages: the library's tests and the configuration
# checks (tests/) and the packaging tool's (tools/fuselet-build/tests). Extra arguments go to pytest.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
"$ROOT/scripts/core-test.sh"
# The torch CUDA impls are compiled by the package build (fuselet-torch cuda130) below.
FUSELET_CUDA_FRAMEWORK=jax "$ROOT/scripts/cuda-build.sh"
# pytest's test_verify_passes verifies the packages (and what verify must refuse).
FUSELET_PACKAGES_VERIFY=0 "$ROOT/scripts/packages.sh"
log "pytest"
# The packaging tests reuse the channel and packages made above (their own seed/build are no-ops).
export FUSELET_OFFLINE_CHANNEL="$ROOT/build/offline-channel"
# What .venv must import (requirements/dev.txt): a broken one fails the run, never skips it.
export FUSELET_REQUIRE_IMPORTS="${FUSELET_REQUIRE_IMPORTS-torch jax jaxlib fuselet_build.cli jsonschema check_jsonschema hypothesis yaml}"
cd "$ROOT"
"$PY" -m pytest tests tools/fuselet-build/tests -p no:cacheprovider "$@"
