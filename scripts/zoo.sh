#!/usr/bin/env bash
# fuse() over every causal-LM type of .venv's transformers and the image-text types of its vlm
# pass (benchmarks/zoo.py): a tiny model of each, fused and compared with the stock model on one
# training step; the table goes to benchmarks/results/zoo.md and zoo.json. Fails on zoo.py's
# verdict: a type that differs, an image-text type not equal or whose language stack ran none of
# fuselet's ops, a type Liger-Kernel lists or transformers' door reaches that is not equal, fewer than
# FUSELET_ZOO_MIN_EQUAL (60) types equal, fuselet's ops run through the door in fewer than
# FUSELET_ZOO_MIN_DOOR_OPS (60). make test runs its sample (tests/torch/test_zoo.py); the nightly
# workflow runs it whole. Extra arguments go to benchmarks/zoo.py (--types, --vlm, --out, --jobs).
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
"$PY" "$ROOT/benchmarks/zoo.py" --min-equal "${FUSELET_ZOO_MIN_EQUAL:-60}" \
  --min-door-ops "${FUSELET_ZOO_MIN_DOOR_OPS:-60}" "$@"
