#!/usr/bin/env bash
# The library tests (scripts/check.sh) against the NEWEST releases of everything
# requirements/dev.txt names, torch, jax, jaxlib and transformers included, in .venv-latest:
# no lock, and not the machine's pip constraints either (PIP_CONFIG_FILE=/dev/null). An
# upstream release that breaks fuselet shows up here (make test-latest; the scheduled job of
# .github/workflows/latest.yml) as a report, while main, on its lock, stays green.
# Then the stable-ABI build of the torch layer, made against that torch as an isolated pip build
# would be, and its torch smoke under it (scripts/stable-abi-test.sh: the raw ops' refusals and
# their exception types included); then benchmarks/zoo.py: fuse() over every causal-LM type of
# that transformers. Extra arguments go to pytest.
source "$(dirname "$0")/env.sh"
latest="$ROOT/build/latest"
mkdir -p "$latest"
# requirements/dev.txt without the framework pins: every package at its newest release
sed -E 's/^(torch|jax|jaxlib|transformers)[=<>~!].*$/\1/' "$ROOT/requirements/dev.txt" >"$latest/requirements.txt"
export FUSELET_VENV="$ROOT/.venv-latest" FUSELET_REQUIREMENTS="$latest/requirements.txt" FUSELET_UNLOCKED=1
export PIP_CONFIG_FILE=/dev/null
# the bootstrap is redone when requirements/dev.txt changes; a day later, newer releases are
# not seen unless .venv-latest is made anew: the scheduled job starts from a fresh runner
[[ "${FUSELET_LATEST_REFRESH:-1}" == 0 ]] || rm -rf "$FUSELET_VENV"
"$ROOT/scripts/bootstrap.sh"
"$FUSELET_VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("==> newest releases:", ", ".join(f"{p} {m.version(p)}" for p in ("torch", "jax", "jaxlib", "transformers", "onnx", "flax")))
PY
"$ROOT/scripts/check.sh" "$@"
FUSELET_STABLE_ABI_HERE=1 FUSELET_STABLE_ABI_OUT="$latest/stable-abi" "$ROOT/scripts/stable-abi-test.sh" "$@"
# fuse() over every causal-LM type of the newest transformers (its table in build/latest/zoo.md)
"$FUSELET_VENV/bin/python" "$ROOT/benchmarks/zoo.py" --min-equal "${FUSELET_ZOO_MIN_EQUAL:-60}" --out "$latest/zoo"
