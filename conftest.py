"""Session hooks of every pytest run in this tree (tests/ and tools/fuselet-build/tests, together
or apart: scripts/test.sh runs them side by side): imports that must work, the sanitized build
a sanitizer run must test, and the skips counted by reason."""

from __future__ import annotations

import collections
import importlib
import os

import pytest

# Modules a run must be able to import (space-separated; scripts/test.sh names the frameworks and
# tools of requirements/dev.txt): one that cannot be imported stops the session at once with the
# import error, instead of turning into hundreds of quiet `importorskip` skips.
REQUIRE_ENV = "FUSELET_REQUIRE_IMPORTS"
# The folder of an ASan build of fuselet (scripts/sanitize.sh): the run stops unless fuselet and
# its libraries are loaded from there, with the sanitizer's runtime in the process.
SANITIZED_ENV = "FUSELET_SANITIZED"


def pytest_sessionstart(session):
    broken = []
    for name in os.environ.get(REQUIRE_ENV, "").split():
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is reported, by name
            broken.append(f"{name}: {type(exc).__name__}: {exc}")
    if broken:
        pytest.exit(f"{REQUIRE_ENV} names modules that cannot be imported here:\n  " + "\n  ".join(broken), returncode=1)
    if os.environ.get(SANITIZED_ENV):
        _check_sanitized(os.path.realpath(os.environ[SANITIZED_ENV]))


def _check_sanitized(folder: str) -> None:
    import fuselet
    from fuselet import _core

    problems = []
    if not os.path.realpath(fuselet.__file__).startswith(folder + os.sep):
        problems.append(f"fuselet is imported from {fuselet.__file__}")
    _core.load()
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "/" in line}
    libs = sorted(p for p in mapped if os.path.basename(p).startswith("libfuselet"))
    problems += [f"{lib} is loaded" for lib in libs if not lib.startswith(folder + os.sep)]
    if not libs:
        problems.append("no libfuselet is loaded")
    if not any("libasan" in os.path.basename(p) for p in mapped):
        problems.append("the AddressSanitizer runtime is not loaded (LD_PRELOAD)")
    if problems:
        pytest.exit(f"{SANITIZED_ENV}={folder}: " + "; ".join(problems), returncode=1)


# Skip reasons that mean "something this run was meant to have is missing" (../shared, a tool, a
# package of the lock), never "this machine has no such hardware": under CI=true such a skip is a
# failure, so that a missing install step cannot pass as a green run. A package a run declares
# it goes without (not among its FUSELET_REQUIRE_IMPORTS, where that is set: the stable-ABI
# environment has no jax) may still skip.
MISSING = ("is absent", "is not installed", "not installed here", "cannot be found", "not found", "no nvcc", "on PATH")


def _missing_in_ci(reason: str) -> bool:
    if not any(words in reason for words in MISSING):
        return False
    declared = os.environ.get(REQUIRE_ENV)
    package = reason.removeprefix("Skipped: ").split(" ", 1)[0].replace("-", "_")
    if declared is not None and "not installed" in reason and package not in declared.split():
        return False
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if _missing_in_ci(reason):
            report.outcome = "failed"
            report.longrepr = f"CI=true: this skip means something CI must have is missing: {reason}"


def pytest_terminal_summary(terminalreporter):
    """The skips counted by reason (the location-free part of pytest's skip reason)."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            reasons[str(report.longrepr[2]).removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("=", f"{sum(reasons.values())} skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:6d}  {reason}")
