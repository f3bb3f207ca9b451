"""The libtorch / pytorch split of a torch wheel, as conda-forge's pytorch-cpu-feedstock makes it.

conda-forge ships torch as two packages (recipe/build.sh, outputs libtorch and pytorch):
  libtorch  the C++ library, free of Python: torch/lib/* (but libtorch_python) in $PREFIX/lib,
            torch/include/* in $PREFIX/include, torch/share/* (TorchConfig.cmake) in
            $PREFIX/share, torch/bin/* in $PREFIX/bin; build string cpu_<blas>_h<hash>_N
  pytorch   the Python package, pinning libtorch exactly; site-packages/torch/{lib,bin,share}
            entries are symlinks back into $PREFIX
conda-forge patches torch to look for its headers in $PREFIX/include; a wheel cannot be patched
here, so torch/include/* are symlinks back too. The NVIDIA libraries of a CUDA wheel are
Python-free packages in $PREFIX/lib/nvidia (fuselet_build.seed.nvidia), so libtorch holds no
Python and depends on none: the pytorch of every Python pins the same libtorch. The torch wheels
of one release carry interchangeable C++ libraries for every CPython (the same loaded bytes; only
unloaded symbol tables and a build folder differ: checked per file by same_libraries()), so the
pytorch of another Python is made from its own wheel's Python part and pinned to the libtorch of
the running Python's wheel. Its dist-info drops the nvidia-*
requirements (as a source-built torch has none): pip check sees them met by libtorch's packages.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

from fuselet_build.seed import nvidia
from fuselet_build.seed.cache import SeedError
from fuselet_build.seed.wheels import CONVERTER_VERSION, FLAVORED, Target, WheelPlan, build_string, short_hash

# torch/<folder> -> the prefix folder libtorch puts its entries in
MOVED = {"lib": "lib", "bin": "bin", "include": "include", "share": "share"}
STAYS_WITH_PYTHON = ("libtorch_python",)  # conda-forge keeps it in pytorch
# What of a torch wheel's dependencies the C++ library needs (the rest is Python's).
NATIVE = ("nvidia-", "cuda-version", "__cuda")


def split_plan(plan: WheelPlan, target: Target, libtorch: WheelPlan | None = None) -> tuple[WheelPlan, WheelPlan]:
    """(pytorch, libtorch) from the plan of a torch wheel: the same wheel, two packages.
    `libtorch`: an existing libtorch plan (of the same release, another Python's wheel) that the
    pytorch pins instead of its own wheel's."""
    native = [d for d in plan.depends if d.split(" ")[0].startswith(NATIVE)]
    if libtorch is None:
        digest = short_hash(
            CONVERTER_VERSION, "libtorch", plan.info.sha256, native, plan.flavor, plan.build_number, *nvidia.layout(plan.flavor)
        )
        build = FLAVORED["libtorch"].format(flavor=plan.flavor, digest=digest, number=plan.build_number)
        libtorch = dataclasses.replace(plan, name="libtorch", build=build, depends=native, part="libtorch")
    depends = [d for d in plan.depends if d not in native or d == "__cuda"]
    depends.append(f"libtorch =={libtorch.version} {libtorch.build}")
    digest = short_hash(CONVERTER_VERSION, plan.info.sha256, target, depends, plan.flavor, plan.build_number)
    pytorch = dataclasses.replace(
        plan, build=build_string(plan.info, target, digest, plan.build_number, plan.flavor), depends=depends, part="pytorch"
    )
    return pytorch, libtorch


# A wheel's build folder (pip's temporary one) is written into some of its text files.
BUILD_DIR = re.compile(rb"/tmp/tmp[A-Za-z0-9_]{8}/")


def same_libraries(a: Path, b: Path) -> list[str]:
    """The libtorch members (torch/lib, bin, include, share; not libtorch_python) in which the
    torch wheels `a` and `b` differ ([] when interchangeable). Members of equal size and CRC-32
    are the same; otherwise an ELF file must map the same bytes (its PT_LOAD segments: only the
    unloaded symbol table may differ) and a text file may differ only in the wheel build's
    temporary folder (ATenConfig.cmake names it)."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ma, mb = _libtorch_members(za), _libtorch_members(zb)
        differ = []
        for name in sorted(ma.keys() | mb.keys()):
            ia, ib = ma.get(name), mb.get(name)
            if ia is None or ib is None:
                differ.append(name)
            elif (ia.file_size, ia.CRC) != (ib.file_size, ib.CRC) and not _equivalent(za.read(ia), zb.read(ib)):
                differ.append(name)
        return differ


def _libtorch_members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    return {i.filename: i for i in zf.infolist() if not i.is_dir() and entry(i.filename)}


def _equivalent(x: bytes, y: bytes) -> bool:
    if x[:4] == y[:4] == b"\x7fELF":
        return _loaded(x) == _loaded(y)
    return BUILD_DIR.sub(b"/tmp/BUILD/", x) == BUILD_DIR.sub(b"/tmp/BUILD/", y)


def _loaded(elf: bytes) -> list[bytes]:
    """The bytes an ELF64 little-endian file maps: its PT_LOAD segments (and its program headers)."""
    if elf[4] != 2 or elf[5] != 1:
        return [elf]  # not ELF64 LE: compare it whole
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    out = [elf[phoff : phoff + phentsize * phnum]]
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            out.append(elf[p_offset : p_offset + p_filesz])
    return out


def entry(member: str) -> tuple[str, str] | None:
    """(folder, entry) when the torch wheel's `member` belongs to libtorch: torch/<folder>/<entry>..."""
    parts = member.split("/")
    if len(parts) < 3 or not parts[2] or parts[0] != "torch" or parts[1] not in MOVED:
        return None  # not libtorch's, or a folder entry (torch/include/)
    if parts[1] == "lib" and parts[2].startswith(STAYS_WITH_PYTHON):
        return None
    return parts[1], parts[2]


def keeps(part: str) -> Callable[[str], bool]:
    """Which wheel members one side stages: libtorch's own, or everything else (pytorch);
    the libraries (1.5 GB in a CUDA wheel) are never extracted for the pytorch side."""
    return lambda member: (entry(member) is not None) == (part == "libtorch")


def split_files(files: Path, target: Target, libtorch: Path, wheel: Path) -> None:
    """Move what libtorch holds from the staged torch `wheel` (`files`, staged whole or one
    side of it: keeps()) into `libtorch` (a staging folder of the same layout) and leave
    symlinks to it behind; the dist-info left with pytorch no longer requires what libtorch's
    own dependencies provide (nvidia-*)."""
    with zipfile.ZipFile(wheel) as zf:
        entries = sorted({e for m in zf.namelist() if (e := entry(m))})
    if not any(sub == "lib" for sub, _ in entries):
        raise SeedError(f"{wheel.name}: no torch/lib: not a torch wheel")
    torch = files / target.site_packages / "torch"
    for metadata in (files / target.site_packages).glob("torch-*.dist-info/METADATA"):
        lines = metadata.read_text().splitlines(keepends=True)
        metadata.write_text("".join(line for line in lines if not line.startswith(tuple(f"Requires-Dist: {n}" for n in NATIVE))))
    for sub, name in entries:
        src, dest = torch / sub / name, MOVED[sub]
        if src.exists():
            out = libtorch / dest / name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(src, out)
        src.parent.mkdir(parents=True, exist_ok=True)
        link_to = files / dest / name  # where the entry will be in the prefix
        src.symlink_to(os.path.relpath(link_to, src.parent))
