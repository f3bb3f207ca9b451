"""Resolving (pip --dry-run --report) and downloading the wheels of the offline channel."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fuselet_build.seed.cache import Cache, SeedError, atomic_write
from fuselet_build.seed.report import ProgressUi
from fuselet_build.seed.wheels import short_hash

# --- resolving and downloading wheels ------------------------------------------------------


@dataclass
class ResolvedWheel:
    name: str
    version: str
    url: str
    sha256: str | None
    path: Path | None = None  # where the wheel lies once downloaded (or the local file itself)
    group: str = ""


_PIP_CHATTER = (
    "Collecting",
    "Downloading",
    "Using cached",
    "Looking in",
    "Processing",
    "Would install",
    "Obtaining",
    "Saved",
    "File was already",
    "Successfully",
    "Requirement already",
)


def _pip(args: list[str], what: str, tmp: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    env = {**os.environ, **({"TMPDIR": str(tmp)} if tmp else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = [
            ln
            for ln in (proc.stderr + proc.stdout).splitlines()
            if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln
        ]
        if any("No space left on device" in ln for ln in lines):
            raise OSError(errno.ENOSPC, f"{what}: pip: {next(ln for ln in lines if 'No space left' in ln).strip()}")
        if any(ln.startswith("Traceback") for ln in lines):  # its own ERROR lines say what went wrong
            errors = [ln for ln in lines if ln.lstrip().startswith("ERROR")] or lines[-8:]
        else:
            errors = [ln for ln in lines if not ln.lstrip().startswith(_PIP_CHATTER)]
        raise SeedError(f"{what} failed (pip exit {proc.returncode}):\n  " + "\n  ".join(errors[-12:]))
    return proc


def resolve_group(
    cache: Cache,
    group: str,
    requirements: list[str],
    refresh: bool = False,
    log: Callable[[str], None] | None = None,
    python: str | None = None,
) -> list[ResolvedWheel]:
    """pip's resolution of one group for this interpreter (linux, this python), or for another
    `python` ("3.12": pip's --python-version, wheels only), remembered in
    cache/resolve/<group>[-pyXY].json; reused while the requirements are unchanged
    (refresh=True asks pip again)."""
    version = tuple(map(int, python.split("."))) if python else sys.version_info[:2]
    key = short_hash(requirements, version, platform.machine())
    name = f"{group}-py{version[0]}{version[1]}" if python else group
    lock = cache.resolve / f"{name}.json"
    if not refresh and lock.exists():
        try:
            data = json.loads(lock.read_text())
            if data.get("key") == key:
                return [ResolvedWheel(**{**w, "path": Path(w["path"]) if w.get("path") else None}) for w in data["wheels"]]
        except (ValueError, KeyError, TypeError):
            pass
    if log:
        log(f"resolving {name} with pip: {' '.join(requirements)}")
    report = cache.workdir(f"resolve-{name}") / "report.json"
    _pip(
        [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--only-binary=:all:",
            "--progress-bar=off",
            *(["--python-version", python] if python else []),
            "--report",
            str(report),
            *requirements,
        ],
        f"resolving the wheels of group '{group}' for python {'.'.join(map(str, version))} ({' '.join(requirements)})",
        cache.tmp,
    )
    data = json.loads(report.read_text())
    wheels = []
    for item in data.get("install", []):
        info = item["download_info"]
        hashes = (info.get("archive_info") or {}).get("hashes") or {}
        sha = hashes.get("sha256") or (info.get("archive_info") or {}).get("hash", "sha256=").partition("=")[2] or None
        wheels.append(
            ResolvedWheel(
                name=item["metadata"]["name"], version=item["metadata"]["version"], url=info["url"], sha256=sha, group=group
            )
        )
    shutil.rmtree(report.parent, ignore_errors=True)
    atomic_write(
        lock,
        json.dumps(
            {"key": key, "requirements": requirements, "wheels": [{**w.__dict__, "path": None} for w in wheels]}, indent=1
        ),
    )
    return wheels


def _local_path(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    return None


def fetch_wheels(cache: Cache, wheels: list[ResolvedWheel], ui: ProgressUi, python: str | None = None) -> None:
    """Give every wheel a verified local path: file:// wheels are used where they lie, the
    others are downloaded by pip into cache/wheels (sha256-checked); `python`: the wheels are
    for that python ("3.12"), not the running one."""
    missing = []
    for w in wheels:
        local = _local_path(w.url)
        if local is None:
            local = cache.wheels / urllib.parse.unquote(urllib.parse.urlparse(w.url).path.rsplit("/", 1)[-1])
        w.path = local
        if local.exists() and _local_path(w.url) is None and w.sha256 and cache.sha256(local) != w.sha256:
            ui.log(f"downloading {local.name} again: its sha256 is not the one pip reported (a truncated download?)")
            local.unlink()
        if not local.exists():
            if _local_path(w.url) is not None:
                raise SeedError(
                    f"wheel {w.name} {w.version}: {local} has gone (it was resolved from a local "
                    f"folder); run `fuselet-build seed --refresh`"
                )
            missing.append(w)
    if missing:
        ui.log(f"downloading {len(missing)} wheels: {', '.join(f'{w.name}=={w.version}' for w in missing)}")
        urls = [f"{w.url}#sha256={w.sha256}" if w.sha256 else w.url for w in missing]
        try:
            _pip(
                [
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--progress-bar=off",
                    *(["--python-version", python] if python else []),
                    "--dest",
                    str(cache.wheels),
                    *urls,
                ],
                "downloading " + ", ".join(f"{w.name}=={w.version}" for w in missing),
                cache.tmp,
            )
        except SeedError as exc:
            gone = [w for w in missing if not w.path.exists()] or missing
            raise SeedError(f"could not download {', '.join(f'{w.name}=={w.version} ({w.url})' for w in gone)}. {exc}") from None
    for w in wheels:
        if not w.path.exists():
            raise SeedError(f"wheel {w.name}=={w.version} is not at {w.path} after the download ({w.url})")
        if w.sha256 and cache.sha256(w.path) != w.sha256:
            raise SeedError(f"wheel {w.path} does not match the sha256 pip reported ({w.sha256}); delete it and seed again")
