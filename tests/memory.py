"""Shared by tests/torch/test_memory.py and tests/jax/test_memory.py: the measurement of
benchmarks/bench_memory.py (the one place that counts what each op saves for the backward)
and the README table it produced."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_HEADING = "## Activation memory: what each op keeps for the backward"


def bench_memory():
    """benchmarks/bench_memory.py as a module (benchmarks/ is not a package)."""
    if "bench_memory" in sys.modules:
        return sys.modules["bench_memory"]
    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "benchmarks" / "bench_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_memory"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def by_op(cases) -> dict:
    """(op, dtype) -> Case."""
    return {(c.op, c.dtype): c for c in cases}


def described(saved) -> list:
    """(owner, shape, dtype) of each saved storage, in the order saved; an output is owner "output"."""
    return [("output" if s.output else s.owner, s.shape, s.dtype) for s in saved]


def readme_rows(layer: str) -> list:
    """The cells of the README table's rows for `layer`, as written."""
    text = (ROOT / "README.md").read_text()
    assert README_HEADING in text, f"README.md has no section {README_HEADING!r}"
    section = text.split(README_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| layer ")]
    return [r for r in rows if r[0] == layer]
