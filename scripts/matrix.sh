#!/usr/bin/env bash
# The packages the recipe produces for a variant file (default: variants/offline.yaml).
#   scripts/matrix.sh [fuselet-build matrix options, e.g. --variants variants/conda-forge.yaml --json]
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh" >&2
"$PY" -m fuselet_build matrix "$@"
