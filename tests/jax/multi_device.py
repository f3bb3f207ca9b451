"""Sharding tests on 8 CPU devices: run a module of tests/jax in a subprocess (XLA_FLAGS must be
set before jax is imported there) and read the one JSON object it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# How many times a compiled chunk loop holds one chunk's steps (and collectives): the first
# chunk's, taken before the scan (the accumulators start as its products), and the scan body's.
CHUNK_COPIES = 2


def run_on_8_cpu_devices(module: str) -> dict:
    """`python -m module` with 8 forced CPU devices; its last stdout line, parsed."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def others(counts: dict, *allowed) -> dict:
    """The collectives of `counts` that occur, but for the `allowed` ones."""
    return {c: n for c, n in counts.items() if n and c not in allowed}


def size(shape) -> int:
    """The elements of an array of `shape` (a list of dims, as the children print them)."""
    n = 1
    for d in shape:
        n *= d
    return n
