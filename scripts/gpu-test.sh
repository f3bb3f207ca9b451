#!/usr/bin/env bash
# On a machine with an NVIDIA GPU whose python has CUDA builds of torch and/or jax: build
# fuselet with its CUDA kernels into that python, then run the whole test suite (the CUDA
# variants included) and the GPU benchmark. PYTHON selects the interpreter (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
export FUSELET_CUDA=ON FUSELET_CUDA_ARCHS="${FUSELET_CUDA_ARCHS:-90}" PYTHONDONTWRITEBYTECODE=1
if [[ -z "${CUDACXX:-}" ]] && command -v nvcc >/dev/null; then export CUDACXX="$(command -v nvcc)"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
start=$(date +%s)
SKBUILD_BUILD_DIR="$ROOT/build/gpu" "$PY" -m pip install --quiet --no-build-isolation --no-deps "$ROOT"
echo "==> built with CUDA kernels (${FUSELET_CUDA_ARCHS}) in $(( $(date +%s) - start )) s"
(cd /tmp && "$PY" -m fuselet)
cd "$ROOT"
"$PY" -m pytest tests -p no:cacheprovider -q -rs "$@" || status=$?
"$PY" benchmarks/bench_norm.py --device cuda --repeats 5
"$PY" benchmarks/bench_ops.py --device cuda --repeats 5
exit "${status:-0}"
