#!/usr/bin/env bash
# fuse() over every causal-LM type of .venv's transformers (benchmarks/zoo.py): a tiny model of
# each, fused and compared with the stock model on one training step; the table goes to
# benchmarks/results/zoo.md and zoo.json. Fails when fewer than FUSELET_ZOO_MIN_EQUAL (60) are
# equal. Extra arguments go to benchmarks/zoo.py (--types, --out, --jobs).
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
"$PY" "$ROOT/benchmarks/zoo.py" --min-equal "${FUSELET_ZOO_MIN_EQUAL:-60}" "$@"
