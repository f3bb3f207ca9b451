"""Making the channel's packages: host packages, `python` from the interpreter, converted wheels."""
from __future__ import annotations

import errno
import os
import platform
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fuselet_build import _wheels
from fuselet_build._host import HostPackage
from fuselet_build._seed_common import Cache, SeedError
from fuselet_build._wheels import Target, WheelInfo

# Extra depends conda-forge's builds have and the wheels lack (the torch wheel does not
# declare numpy; a CUDA build needs a cuda-version it was built for).
EXTRA_DEPENDS = {"pytorch": ["numpy"]}
FLAVORED = {"pytorch", "jaxlib"}      # build strings cpu_py311_h..._0 / cuda130_py311_h..._200
CUDA_BUILD_NUMBER = 200               # conda-forge: CUDA builds +200 so the solver prefers them

RECIPES = Path(__file__).parent / "seed_recipes"

PYTHON_BUILD_BYTES = 400 * 2**20    # rattler-build's host prefix + work copy of the interpreter


# --- making packages -----------------------------------------------------------------------

def _timestamp(info: WheelInfo | None = None) -> datetime:
    return (info.timestamp if info and info.timestamp else datetime(2026, 1, 1, tzinfo=timezone.utc))


@contextmanager
def _tmpdir_env(path: Path) -> Iterator[None]:
    """assemble_package stages every file in a TempDir: keep it inside the cache (same disk,
    wiped on the next run) instead of /tmp."""
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old


@dataclass
class Options:
    compression_level: int = 3        # zstd level; 9+ costs minutes on the CUDA libraries
    compression_threads: int = max(1, os.cpu_count() or 1)


