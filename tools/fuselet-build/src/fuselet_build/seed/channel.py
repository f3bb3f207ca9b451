"""The seeded channel folder: placing packages, the manifest, disk space checks (indexing is
fuselet_build.channel.index, shared with the build)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from fuselet_build.channel import link_into
from fuselet_build.seed.cache import Cache, SeedError
from fuselet_build.seed.host import PYTHON_BUILD_BYTES
from fuselet_build.seed.wheels import WheelPlan, uncompressed_size

MANIFEST = ".fuselet-seed.json"


# --- the channel ---------------------------------------------------------------------------


def place_in_channel(src: Path, channel: Path, subdir: str, replace: bool = False) -> None:
    """Link (or copy) the cache's package `src` into the channel; an existing file of the same
    name is kept unless `replace` (a package made anew) or it differs in size."""
    dest = channel / subdir / src.name
    if dest.exists() and not replace:
        s, d = src.stat(), dest.stat()
        if (s.st_ino, s.st_dev) == (d.st_ino, d.st_dev) or s.st_size == d.st_size:
            return
    link_into(src, dest, 0o644)


def space_needed(cache: Cache, channel: Path, plans: list[WheelPlan], py_cached: bool) -> int:
    """Bytes a seed will write: each new package (~ its wheel's size) in the cache (+ in the
    channel when that is on another file system), plus the biggest wheel unpacked twice
    (the staged files and assemble_package's own copy of them)."""
    todo = [p for p in plans if not cache.package(p.subdir, p.filename).exists()]
    out = sum(p.info.path.stat().st_size for p in todo)
    biggest = max((p.info.path for p in todo), key=lambda p: p.stat().st_size, default=None)
    unpacked = 0
    if biggest is not None:
        unpacked = 2 * uncompressed_size(next(p.info for p in todo if p.info.path == biggest))
    same_fs = os.stat(cache.root).st_dev == os.stat(channel).st_dev
    return out * (1 if same_fs else 2) + unpacked + (0 if py_cached else PYTHON_BUILD_BYTES)


def check_space(cache: Cache, channel: Path, plans: list[WheelPlan], py_cached: bool) -> None:
    need = space_needed(cache, channel, plans, py_cached)
    free = shutil.disk_usage(cache.root).free
    if need > free:
        raise SeedError(
            f"not enough free disk space: this seed writes about {need / 2**30:.1f} GiB under "
            f"{cache.root} (the biggest wheel is unpacked twice while it is packed), "
            f"{free / 2**30:.1f} GiB are free. Free some space or pass --cache/--channel-dir on a "
            f"bigger disk; nothing was changed."
        )


def read_manifest(channel: Path) -> dict:
    try:
        return json.loads((channel / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def disk_error(exc: BaseException, doing: str, cache: Cache, channel: Path) -> SeedError:
    free = shutil.disk_usage(cache.root).free / 2**20
    return SeedError(
        f"no space left on the device while {doing} ({free:.0f} MiB free under {cache.root}; "
        f"{exc}). "
        f"Finished packages are kept in {cache.pkgs}; the channel index of {channel} is "
        f"unchanged. Free some space (or pass --cache/--channel-dir on a bigger disk) and seed again."
    )


def is_enospc(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text
