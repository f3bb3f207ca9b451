"""Fixtures of fuselet-build's tests: the fuselet tree it packages, and the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fuselet_build import paths


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: seeds or builds conda packages (minutes when cold)")


@pytest.fixture(scope="session")
def cli():
    """cli(*args, env=None, cwd=None): `python -m fuselet_build ARGS` in the fuselet tree (or in
    `cwd`); its output is printed (pytest shows it when a test fails)."""
    root = paths.root()

    def run(*args, env=None, timeout=3600, cwd=None) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "fuselet_build", *args],
            capture_output=True,
            text=True,
            cwd=cwd or root,
            env={**os.environ, "FUSELET_ROOT": str(root), **(env or {})},
            timeout=timeout,
        )
        print(proc.stdout[-6000:], proc.stderr[-6000:], sep="\n")
        return proc

    return run
