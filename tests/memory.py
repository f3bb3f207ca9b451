"""Shared by tests/torch/test_memory.py and tests/jax/test_memory.py: the measurement of
benchmarks/bench_memory.py (the one place that counts what each op saves for the backward)
and the table of docs/ops.md it produced."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The page of the site that holds the table, and its section.
DOCS_PAGE = ROOT / "docs" / "ops.md"
DOCS_HEADING = "## Activation memory: what each op keeps for the backward"


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


def docs_rows(layer: str) -> list:
    """The cells of the docs table's rows for `layer`, as written."""
    text = DOCS_PAGE.read_text()
    assert DOCS_HEADING in text, f"{DOCS_PAGE.relative_to(ROOT)} has no section {DOCS_HEADING!r}"
    section = text.split(DOCS_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| layer ")
    ]
    return [r for r in rows if r[0] == layer]
