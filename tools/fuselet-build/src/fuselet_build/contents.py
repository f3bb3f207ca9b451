"""What conda-forge's CI checks inside a built package, done on the files themselves.

linkage      every NEEDED entry of every ELF file is provided by the package itself, by the
             environment its run dependencies make (the package installed with them), or by
             the C library and the compiler's runtime; no allowlist for anything else (CUDA
             libraries included): pyelftools reads the dynamic sections.
readable     the package file and the channel's index files are readable by everyone (a
             channel served from a shared folder or a web server).
dist-info    the Python parts carry a <name>-<version>.dist-info, so pip and
             importlib.metadata see them.
"""

from __future__ import annotations

import stat
from pathlib import Path

# Provided by the system on every Linux a conda package runs on: the C library (conda-forge's
# sysroot_linux-64 at build time) and the compiler's runtime (conda-forge's libgcc /
# libstdcxx, which the compilers' run_exports add; this machine's own where the offline
# channel uses the host compiler).
SYSTEM_LIBRARIES = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libutil.so.1",
    "ld-linux-x86-64.so.2",
    "libresolv.so.2",
    "libgcc_s.so.1",
    "libstdc++.so.6",
}
INDEX_FILES = ("repodata.json", "repodata.json.zst", "repodata_shards.msgpack.zst")


def elf_needed(path: Path) -> list[str] | None:
    """The DT_NEEDED entries of an ELF file (None when `path` is not an ELF file)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                return None
            fh.seek(0)
            elf = ELFFile(fh)
            needed = []
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    needed += [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
            return needed
    except (ELFError, OSError):
        return None


def shared_objects(root: Path) -> set[str]:
    """Names of the files (and symlinks) under `root` that a NEEDED entry can name."""
    return {p.name for p in root.rglob("*.so*") if p.is_file() or p.is_symlink()}


def linkage_problems(package_dir: Path, prefix: Path | None) -> list[str]:
    """NEEDED entries of the ELF files in the extracted package `package_dir` that neither the
    package, nor the installed environment `prefix` (None: not installed), nor the system give."""
    own = shared_objects(package_dir)
    env = shared_objects(prefix) if prefix is not None else set()
    problems = []
    for path in sorted(p for p in package_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.parts[len(package_dir.parts)] == "info":
            continue
        for lib in elf_needed(path) or []:
            if lib not in own and lib not in env and lib not in SYSTEM_LIBRARIES:
                problems.append(f"{path.relative_to(package_dir)} needs {lib}, which no run dependency provides")
    return problems


def readable_problems(package: Path) -> list[str]:
    """The package file and its channel's index files, where others cannot read them."""
    subdir = package.parent
    problems = []
    for path in [package, *(subdir / name for name in INDEX_FILES)]:
        if path.exists() and (path.stat().st_mode & 0o444) != 0o444:
            problems.append(f"{path.name} is mode {stat.filemode(path.stat().st_mode)}: not readable by everyone")
    return problems


def dist_info_problems(package_dir: Path, name: str, version: str) -> list[str]:
    """The dist-info of a package with Python parts (fuselet, fuselet-torch, fuselet-jax)."""
    stem = f"{name.replace('-', '_')}-{version}.dist-info"
    found = [p for p in package_dir.glob(f"**/site-packages/{stem}/METADATA")]
    if not found:
        return [f"no site-packages/{stem}: pip and importlib.metadata do not see {name}"]
    meta = found[0].read_text()
    if f"\nName: {name}\n" not in f"\n{meta}":
        return [f"{found[0].relative_to(package_dir)} does not name {name}"]
    return []
