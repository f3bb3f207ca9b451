#!/usr/bin/env bash
# Build fuselet into .venv and run the short demo.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/build.sh"
"$PY" "$ROOT/scripts/demo.py"
