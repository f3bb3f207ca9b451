"""What every part of `fuselet-build seed` shares: SeedError, the channel's subdirs, the cache
(downloads, resolutions, finished packages, work folders) and the packing options."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fuselet_build.channel import SUBDIRS
from fuselet_build.errors import UserError
from fuselet_build.lock import folder_lock


class SeedError(UserError):
    """A seed step failed; the message names the step and what is kept."""


# --- the cache -----------------------------------------------------------------------------


class Cache:
    """cache_dir layout: wheels/ (downloads), resolve/ (pip resolutions), pkgs/<subdir>/
    (finished .conda files, named by content hash), tmp/ (work folders, wiped per run).

    By default it is the per-user cache (fuselet_build.paths.seed_cache), shared by every
    clone: one seed uses it at a time (lock), and nothing in it is trusted unverified (a
    wheel's sha256 is pip's, a package's the one recorded when it was made)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.wheels = self.root / "wheels"
        self.resolve = self.root / "resolve"
        self.pkgs = self.root / "pkgs"
        self.tmp = self.root / "tmp"
        for d in (self.wheels, self.resolve, self.tmp, *(self.pkgs / s for s in SUBDIRS)):
            d.mkdir(parents=True, exist_ok=True)
        self._hashes_path = self.wheels / "sha256.json"
        try:
            self._hashes = json.loads(self._hashes_path.read_text())
        except (OSError, ValueError):
            self._hashes = {}

    @contextmanager
    def lock(self, wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """One seed per cache at a time (clones and CI jobs sharing a cache folder): the error
        names the holder; with `wait`, it is told so and the seed waits for the holder to end
        (the second of two clones then finds the packages the first made)."""
        with folder_lock(self.root, "`fuselet-build seed` (pass another --cache to run one beside it)", SeedError, wait):
            yield

    def clean_tmp(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def workdir(self, label: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.tmp))

    def package(self, subdir: str, filename: str) -> Path:
        return self.pkgs / subdir / filename

    def sha256(self, path: Path) -> str:
        """sha256 of a file, remembered by (path, size, mtime)."""
        st = path.stat()
        key = str(path.resolve())
        hit = self._hashes.get(key)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        digest = sha256_file(path)
        self._hashes[key] = [st.st_size, st.st_mtime_ns, digest]
        atomic_write(self._hashes_path, json.dumps(self._hashes, indent=0))
        return digest

    def store(self, built: Path, subdir: str) -> Path:
        """Move a finished package into pkgs/ (atomically; mode 0644) and record its sha256."""
        dest = self.package(subdir, built.name)
        os.chmod(built, 0o644)
        os.replace(built, dest)
        self._record(dest)
        return dest

    @staticmethod
    def _record_path(path: Path) -> Path:
        return path.with_name(f".{path.name}.sha256.json")

    def _record(self, path: Path, digest: str | None = None) -> None:
        st = path.stat()
        atomic_write(
            self._record_path(path),
            json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest or sha256_file(path)}),
        )

    def damaged(self, path: Path) -> str:
        """Why the finished package `path` of the cache cannot be used ("" when it can): its
        sha256, recorded when it was made, is checked whenever its size or mtime changed. A
        package made before records existed gets its record now."""
        try:
            rec = json.loads(self._record_path(path).read_text())
        except (OSError, ValueError):
            self._record(path)
            return ""
        st = path.stat()
        if (st.st_size, st.st_mtime_ns) == (rec.get("size"), rec.get("mtime_ns")):
            return ""
        digest = sha256_file(path)
        if digest != rec.get("sha256"):
            return (
                f"its sha256 is not the one recorded when it was made ({st.st_size} bytes, "
                f"{rec.get('size')} then): truncated or overwritten"
            )
        self._record(path, digest)  # touched, not changed
        return ""


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new file, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --- packing -------------------------------------------------------------------------------


@dataclass
class Options:
    compression_level: int = 3  # zstd level; 9+ costs minutes on the CUDA libraries
    compression_threads: int = max(1, os.cpu_count() or 1)


def timestamp(when: datetime | None = None) -> datetime:
    """A package's timestamp: its wheel's, else a fixed one (reproducible packages)."""
    return when or datetime(2026, 1, 1, tzinfo=timezone.utc)


@contextmanager
def tmpdir_env(path: Path) -> Iterator[None]:
    """assemble_package and rattler-build stage every file in a TempDir: keep it inside the
    cache (same disk, wiped on the next run) instead of /tmp."""
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
