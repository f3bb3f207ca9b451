"""Default locations, all inside the source tree (overridable on the command line)."""
from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    """The fuselet source tree: FUSELET_ROOT, else the checkout this module lives in."""
    env = os.environ.get("FUSELET_ROOT")
    if env:
        return Path(env).resolve()
    for here in Path(__file__).resolve().parents:  # an editable install lives in the tree
        if (here / "recipe" / "recipe.yaml").exists():
            return here
    return Path.cwd()


RECIPE = "recipe/recipe.yaml"
OFFLINE_VARIANTS = "variants/offline.yaml"
OFFLINE_CHANNEL = "build/offline-channel"  # seeded by `fuselet-build seed`
SEED_CACHE = "build/seed-cache"
OUTPUT = "output"                           # built packages: itself a conda channel


def under_root(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p if p.is_absolute() else root() / p


def rattler_cache() -> Path:
    """RATTLER_CACHE_DIR, set inside the tree unless the caller chose one."""
    os.environ.setdefault("RATTLER_CACHE_DIR", str(root() / ".rattler-cache"))
    return Path(os.environ["RATTLER_CACHE_DIR"])
