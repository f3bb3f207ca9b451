"""CHANGELOG.md (Keep a Changelog): the version the tree builds has a dated entry, and the
entries run from the newest version down, under an optional [Unreleased] on top."""

from __future__ import annotations

import datetime
import re

import pytest

from tests.config.conftest import ROOT
from tests.version import source_version

CHANGELOG = ROOT / "CHANGELOG.md"
# "## [Unreleased]" or "## [1.2.3] - 2026-11-30"
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\S+))?\s*$", re.M)


def current_version() -> str:
    """The version fuselet's build reads (CMakeLists.txt, pyproject.toml): the recipe's context.version."""
    return source_version()


def _entries(text: str | None = None) -> list[tuple[str, str | None]]:
    text = CHANGELOG.read_text() if text is None else text
    return [(m["name"], m["date"]) for m in HEADING.finditer(text)]


def _key(version: str) -> tuple[int, ...]:
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{version!r}: expected MAJOR.MINOR.PATCH"
    return tuple(int(p) for p in version.split("."))


def _released(entries) -> list[tuple[str, str | None]]:
    return [(name, date) for name, date in entries if name != "Unreleased"]


def test_the_current_version_has_a_dated_entry():
    entries = dict(_released(_entries()))
    version = current_version()
    assert version in entries, f"CHANGELOG.md has no '## [{version}] - YYYY-MM-DD' entry"
    assert entries[version], f"the entry of {version} has no date"
    datetime.date.fromisoformat(entries[version])


def test_every_release_is_dated():
    for name, date in _released(_entries()):
        assert date, f"{name}: expected '## [{name}] - YYYY-MM-DD'"
        datetime.date.fromisoformat(date)


def test_unreleased_comes_first_and_undated():
    entries = _entries()
    names = [name for name, _ in entries]
    assert names.count("Unreleased") <= 1
    if "Unreleased" in names:
        assert names[0] == "Unreleased", "[Unreleased] goes on top"
        assert entries[0][1] is None, "[Unreleased] has no date"


def _order_problems(entries) -> list[str]:
    released = _released(entries)
    keys = [_key(name) for name, _ in released]
    problems = []
    if keys != sorted(keys, reverse=True):
        problems.append("entries must go from the newest version down")
    if len(set(keys)) != len(keys):
        problems.append("a version has two entries")
    dates = [datetime.date.fromisoformat(date) for _, date in released if date]
    if dates != sorted(dates, reverse=True):
        problems.append("a newer version cannot be older than the one below it")
    return problems


def test_entries_in_descending_version_order():
    assert _released(_entries()), "CHANGELOG.md has no release entry"
    assert _order_problems(_entries()) == []


@pytest.mark.parametrize(
    "text, ok",
    [
        ("## [Unreleased]\n## [0.2.0] - 2026-11-30\n## [0.1.0] - 2026-11-30\n", True),
        ("## [0.1.0] - 2026-11-30\n## [0.2.0] - 2026-11-30\n", False),
        ("## [0.10.0] - 2026-12-01\n## [0.9.0] - 2026-11-30\n", True),  # numeric, not text, order
        ("## [0.2.0] - 2026-11-29\n## [0.1.0] - 2026-11-30\n", False),
        ("## [0.2.0] - 2026-11-30\n## [0.2.0] - 2026-11-30\n", False),
    ],
)
def test_the_order_check_has_teeth(text, ok):
    assert (_order_problems(_entries(text)) == []) is ok
