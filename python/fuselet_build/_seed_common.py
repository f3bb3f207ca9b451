"""What every part of `fuselet-build seed` shares: SeedError, the channel's subdirs, the cache."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fuselet_build import _wheels

try:
    from fuselet_build.errors import UserError
except ImportError:  # pragma: no cover - the module is shared with the CLI
    class UserError(Exception):  # type: ignore[no-redef]
        pass

SUBDIRS = ("noarch", "linux-64")


class SeedError(UserError):
    """A seed step failed; the message names the step and what is kept."""


# --- the cache -----------------------------------------------------------------------------

class Cache:
    """cache_dir layout: wheels/ (downloads), resolve/ (pip resolutions), pkgs/<subdir>/
    (finished .conda files, named by content hash), tmp/ (work folders, wiped per run)."""

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
    def lock(self) -> Iterator[None]:
        """One seed per cache at a time (CI jobs sharing a cache folder)."""
        import fcntl

        with open(self.root / ".lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise SeedError(f"another `fuselet-build seed` is using the cache {self.root}; wait for it "
                                f"or pass another --cache") from None
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
        digest = _wheels.sha256_file(path)
        self._hashes[key] = [st.st_size, st.st_mtime_ns, digest]
        _atomic_write(self._hashes_path, json.dumps(self._hashes, indent=0))
        return digest

    def store(self, built: Path, subdir: str) -> Path:
        """Move a finished package into pkgs/ (atomically; mode 0644)."""
        dest = self.package(subdir, built.name)
        os.chmod(built, 0o644)
        os.replace(built, dest)
        return dest


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