def make_host_package(cache: Cache, pkg: HostPackage, opts: Options) -> Path:
    import rattler_build

    work = cache.workdir(pkg.name)
    try:
        files = work / "files"
        files.mkdir()
        scripts = pkg.scripts()
        if scripts:
            for kind, text in zip(("activate", "deactivate"), scripts):
                d = files / "etc" / "conda" / f"{kind}.d"
                d.mkdir(parents=True)
                (d / f"{pkg.name}.sh").write_text(text)
        with _tmpdir_env(work):
            out = rattler_build.assemble_package(
                pkg.name, pkg.version, pkg.subdir, pkg.build, work / "out", files_dir=files,
                depends=pkg.depends or None, constrains=pkg.constrains or None, summary=pkg.summary,
                noarch="generic" if pkg.subdir == "noarch" else None, timestamp=_timestamp(),
                compression_level=opts.compression_level, compression_threads=opts.compression_threads,
                detect_prefix=False)
        return cache.store(out.path, pkg.subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def python_package_key(target: Target) -> str:
    texts = [p.read_text() for p in sorted((RECIPES / "python").iterdir()) if p.is_file()]
    exe = Path(sys.base_prefix) / "bin" / f"python{target.short}"
    st = exe.stat()
    return _wheels.short_hash(texts, sys.base_prefix, sys.version, st.st_size, st.st_mtime_ns)


def check_interpreter(target: Target) -> None:
    base = Path(sys.base_prefix)
    exe, lib = base / "bin" / f"python{target.short}", base / "lib" / f"python{target.short}"
    if str(base) in ("/usr", "/"):
        raise SeedError(f"the interpreter's prefix is {base}, the system's: the `python` package is made "
                        f"from a standalone prefix (pyenv, python-build-standalone); run seed with one")
    missing = [p for p in (exe, lib) if not p.exists()]
    if not list((base / "lib").glob(f"libpython{target.short}*.so*")):
        missing.append(base / "lib" / f"libpython{target.short}.so")
    if missing:
        raise SeedError(f"{base} is not a shared CPython prefix (missing {', '.join(map(str, missing))})")


def make_python_package(cache: Cache, target: Target, opts: Options, key: str) -> Path:
    """`python` from sys.base_prefix with the seed_recipes/python recipe (rattler-build)."""
    import rattler_build as rb

    work = cache.workdir("python")
    try:
        recipe = rb.Stage0Recipe.from_file(RECIPES / "python" / "recipe.yaml")
        ctx = {"src_prefix": sys.base_prefix, "py_version": platform.python_version(), "py_short": target.short,
               "py_nodot": target.nodot, "seed_hash": key}
        variants = recipe.render(rb.VariantConfig(), rb.RenderConfig(
            platform=rb.PlatformConfig(target_platform=target.subdir), extra_context=ctx))
        log = []

        class _Log:
            def on_log(self, e): log.append(f"[{e.level}] {e.message}")
            def on_build_step(self, e): log.append(f"== {e.step_name}: {e.message}")
            def on_download_start(self, e): pass
            def on_download_progress(self, e): pass
            def on_download_complete(self, e): pass

        try:
            with _tmpdir_env(work):
                result = variants[0].run_build(
                    tool_config=rb.ToolConfiguration(compression_threads=opts.compression_threads),
                    output_dir=work / "out", channels=[], progress_callback=_Log(),
                    package_format=f"conda:{opts.compression_level}")
        except Exception as exc:
            (cache.root / "python-build.log").write_text("\n".join(log))
            if shutil.disk_usage(cache.root).free < PYTHON_BUILD_BYTES:
                raise OSError(errno.ENOSPC, f"{exc} (log: {cache.root / 'python-build.log'})") from exc
            raise SeedError(f"building the `python` package from {sys.base_prefix} failed: {exc}\n"
                            f"  log: {cache.root / 'python-build.log'}") from exc
        return cache.store(Path(result.packages[0]), target.subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class WheelPlan:
    """One wheel's conversion, decided before any work (so the cache can be checked)."""

    info: WheelInfo
    name: str
    version: str
    subdir: str
    build: str
    build_number: int
    depends: list[str]
    noarch: str | None

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def plan_wheel(info: WheelInfo, target: Target, closure: dict[str, list[WheelInfo]],
               warn: Callable[[str], None] | None = None) -> WheelPlan:
    name = info.conda_name
    depends = _wheels.python_depends(info, target) + _wheels.conda_depends(info, target, closure, warn)
    depends += EXTRA_DEPENDS.get(name, [])
    flavor, number = None, 0
    if name in FLAVORED:
        flavor = "cpu"
        if info.torch_cuda:
            flavor = "cuda" + info.torch_cuda.replace(".", "")
            major, minor = info.torch_cuda.split(".")[:2]
            depends.append(f"cuda-version >={major}.{minor},<{int(major) + 1}")
            number = CUDA_BUILD_NUMBER
    depends = _wheels.merge_specs(depends)
    digest = _wheels.short_hash(_wheels.CONVERTER_VERSION, info.sha256, target, depends, flavor, number)
    return WheelPlan(info=info, name=name, version=info.conda_version,
                     subdir="noarch" if info.pure else target.subdir,
                     build=_wheels.build_string(info, target, digest, number, flavor), build_number=number,
                     depends=depends, noarch="python" if info.pure else None)


def convert_wheel(cache: Cache, plan: WheelPlan, target: Target, opts: Options,
                  update: Callable[..., None]) -> Path:
    import rattler_build

    info = plan.info
    work = cache.workdir(plan.name)
    try:
        files = work / "files"
        update(stage="extracting")
        _wheels.stage_wheel(info, files, target, on_bytes=lambda n: update(advance=n))
        update(stage=f"packing (zstd {opts.compression_level})")
        with _tmpdir_env(work):
            out = rattler_build.assemble_package(
                plan.name, plan.version, plan.subdir, plan.build, work / "out", files_dir=files,
                depends=plan.depends, build_number=plan.build_number, noarch=plan.noarch,
                summary=info.summary, license=info.license, homepage=info.homepage,
                description=f"Converted by `fuselet-build seed` from the wheel {info.path.name} "
                            f"(sha256 {info.sha256}).",
                timestamp=_timestamp(info), compression_level=opts.compression_level,
                compression_threads=opts.compression_threads, detect_prefix=False)
        return cache.store(out.path, plan.subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
