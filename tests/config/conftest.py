"""Fixtures of the configuration checks: the source tree, ../shared, rendered matrices."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


def shared_file(rel: str) -> Path:
    """A file of ../shared; skips (saying so) in a clone without ../shared beside it."""
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"{path} is absent (a clone without ../shared): nothing to validate against")
    return path


@pytest.fixture(scope="session")
def matrix_mod():
    return pytest.importorskip(
        "fuselet_build.matrix", reason="fuselet-build is not installed here (pip install -e tools/fuselet-build)"
    )


@pytest.fixture(scope="session")
def offline_jobs(matrix_mod):
    return matrix_mod.jobs(ROOT / "recipe/recipe.yaml", [ROOT / "variants/offline.yaml"])


@pytest.fixture(scope="session")
def conda_forge_jobs(matrix_mod):
    return matrix_mod.jobs(ROOT / "recipe/recipe.yaml", [ROOT / "variants/conda-forge.yaml"])
