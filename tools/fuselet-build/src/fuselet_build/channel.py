"""Conda channel helpers over py-rattler: index, solve (and explain), install."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fuselet_build.errors import UserError
from fuselet_build.failpoints import failpoint

SUBDIRS = ("noarch", "linux-64")
INDEX_FILES = ("repodata_shards.msgpack.zst", "repodata.json.zst", "repodata.json")

# py-rattler's index_fs, run in a child process: py-rattler 0.28 can abort at interpreter exit
# after indexing, and that must take down neither the caller nor the index.
_INDEX_FS = (
    "import asyncio, inspect, os, sys\n"
    "from rattler.index import index_fs\n"
    "try:\n"
    "    r = index_fs(sys.argv[1])\n"
    "    if inspect.isawaitable(r): asyncio.run(r)\n"
    "except BaseException as e:\n"
    "    print(f'{type(e).__name__}: {e}', file=sys.stderr); sys.stderr.flush(); os._exit(1)\n"
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n"
)


def index_is_stale(channel_dir: Path) -> bool:
    """Whether the repodata of a local channel misses, or does not describe its package files:
    other names, other sizes, or a file written after the index."""
    for sub in SUBDIRS:
        repodata = Path(channel_dir) / sub / "repodata.json"
        try:
            indexed_at = repodata.stat().st_mtime
            listed = json.loads(repodata.read_text())
        except (OSError, ValueError):
            return True
        records = {**listed.get("packages", {}), **listed.get("packages.conda", {})}
        files = {p.name: p.stat() for ext in ("*.conda", "*.tar.bz2") for p in (Path(channel_dir) / sub).glob(ext)}
        if set(records) != set(files):
            return True
        if any(st.st_size != records[name].get("size") or st.st_mtime > indexed_at for name, st in files.items()):
            return True
    return False


def index(channel_dir: Path, files: list[str] | None = None, *, incremental: bool = False) -> None:
    """(Re)write the repodata of a local channel with py-rattler, atomically.

    `files` (subdir/name.conda) are the packages to list; default: every package in the
    subdirs. They are indexed in a staging folder and the repodata is moved in at the end
    (shards first, repodata.json last): the channel's index is the old one or the new one,
    never a broken one. `incremental` starts from the current repodata.json (rattler then
    reads only the packages it lacks; safe where file names are content hashes).
    Packages and index files are made readable by everyone (rattler-build writes packages
    0600): a channel is served from shared folders and web servers.
    """
    channel_dir = Path(channel_dir)
    for sub in SUBDIRS:
        (channel_dir / sub).mkdir(parents=True, exist_ok=True)
        readable(channel_dir / sub)
    if files is None:
        files = sorted(
            f"{sub}/{p.name}" for sub in SUBDIRS for ext in ("*.conda", "*.tar.bz2") for p in (channel_dir / sub).glob(ext)
        )
    staging = channel_dir / ".index-staging"
    shutil.rmtree(staging, ignore_errors=True)
    for sub in SUBDIRS:
        (staging / sub).mkdir(parents=True)
        if incremental and (channel_dir / sub / "repodata.json").exists():
            shutil.copyfile(channel_dir / sub / "repodata.json", staging / sub / "repodata.json")
    for rel in files:
        sub, name = rel.split("/", 1)
        readable(channel_dir / rel)
        try:
            os.link(channel_dir / rel, staging / sub / name)
        except OSError:
            shutil.copyfile(channel_dir / rel, staging / sub / name)
    proc = subprocess.run([sys.executable, "-c", _INDEX_FS, str(staging)], capture_output=True, text=True)
    if proc.returncode != 0 or not all((staging / s / "repodata.json").exists() for s in SUBDIRS):
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(
            f"indexing {channel_dir} with py-rattler failed (the previous index is kept): "
            f"{(proc.stderr or proc.stdout).strip()[-1500:]}"
        )
    for sub in SUBDIRS:
        shards = staging / sub / "shards"
        if shards.is_dir():
            (channel_dir / sub / "shards").mkdir(exist_ok=True)
            readable(channel_dir / sub / "shards")
            for f in shards.iterdir():
                readable(f)
                os.replace(f, channel_dir / sub / "shards" / f.name)
        failpoint("index")
        for name in INDEX_FILES:
            if (staging / sub / name).exists():
                readable(staging / sub / name)
                os.replace(staging / sub / name, channel_dir / sub / name)
            else:
                (channel_dir / sub / name).unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)


def link_into(src: Path, dest: Path, mode: int | None = None) -> None:
    """dest becomes a hard link to src (a copy across file systems), with `mode` if given, by
    an atomic rename: a reader sees the old file or the new one, never a part."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, dest)


