"""The channel folder: placing packages, indexing with py-rattler, the manifest, disk space checks."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fuselet_build import _wheels
from fuselet_build._seed_common import SUBDIRS, Cache, SeedError
from fuselet_build._seed_make import PYTHON_BUILD_BYTES, WheelPlan

MANIFEST = ".fuselet-seed.json"


# --- the channel ---------------------------------------------------------------------------

def _place_in_channel(src: Path, channel: Path, subdir: str) -> None:
    dest = channel / subdir / src.name
    if dest.exists():
        s, d = src.stat(), dest.stat()
        if (s.st_ino, s.st_dev) == (d.st_ino, d.st_dev) or s.st_size == d.st_size:
            return
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)


INDEX_FILES = ("repodata_shards.msgpack.zst", "repodata.json.zst", "repodata.json")


def index_channel(channel: Path, files: list[str], incremental: bool = True) -> None:
    """Index `files` (subdir/name.conda) with py-rattler in a staging folder, then move the
    repodata in (shards first, repodata.json last): the channel's index is either the old
    one or the new one, never a broken one. py-rattler runs in a subprocess (0.28 can abort
    at interpreter exit after index_fs)."""
    staging = channel / ".index-staging"
    shutil.rmtree(staging, ignore_errors=True)
    for sub in SUBDIRS:
        (staging / sub).mkdir(parents=True)
        if incremental and (channel / sub / "repodata.json").exists():
            # rattler indexes only the files its repodata.json lacks (names are content hashes)
            shutil.copyfile(channel / sub / "repodata.json", staging / sub / "repodata.json")
    for rel in files:
        sub, name = rel.split("/", 1)
        try:
            os.link(channel / rel, staging / sub / name)
        except OSError:
            shutil.copyfile(channel / rel, staging / sub / name)
    code = ("import asyncio, os, sys\n"
            "from rattler.index import index_fs\n"
            "try:\n"
            "    asyncio.run(index_fs(sys.argv[1]))\n"
            "except BaseException as e:\n"
            "    print(f'{type(e).__name__}: {e}', file=sys.stderr); sys.stderr.flush(); os._exit(1)\n"
            "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(staging)], capture_output=True, text=True)
    if proc.returncode != 0 or not all((staging / s / "repodata.json").exists() for s in SUBDIRS):
        raise SeedError(f"indexing the channel with py-rattler failed (the previous index is kept): "
                        f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    for sub in SUBDIRS:
        shards = staging / sub / "shards"
        if shards.is_dir():
            (channel / sub / "shards").mkdir(exist_ok=True)
            for f in shards.iterdir():
                os.replace(f, channel / sub / "shards" / f.name)
        for name in INDEX_FILES:
            if (staging / sub / name).exists():
                os.replace(staging / sub / name, channel / sub / name)
            else:
                (channel / sub / name).unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)


def space_needed(cache: Cache, channel: Path, plans: list[WheelPlan], py_cached: bool) -> int:
    """Bytes a seed will write: each new package (~ its wheel's size) in the cache (+ in the
    channel when that is on another file system), plus the biggest wheel unpacked twice
    (the staged files and assemble_package's own copy of them)."""
    todo = [p for p in plans if not cache.package(p.subdir, p.filename).exists()]
    out = sum(p.info.path.stat().st_size for p in todo)
    biggest = max((p.info.path for p in todo), key=lambda p: p.stat().st_size, default=None)
    unpacked = 0
    if biggest is not None:
        unpacked = 2 * _wheels.uncompressed_size(next(p.info for p in todo if p.info.path == biggest))
    same_fs = os.stat(cache.root).st_dev == os.stat(channel).st_dev
    return out * (1 if same_fs else 2) + unpacked + (0 if py_cached else PYTHON_BUILD_BYTES)


def check_space(cache: Cache, channel: Path, plans: list[WheelPlan], py_cached: bool) -> None:
    need = space_needed(cache, channel, plans, py_cached)
    free = shutil.disk_usage(cache.root).free
    if need > free:
        raise SeedError(f"not enough free disk space: this seed writes about {need / 2**30:.1f} GiB under "
                        f"{cache.root} (the biggest wheel is unpacked twice while it is packed), "
                        f"{free / 2**30:.1f} GiB are free. Free some space or pass --cache/--channel-dir on a "
                        f"bigger disk; nothing was changed.")


def _read_manifest(channel: Path) -> dict:
    try:
        return json.loads((channel / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _disk_error(exc: BaseException, doing: str, cache: Cache, channel: Path) -> SeedError:
    free = shutil.disk_usage(cache.root).free / 2**20
    return SeedError(f"no space left on the device while {doing} ({free:.0f} MiB free under {cache.root}; "
                     f"{exc}). "
                     f"Finished packages are kept in {cache.pkgs}; the channel index of {channel} is "
                     f"unchanged. Free some space (or pass --cache/--channel-dir on a bigger disk) and seed again.")


def _is_enospc(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text
