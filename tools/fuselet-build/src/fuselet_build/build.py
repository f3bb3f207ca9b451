"""`fuselet-build build`: build the rendered variants into an output channel.

Each variant is built on its own (rattler-build's Python API), so a failing variant does
not stop the others; its log goes to <output>/logs/<package>.log and the summary says why it
failed. Already-built packages are skipped.

Publication is atomic: rattler-build works in <output>/.staging (its output folder: work
folders, the package while its tests run, and links to the published packages: STAGING); only
a package whose tests passed is recorded in the manifest, linked into the output channel (an
atomic rename) and indexed (in a subprocess, into a staging folder moved in at the end:
fuselet_build.channel). A run killed at any point leaves every package and index entry of the
output channel as it was, or the new package complete and recorded; the next run drops what
was left under test in .staging (mirror_published) and goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fuselet_build import channel, matrix, paths
from fuselet_build.buildlog import BuildLog
from fuselet_build.errors import UserError
from fuselet_build.failpoints import failpoint
from fuselet_build.lock import folder_lock
from fuselet_build.seed.cache import atomic_write, sha256_file
from fuselet_build.sibling_pins import pinned_siblings


@dataclass
class Result:
    job: matrix.Job
    status: str  # built | exists | failed
    seconds: float = 0.0
    path: Path | None = None
    reason: str = ""

    @property
    def size(self) -> int:
        return self.path.stat().st_size if self.path and self.path.exists() else 0


def existing_package(output: Path, job: matrix.Job) -> Path | None:
    for ext in (".conda", ".tar.bz2"):
        p = output / job.subdir / f"{job.key}{ext}"
        if p.exists():
            return p
    return None


# --- what "built" means: a manifest of the packages this tool built and tested ----------------
# <output>/.fuselet-build-manifest.json: for every package built here, its sha256, the hash of
# fuselet's sources it was built from, and whether its tests ran and passed. A package file
# that is not in the manifest (an interrupted build, a failed test, a copy), that changed since,
# or that was built from other sources is not "built": build makes it again and verify fails it.
MANIFEST = ".fuselet-build-manifest.json"
# What the recipe compiles and packages (its tests are inline): a change here changes the packages.
SOURCE_PARTS = ("CMakeLists.txt", "cmake", "csrc", "python", "recipe")


def source_hash(root: Path) -> str:
    """sha256 over the names and contents of fuselet's sources under `root` (SOURCE_PARTS)."""
    h = hashlib.sha256()
    for part in SOURCE_PARTS:
        top = root / part
        files = [top] if top.is_file() else sorted(f for f in top.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
        for f in files:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def read_manifest(output: Path) -> dict:
    try:
        data = json.loads((output / MANIFEST).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record_built(output: Path, job: matrix.Job, path: Path, source: str, tested: bool, sha256: str | None = None) -> None:
    """Add `path` (in `output`; `sha256`: its hash, when it is still being moved there) to the
    manifest (readers see the old or the new manifest, never a part)."""
    data = read_manifest(output)
    data[job.key] = {
        "file": path.relative_to(output).as_posix(),
        "sha256": sha256 or sha256_file(path),
        "source": source,
        "tested": tested,
    }
    atomic_write(output / MANIFEST, json.dumps(data, indent=1, sort_keys=True))


# rattler-build's output folder: its work folders, the package under test, and hard links to
# the published packages. It is the channel the builds see the published packages through:
# rattler-build re-reads its own output folder before every build, while it keeps what it read
# of any other local channel for the life of the process (a package published after the first
# build would stay invisible to the next ones). Never served.
STAGING = ".staging"


def mirror_published(output: Path, staging: Path) -> None:
    """The staging folder's packages become exactly the published ones (hard links): what an
    earlier, killed run left under test there goes."""
    for sub in channel.SUBDIRS:
        (staging / sub).mkdir(parents=True, exist_ok=True)
        published = {p.name for ext in ("*.conda", "*.tar.bz2") for p in (output / sub).glob(ext)}
        for ext in ("*.conda", "*.tar.bz2"):
            for p in (staging / sub).glob(ext):
                if p.name not in published or not os.path.samefile(p, output / sub / p.name):
                    p.unlink()
        for name in published:
            if not (staging / sub / name).exists():
                channel.link_into(output / sub / name, staging / sub / name)


def unstage(staging: Path, job: matrix.Job) -> None:
    """Remove `job`'s package from the staging folder (before it is made again: never written
    through a hard link into the published file; after its tests failed)."""
    path = existing_package(staging, job)
    if path is not None:
        path.unlink()


def forget_extracted(job: matrix.Job) -> None:
    """rattler's package cache keeps each extracted package under name-version-build: a package
    made again under the same name (other sources, same variant) would be tested and installed
    from the old extraction. Drop it before the build."""
    pkgs = paths.rattler_cache() / "pkgs"
    shutil.rmtree(pkgs / job.key, ignore_errors=True)
    (pkgs / f"{job.key}.lock").unlink(missing_ok=True)


def publish(staged: Path, output: Path, job: matrix.Job, source: str, tested: bool) -> Path:
    """Put a package that passed its tests into the output channel: manifest first, then the
    file (a hard link renamed into place: atomic), then the index. The staged file stays, as
    the staging folder's link to it."""
    dest = output / job.subdir / staged.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    record_built(output, job, dest, source, tested, sha256=sha256_file(staged))
    failpoint("publish")
    channel.link_into(staged, dest)
    channel.index(output)
    return dest


def package_state(output: Path, job: matrix.Job, source: str | None, tested: bool = True) -> tuple[Path | None, str]:
    """(the package file or None, why it does not count as built: "" when it does). `source`:
    the sources' hash it must have been built from (None: any)."""
    from rattler_build import Package

    path = existing_package(output, job)
    if path is None:
        return None, "not built"
    entry = read_manifest(output).get(job.key)
    if not isinstance(entry, dict) or entry.get("file") != path.relative_to(output).as_posix():
        return path, "not recorded as built and tested by fuselet-build (an interrupted build, a failed test, a copy?)"
    if entry.get("sha256") != sha256_file(path):
        return path, "the file changed since it was built (sha256 differs)"
    if source is not None and entry.get("source") != source:
        return path, "fuselet's sources changed since it was built"
    if tested and not entry.get("tested"):
        return path, "built without its tests (--no-test)"
    try:
        pkg = Package.from_file(str(path))
        name, version, build_string = str(pkg.name), str(pkg.version), str(pkg.build_string)
    except Exception as exc:  # a damaged archive
        return path, f"the archive cannot be read ({str(exc).strip()[:120]})"
    if (name, version, build_string) != (job.name, job.version, job.build_string):
        return path, f"its index.json says {name} {version} {build_string}"
    return path, ""


# How a full disk shows in rattler-build's errors, its build log, and Python's OSError.
_NO_SPACE = re.compile(r"No space left on device|os error 28|StorageFull|\[Errno 28\]")


def out_of_space(message: str, log_path: Path) -> bool:
    """Whether a build failed for want of disk space (its error or the end of its log says so)."""
    tail = log_path.read_text(errors="replace")[-20000:] if log_path.exists() else ""
    return bool(_NO_SPACE.search(message) or _NO_SPACE.search(tail))


def no_space_reason(output: Path, log_path: Path) -> str:
    free = shutil.disk_usage(output).free / 2**20
    return (
        f"no space left on the disk of {output} ({free:.0f} MiB free now): the channel's index is unchanged; "
        f"free some space and run again (log: {log_path})"
    )


def drop_old_work(staging: Path, job: matrix.Job, before: float) -> None:
    """rattler-build keeps the work folder of a failed build (bld/rattler-build_<name>, or
    rattler-build_<name>_<id> from builds with a build id), for its log and sources; it goes
    when that package (or another variant of it) is built again."""
    # The id-less one is this build's own: never reused (another variant's environments).
    shutil.rmtree(staging / "bld" / f"rattler-build_{job.name}", ignore_errors=True)
    for work in (staging / "bld").glob(f"rattler-build_{job.name}_*"):
        if work.is_dir() and work.stat().st_mtime < before:
            shutil.rmtree(work, ignore_errors=True)


def check_space(output: Path, need_gb: float = 2.0) -> None:
    output.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(output).free / 2**30
    if free < need_gb:
        raise UserError(
            f"--output: only {free:.1f} GiB free at {output}; a build needs about {need_gb:.0f} GiB. "
            f"Free some space or choose another --output."
        )


def build(
    recipe: Path,
    variant_files: list[Path],
    output: Path,
    channels: list[str],
    *,
    select: list[str] | None = None,
    skip_existing: bool = True,
    test: bool = True,
    show_progress: bool = True,
) -> list[Result]:
    """Build the selected variants into `output`; one build per output folder at a time."""
    with folder_lock(output, "fuselet-build build", UserError):
        return _build(
            recipe,
            variant_files,
            output,
            channels,
            select=select,
            skip_existing=skip_existing,
            test=test,
            show_progress=show_progress,
        )


def _build(
    recipe: Path,
    variant_files: list[Path],
    output: Path,
    channels: list[str],
    *,
    select: list[str] | None,
    skip_existing: bool,
    test: bool,
    show_progress: bool,
) -> list[Result]:
    from rattler_build import ToolConfiguration

    rendered = matrix.select(matrix.render(recipe, variant_files), select, key=lambda r: matrix.job_of(r).key)
    check_space(output)
    logs = output / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    staging = output / STAGING
    mirror_published(output, staging)
    if not all((output / s / "repodata.json").exists() for s in channel.SUBDIRS):
        channel.index(output)
    # fuselet-build decides what exists (package_state), so rattler-build never skips on its own.
    tool = ToolConfiguration(
        test_strategy="native" if test else "skip", skip_existing="none", compression_threads=2, use_zstd=True, use_bz2=False
    )
    source = source_hash(recipe.resolve().parent.parent)
    results: list[Result] = []
    run_start = time.time()
    disk_full = ""
    paths.scripts_on_path()
    progress = _progress() if show_progress else None
    try:
        if progress is not None:
            progress.start()
        failed: set[str] = set()
        for r in rendered:
            job = matrix.job_of(r)
            found, why = package_state(output, job, source, tested=test)
            if skip_existing and found is not None and not why:
                results.append(Result(job, "exists", path=found))
                continue
            rebuild = f"rebuilt: {why}" if found is not None and why else ""
            if disk_full:
                # every later build would fail the same way, leaving a work folder each
                results.append(Result(job, "failed", reason=f"not built: {disk_full}"))
                continue
            unstage(staging, job)
            drop_old_work(staging, job, run_start)
            forget_extracted(job)
            core = f"libfuselet-{str(job.variant.get('libfuselet', '')).replace(' ', '-')}"
            if core in failed:
                # Never build a framework package against some other core than its pinned one.
                results.append(Result(job, "failed", reason=f"not built: it pins {core}, which failed"))
                failed.add(job.key)
                continue
            cuda = str(job.variant.get("cuda_compiler_version", "None"))
            if cuda != "None" and not channel.has_cuda_driver():
                # No GPU driver here: declare one (as conda's CONDA_OVERRIDE_CUDA does) so the test
                # environment of a CUDA package solves; its tests exercise the CPU paths.
                os.environ["CONDA_OVERRIDE_CUDA"] = cuda
            task = progress.add_task(job.key, step="render", total=None) if progress else None
            log = BuildLog(logs / f"{job.key}.log", on_step=_stepper(progress, task))
            start = time.monotonic()
            try:
                r._siblings = pinned_siblings(r)
                # No build id: the work folder of a package has one path from build to build, so
                # the compiler cache (scripts/env.sh: sccache, which strips the source tree's
                # path from its keys) hits when it is built again.
                r.run_build(tool_config=tool, output_dir=str(staging), channels=channels, progress_callback=log, no_build_id=True)
                staged = existing_package(staging, job)
                status, reason = (
                    ("built", rebuild) if staged else ("failed", "rattler-build reported success but wrote no package")
                )
                path = publish(staged, output, job, source, tested=test) if staged else None
            except KeyboardInterrupt:
                results.append(Result(job, "failed", time.monotonic() - start, reason="interrupted"))
                raise  # the next run's mirror_published drops an untested package
            except Exception as exc:  # one variant failing must not stop the others
                path, status = None, "failed"
                log.close()
                log_path = logs / f"{job.key}.log"
                if out_of_space(f"{exc} {log.error or ''}", log_path):
                    reason = no_space_reason(output, log_path)
                    disk_full = f"the disk of {output} is full"
                else:
                    reason = explain_failure(str(exc), r, channels, output, log_path)
            finally:
                log.close()
            if status == "failed":
                failed.add(job.key)
                unstage(staging, job)  # a package whose tests failed is never published
            results.append(Result(job, status, time.monotonic() - start, path, reason))
            if progress is not None:
                progress.update(task, step=status, completed=1, total=1)
    finally:
        if progress is not None:
            progress.stop()
        try:  # keep the output channel's repodata valid, interrupted or not
            if channel.index_is_stale(output):
                channel.index(output)
        except UserError:
            if not disk_full:
                raise  # else the index of before stays, and the failed package says why
    return results


# Log lines worth quoting when a build fails (compiler, CMake, linker, solver).
_CULPRITS = re.compile(
    r"(CMake Error|error:|Error:|FAILED:|undefined reference|nothing provides|cannot be solved|"
    r"AssertionError|ImportError|ModuleNotFoundError|Traceback)"
)


def explain_failure(message: str, rendered, channels: list[str], output: Path, log_path: Path) -> str:
    """A short reason: the solver's explanation for unsolvable environments (which package is
    missing), else the first telling lines of the build log."""
    first = message.strip().splitlines()[0] if message.strip() else "build failed"
    if "resolve" in message.lower() or "solve" in message.lower():
        reason = channel.why_unsolvable(rendered, channels + [str(output)])
        if reason:
            return f"{first}: {reason}"
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    culprits = [ln.removeprefix("[info] ").strip() for ln in lines if _CULPRITS.search(ln)]
    detail = " | ".join(dict.fromkeys(culprits[:3]))
    return f"{first}{': ' + detail if detail else ''} (log: {log_path})"


def _stepper(progress, task):
    """The progress line's `step` field, told by the build log (None without a display)."""
    if progress is None:
        return None
    return lambda step: progress.update(task, step=step)


def _progress():
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("[dim]{task.fields[step]}"),
        TimeElapsedColumn(),
        transient=False,
    )


def print_summary(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fuselet-build: packages")
    for col in ("package", "build string", "status", "seconds", "size", "note"):
        table.add_column(col)
    for r in results:
        size = f"{r.size / 2**20:.1f} MiB" if r.size else ""
        style = {"built": "green", "exists": "cyan", "failed": "red"}[r.status]
        table.add_row(r.job.name, r.job.build_string, f"[{style}]{r.status}", f"{r.seconds:.0f}", size, r.reason[:300])
    console = Console(width=200)
    console.print(table)
    for r in results:  # whole, unwrapped: what a CI log search or a bug report needs
        if r.status == "failed":
            console.print(f"FAILED {r.job.key}: {r.reason}", soft_wrap=True, markup=False, highlight=False)