def readable(path: Path) -> None:
    """Give everyone read access to a file (and search access to a folder)."""
    mode = path.stat().st_mode
    want = mode | (0o555 if path.is_dir() else 0o444)
    if want != mode:
        os.chmod(path, want & 0o7777)


def channel_urls(channels: list[str]) -> list[str]:
    out = []
    for c in channels:
        p = Path(c)
        out.append(p.resolve().as_uri() if p.exists() else c)
    return out


def solve(specs: list[str], channels: list[str], virtual_packages: list | None = None, locked_packages: list | None = None):
    """rattler.solve for linux-64 (+noarch); raises the solver's own explanation."""
    import rattler

    async def run():
        return await rattler.solve(
            sources=channel_urls(channels),
            specs=specs,
            platforms=["linux-64", "noarch"],
            virtual_packages=virtual_packages or [],
            locked_packages=locked_packages or None,
        )

    return asyncio.run(run())


def why_unsolvable(rendered, channels: list[str]) -> str:
    """Ask rattler's solver why the build/host environment of a rendered variant fails."""
    req = rendered.recipe.requirements
    for env_name, specs in (("host", req.host), ("build", req.build)):
        # Pins to the recipe's own outputs render as {'pin_subpackage': ...}: not channel specs.
        specs = [str(s) for s in specs if not str(s).startswith(("__", "{"))]
        if not specs:
            continue
        try:
            solve(specs, channels)
        except Exception as exc:  # the solver's message names the missing package
            return f"the {env_name} environment cannot be solved: {str(exc).strip()}"
    return ""


def has_cuda_driver() -> bool:
    """Whether this machine reports a `__cuda` virtual package (an NVIDIA driver)."""
    import rattler

    return any("cuda" in str(v).lower() for v in rattler.VirtualPackage.detect())


def virtual_packages(cuda: str | None = None) -> list:
    """This machine's virtual packages; with `cuda`, a `__cuda` of that version is declared
    where no driver reports one, so CUDA packages install (their CPU paths still run)."""
    import rattler

    detected = list(rattler.VirtualPackage.detect())
    if cuda and not has_cuda_driver():
        detected.append(
            rattler.GenericVirtualPackage(rattler.PackageName("__cuda"), rattler.Version(cuda), rattler.BuildString("0"))
        )
    return detected


class Unsolvable(Exception):
    """The solver found no environment for the specs; the message is its own explanation."""


def installed(prefix: Path) -> list:
    """The PrefixRecords of the conda environment at `prefix` ([] where there is none)."""
    import rattler

    return [rattler.PrefixRecord.from_path(str(p)) for p in sorted(Path(prefix).glob("conda-meta/*.json"))]


def install(
    prefix: Path, specs: list[str], channels: list[str], *, cuda: str | None = None, show_progress: bool = False, on_solved=None
) -> list:
    """`specs` installed at `prefix` from `channels` (py-rattler solve + install): a fresh
    environment, or an existing one keeping its packages (they stay requested, their current
    builds preferred). `on_solved(records)` is called between solve and install. Returns the
    records of the environment; raises Unsolvable with the solver's reason."""
    import rattler
    from rattler.exceptions import SolverError

    present = installed(prefix)
    keep = [r.name.normalized for r in present]
    try:
        records = solve(
            specs + [n for n in keep if n not in {rattler.MatchSpec(s).name.normalized for s in specs}],
            channels,
            virtual_packages=virtual_packages(cuda),
            locked_packages=present,
        )
    except SolverError as exc:
        raise Unsolvable(str(exc).strip()) from None
    if on_solved is not None:
        on_solved(records)
    asyncio.run(
        rattler.install(records, target_prefix=str(prefix), installed_packages=present or None, show_progress=show_progress)
    )
    return records
