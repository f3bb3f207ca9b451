"""fuselet's one version, read as CMake and pyproject.toml read it: the `context.version` line
of recipe/recipe.yaml."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION_LINE = re.compile(r'^  version: "(\d+\.\d+\.\d+)"$', re.MULTILINE)


def source_version(root: Path = ROOT) -> str:
    match = VERSION_LINE.search((root / "recipe" / "recipe.yaml").read_text())
    assert match, f'{root}/recipe/recipe.yaml has no line `  version: "X.Y.Z"` (context.version)'
    return match.group(1)
