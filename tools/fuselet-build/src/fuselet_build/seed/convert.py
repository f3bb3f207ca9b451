"""One planned wheel (fuselet_build.seed.wheels.plan_wheel) made into a conda package: staged,
split into libtorch / pytorch where the plan is one side of a torch wheel (seed.libtorch),
relocated for the NVIDIA libraries (seed.nvidia), and packed by rattler_build.

Above both wheels and libtorch: libtorch builds on the plans of wheels, and this module on both.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from fuselet_build.seed import libtorch, nvidia
from fuselet_build.seed.cache import Cache, Options, timestamp, tmpdir_env
from fuselet_build.seed.wheels import Target, WheelPlan, stage_wheel


def convert_wheel(cache: Cache, plan: WheelPlan, target: Target, opts: Options, update: Callable[..., None]) -> Path:
    import rattler_build

    info = plan.info
    work = cache.workdir(plan.name)
    try:
        files = work / "files"
        update(stage="extracting")
        keep = None
        if plan.part is not None:
            keep = libtorch.keeps(plan.part)
        for wheel in (info, *plan.bundled):
            stage_wheel(wheel, files, target, on_bytes=lambda n: update(advance=n), keep=keep)
        if plan.part is not None:
            native = work / "libtorch"
            libtorch.split_files(files, target, native, info.path)
            if plan.part == "libtorch":
                files = native
        if plan.flavor and plan.flavor.startswith("cuda"):
            # what the wheel found in site-packages/nvidia is in lib/nvidia (seed.nvidia)
            moved = {"lib": f"{target.site_packages}/torch/lib"} if plan.part == "libtorch" else None
            nvidia.relocate_runpaths(files, target.site_packages, moved)
        update(stage=f"packing (zstd {opts.compression_level})")
        with tmpdir_env(work):
            out = rattler_build.assemble_package(
                plan.name,
                plan.version,
                plan.subdir,
                plan.build,
                work / "out",
                files_dir=files,
                depends=plan.depends,
                build_number=plan.build_number,
                noarch=plan.noarch,
                summary=info.summary,
                license=info.license,
                homepage=info.homepage,
                description="Converted by `fuselet-build seed` from "
                + ", ".join(f"the wheel {w.path.name} (sha256 {w.sha256})" for w in (info, *plan.bundled))
                + ".",
                timestamp=timestamp(info.timestamp),
                compression_level=opts.compression_level,
                compression_threads=opts.compression_threads,
                detect_prefix=False,
            )
        return cache.store(out.path, plan.subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
