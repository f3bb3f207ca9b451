"""The documentation site (mkdocs.yml, docs/): it builds with --strict (no broken link or
anchor, no missing benchmark result, every API reference resolved from the docstrings), the
strict build has teeth, and the commands the pages and the README quote exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.config.conftest import ROOT

pytest.importorskip("mkdocs", reason="the docs need mkdocs (requirements/dev.txt, pixi's docs feature)")
pytest.importorskip("material", reason="the docs need mkdocs-material")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs need mkdocstrings[python]")

PAGES = sorted((ROOT / "docs").rglob("*.md"))


def _build(config, site):
    """mkdocs build --strict, run from the source tree as scripts/docs.sh runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_the_site_builds_strictly(tmp_path):
    rc, out = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert rc == 0, out
    assert "WARNING" not in out, out
    site = tmp_path / "site"
    # the API reference was generated from both layers' docstrings, not left empty
    for layer, op in (("torch", "fuselet.torch.norm.rms_norm"), ("jax", "fuselet.jax.norm.rms_norm")):
        assert f'id="{op}"' in (site / "api" / layer / "index.html").read_text(), layer
    # the benchmark results are included as they are, the pictures served from benchmarks/results/
    performance = (site / "performance" / "index.html").read_text()
    assert "training step on cpu" in performance
    for picture in (ROOT / "benchmarks" / "results").glob("*.png"):
        assert (site / "results" / picture.name).is_file(), picture.name


@pytest.fixture(scope="module")
def copied_site(tmp_path_factory):
    """mkdocs.yml and docs/ in a tmp folder, every path of the config pointing back at the tree;
    it builds as it is (so what breaks it below is the one line added)."""
    tmp = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "docs", tmp / "docs")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(tmp / "docs")
    config["hooks"] = [str(ROOT / h) for h in config["hooks"]]
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT / "python")]
    path = tmp / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    rc, out = _build(path, tmp / "site")
    assert rc == 0, f"the copied site does not build as it is:\n{out}"
    return path


@pytest.mark.parametrize(
    "broken",
    [
        "[a page that is not there](no-such-page.md)",
        "[an anchor that is not there](install.md#no-such-section)",
        "::: fuselet.torch.no_such_module",
    ],
)
def test_the_strict_build_has_teeth(copied_site, broken):
    """A broken link, anchor or API reference fails the build: the check above is not vacuous."""
    page = copied_site.parent / "docs" / "index.md"
    text = page.read_text()
    page.write_text(f"{text}\n\n{broken}\n")
    try:
        rc, out = _build(copied_site, copied_site.parent / "site")
    finally:
        page.write_text(text)
    assert rc != 0, f"mkdocs build --strict passed with {broken!r} in index.md"


def _quoted(text: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, text, flags=re.M))


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def _pixi_tasks() -> set[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    pixi = tomllib.loads((ROOT / "pixi.toml").read_text())
    return set(pixi.get("tasks", {})) | {t for f in pixi.get("feature", {}).values() for t in f.get("tasks", {})}


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_quoted_exist(page):
    """`make X`, `pixi run X` (in code), scripts/X, tests/X and benchmarks/X the docs quote exist in the tree."""
    text = page.read_text()
    for target in _quoted(text, r"(?:`|^)make ([a-z][a-z-]*)"):
        assert target in _makefile_targets(), f"{page.name} quotes `make {target}`: no such Makefile target"
    for task in _quoted(text, r"(?:`|^)pixi run (?:-e [a-z0-9-]+ )?([a-z][a-z-]*)"):
        assert task in _pixi_tasks(), f"{page.name} quotes `pixi run {task}`: no such pixi task"
    for script in _quoted(text, r"(?<![\w/.-])scripts/[A-Za-z0-9_.-]+\.(?:sh|py)\b"):
        assert (ROOT / script).is_file(), f"{page.name} quotes {script}: no such file"
    for rel in _quoted(text, r"(?<![\w/.-])(?:tests|benchmarks)/[A-Za-z0-9_/.-]+\.(?:py|txt|png)\b"):
        assert (ROOT / rel).is_file(), f"{page.name} quotes {rel}: no such file"


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_closed(page):
    """An unclosed fence swallows the rest of the page into a code block, which --strict does not see."""
    fences = [n for n, line in enumerate(page.read_text().splitlines(), 1) if line.startswith("```")]
    assert len(fences) % 2 == 0, f"{page.name}: the code block opened at line {fences[-1]} is never closed"


def test_the_readme_links_into_the_docs():
    """The README is the landing page: its links into docs/ are relative and point at pages."""
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert links, "README.md links to no page of docs/"
    for link in links:
        assert (ROOT / link).is_file(), f"README.md links to {link}: no such file"
