"""The static checks have one definition, scripts/lint.sh: .pre-commit-config.yaml's hooks call
exactly its checks, clang-format reads the tree's .clang-format, and its pinned version is the
same for .venv (requirements/dev.txt) and pixi (pixi.toml)."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pixi.toml needs Python >= 3.11 (tomllib) or tomli")

from tests.config.conftest import ROOT

LINT = ROOT / "scripts/lint.sh"


def lint_checks() -> list[str]:
    """The checks of scripts/lint.sh, in order: its CHECKS array."""
    m = re.search(r"^CHECKS=\(([^)]*)\)", LINT.read_text(), re.M)
    assert m, "scripts/lint.sh has no CHECKS=(...) list"
    return m.group(1).split()


def lint_functions() -> set[str]:
    return set(re.findall(r"^check_([\w-]+)\(\)", LINT.read_text(), re.M))


@pytest.fixture(scope="module")
def hooks() -> list[dict]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def test_every_check_is_a_function_of_lint_sh():
    assert lint_checks(), "scripts/lint.sh lists no checks"
    assert len(set(lint_checks())) == len(lint_checks()), "a check is listed twice"
    assert set(lint_checks()) == lint_functions()


def test_hooks_are_local_and_fetch_nothing():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]


def test_each_hook_runs_one_check_of_lint_sh(hooks):
    for hook in hooks:
        assert hook["language"] == "system", hook["id"]
        # Each check covers the whole tree, as `make lint` does.
        assert hook.get("pass_filenames") is False, hook["id"]
        assert shlex.split(hook["entry"]) == ["scripts/lint.sh", hook["id"]], hook["id"]


def test_the_hooks_run_the_checks_of_make_lint(hooks):
    """Same checks, same order: nothing lint.sh runs is missing from pre-commit, nor the reverse."""
    assert [hook["id"] for hook in hooks] == lint_checks()


def test_lint_sh_refuses_an_unknown_check():
    out = subprocess.run(
        ["bash", str(LINT), "no-such-check"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "FUSELET_NO_BOOTSTRAP": "1"},
    )
    assert out.returncode == 2
    assert "unknown check" in out.stderr


def test_clang_format_reads_the_trees_clang_format():
    style = ROOT / ".clang-format"
    assert style.is_file()
    assert yaml.safe_load(style.read_text())["BasedOnStyle"]
    body = re.search(r"^check_clang-format\(\) \{\n(.*?)^\}", LINT.read_text(), re.M | re.S)
    assert body, "scripts/lint.sh has no check_clang-format"
    assert '--style=file:"$ROOT/.clang-format"' in body.group(1)
    assert "--dry-run -Werror" in body.group(1)


def _dev_pin(name: str) -> str:
    for line in (ROOT / "requirements/dev.txt").read_text().splitlines():
        m = re.fullmatch(rf"{re.escape(name)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"requirements/dev.txt does not pin {name}==X")


def test_clang_format_is_pinned_alike_for_venv_and_pixi():
    """Each clang-format release formats a little differently: one version everywhere."""
    with open(ROOT / "pixi.toml", "rb") as f:
        pixi = tomllib.load(f)
    lint = pixi["feature"]["lint"]
    assert lint["pypi-dependencies"]["clang-format"] == f"=={_dev_pin('clang-format')}"
    assert "clang-format" not in lint.get("dependencies", {}), "two clang-formats: conda's and PyPI's"
