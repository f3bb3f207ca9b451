"""Wheels -> conda packages for the offline channel (see fuselet_build.seed).

A wheel is read (METADATA, WHEEL, entry_points.txt), its Requires-Dist turned into conda
`depends` for one target (linux-64, one CPython): environment markers evaluated, extras
expanded into the requirements they stand for (torch needs `cuda-toolkit[cublas,...]`), PEP 440
specifiers rewritten as conda match specs, names mapped to conda-forge's (torch -> pytorch).
The files are laid out as conda installs them and packed by rattler_build.assemble_package:
  pure wheels (py3-none-any)  noarch: python  site-packages/..., python-scripts/...
  NVIDIA's library wheels     linux-64        lib/nvidia/..., no python (fuselet_build.seed.nvidia)
  every other wheel           linux-64        lib/pythonX.Y/site-packages/..., bin/...
Console scripts become small relocatable wrappers (they find the env's python next to
themselves, so no prefix placeholder is needed: assemble_package records none).
"""

from __future__ import annotations

import email.parser
import hashlib
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fuselet_build.seed import nvidia
from fuselet_build.seed.cache import sha256_file

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

# Bump when the layout or the metadata mapping changes: it enters every build-string hash,
# so old cached conversions are not reused.
CONVERTER_VERSION = "2"

# PyPI name (canonical) -> conda-forge name, where they differ beyond normalization.
CONDA_NAMES = {
    "torch": "pytorch",
    "ml-dtypes": "ml_dtypes",
    "opt-einsum": "opt_einsum",
    "typing-extensions": "typing_extensions",
}


# Extra depends conda-forge's builds have and the wheels lack (the torch wheel does not
# declare numpy; a CUDA build needs a cuda-version it was built for).
EXTRA_DEPENDS = {"pytorch": ["numpy"]}
# Flavored packages: build strings and build numbers as their feedstocks write them
# (variants/conda-forge-snapshot.yaml names the files):
#   pytorch  cpu_mkl_py311_h<hash>_100, cuda130_mkl_py311_h<hash>_300   (the PyPI wheels link MKL)
#   jaxlib   cpu_py311h<hash>_0,        cuda130_py311h<hash>_200         (no "_" before the hash)
#   libtorch cpu_mkl_h<hash>_100,       cuda130_mkl_h<hash>_300          (no python)
FLAVORED = {
    "pytorch": "{flavor}_mkl_py{py}_h{digest}_{number}",
    "jaxlib": "{flavor}_py{py}h{digest}_{number}",
    "libtorch": "{flavor}_mkl_h{digest}_{number}",
}  # libtorch: see fuselet_build.seed.libtorch
BLAS_BUILD_NUMBER = {"pytorch": 100}  # pytorch-cpu-feedstock: mkl builds +100
CUDA_BUILD_NUMBER = 200  # conda-forge: CUDA builds +200 so the solver prefers them
# The CUDA jaxlib of conda-forge is jaxlib with the CUDA plugin wheels inside it (jaxlib-feedstock
# recipe/build.sh pip-installs jax_cudaXX_plugin and jax_cudaXX_pjrt into the same package).
JAX_CUDA_PLUGIN = re.compile(r"^jax-cuda(\d+)-(plugin|pjrt)$")


@dataclass(frozen=True)
class Target:
    """The platform and interpreter the channel is made for."""

    python: tuple[int, int] = (3, 11)
    subdir: str = "linux-64"

    @property
    def short(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    @property
    def nodot(self) -> str:
        return f"{self.python[0]}{self.python[1]}"

    @property
    def site_packages(self) -> str:
        return f"lib/python{self.short}/site-packages"

    def marker_env(self, extra: str = "") -> dict[str, str]:
        assert self.subdir == "linux-64", "only linux-64 markers are modelled"
        return {
            "implementation_name": "cpython",
            "implementation_version": f"{self.short}.0",
            "os_name": "posix",
            "platform_machine": "x86_64",
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": f"{self.short}.0",
            "python_version": self.short,
            "sys_platform": "linux",
            "extra": extra,
        }

    def python_pin(self) -> list[str]:
        """The depends of a package installed under lib/pythonX.Y (+ the ABI for cpXY wheels)."""
        nxt = f"{self.python[0]}.{self.python[1] + 1}"
        return [f"python >={self.short},<{nxt}.0a0"]

    def abi_pin(self) -> str:
        return f"python_abi {self.short}.* *_cp{self.nodot}"


@dataclass
class WheelInfo:
    """What the conversion needs from one wheel file (read without extracting it)."""

    path: Path
    sha256: str
    name: str  # as in METADATA
    version: str  # PEP 440, with any local part (+cpu)
    requires_dist: list[str]
    requires_python: str | None
    tags: list[str]  # from WHEEL, e.g. ["cp311-cp311-manylinux_2_28_x86_64"]
    entry_points: dict[str, str] = field(default_factory=dict)  # script name -> "module:attr"
    summary: str | None = None
    license: str | None = None
    homepage: str | None = None
    timestamp: datetime | None = None
    torch_cuda: str | None = None  # torch only: torch/version.py `cuda` ("13.0") or None

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)

    @property
    def conda_name(self) -> str:
        return conda_name(self.name)

    @property
    def conda_version(self) -> str:
        return conda_version(self.version)

    @property
    def pure(self) -> bool:
        """py3-none-any: installs unchanged for any python 3 -> noarch: python."""
        return all(t.endswith("-none-any") for t in self.tags)

    @property
    def native(self) -> bool:
        """NVIDIA's libraries for any Python 3 (py3-none-<platform>) -> a Python-free package."""
        return nvidia.is_native(self.key, self.tags)

    @property
    def python_independent(self) -> bool:
        """The same package for every Python: pure (noarch) or native."""
        return self.pure or self.native

    @property
    def cpython_abi(self) -> bool:
        """Built for one CPython ABI (cp311-cp311-...), not abi3 nor `none`."""
        return any(re.match(r"cp\d+-cp\d+", t) for t in self.tags)


def read_wheel(path: Path, sha256: str | None = None) -> WheelInfo:
    """Metadata of a wheel file; raises ValueError naming the file when it is not a wheel."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{path.name} is not a readable wheel: {exc}") from exc
    with zf:
        names = zf.namelist()
        dist_info = sorted({n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")})
        if not dist_info:
            raise ValueError(f"{path.name} has no .dist-info folder: not a wheel")
        di = dist_info[0]
        meta = email.parser.HeaderParser().parsestr(zf.read(f"{di}/METADATA").decode("utf-8", "replace"))
        wheel = email.parser.HeaderParser().parsestr(zf.read(f"{di}/WHEEL").decode("utf-8", "replace"))
        eps = {}
        if f"{di}/entry_points.txt" in names:
            eps = parse_entry_points(zf.read(f"{di}/entry_points.txt").decode("utf-8", "replace"))
        torch_cuda = None
        if "torch/version.py" in names:
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", zf.read("torch/version.py").decode(), re.M)
            torch_cuda = m.group(1) if m else None
        newest = max((datetime(*i.date_time, tzinfo=timezone.utc) for i in zf.infolist()), default=None)
    home = meta.get("Home-page")
    for url in meta.get_all("Project-URL") or []:
        label, _, value = url.partition(",")
        if not home and label.strip().lower() in ("homepage", "home", "source", "repository"):
            home = value.strip()
    return WheelInfo(
        path=path,
        sha256=sha256 or sha256_file(path),
        name=meta["Name"],
        version=meta["Version"],
        requires_dist=list(meta.get_all("Requires-Dist") or []),
        requires_python=meta.get("Requires-Python"),
        tags=list(wheel.get_all("Tag") or []),
        entry_points=eps,
        summary=meta.get("Summary"),
        license=meta.get("License-Expression") or _short_license(meta.get("License")),
        homepage=home,
        timestamp=newest,
        torch_cuda=torch_cuda,
    )


def _short_license(text: str | None) -> str | None:
    if not text or "\n" in text.strip() or len(text) > 80:
        return None  # a whole license text, not an identifier
    return text.strip() or None


def parse_entry_points(text: str) -> dict[str, str]:
    """console_scripts and gui_scripts of an entry_points.txt: {script: "module:attr"}."""
    out, section = {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        if section in ("console_scripts", "gui_scripts") and "=" in line:
            name, _, target = line.partition("=")
            out[name.strip()] = target.split("[", 1)[0].strip()
    return out


# --- names, versions, specs ---------------------------------------------------------------


def conda_name(pypi_name: str) -> str:
    key = canonicalize_name(pypi_name)
    return CONDA_NAMES.get(key, key)


def conda_version(version: str) -> str:
    """PEP 440 -> conda: the local part (+cpu, +cu130) goes; the flavor is in the build string."""
    v = Version(version)
    return v.public


def _spec_clause(op: str, ver: str) -> str:
    ver = ver.split("+", 1)[0]
    if op == "===":
        return f"=={ver}"
    if op == "==" and ver.endswith(".*"):
        return ver  # ==1.2.* -> 1.2.*
    if op == "!=" and ver.endswith(".*"):
        return f"!={ver}"
    if op == "~=":  # ~=1.4.5 -> >=1.4.5,1.4.*
        parts = ver.split(".")
        release = [p for p in parts if p.isdigit()] or parts
        prefix = ".".join(release[:-1]) if len(release) > 1 else release[0]
        return f">={ver},{prefix}.*"
    return f"{op}{ver}"


def conda_spec(specifier: SpecifierSet | str) -> str:
    """PEP 440 specifier set -> the version part of a conda match spec ('' for any)."""
    spec = SpecifierSet(str(specifier))
    clauses = sorted((_spec_clause(s.operator, s.version) for s in spec), key=_clause_order)
    return ",".join(clauses)


def _clause_order(clause: str) -> tuple[int, str]:
    # lower bounds first, then upper bounds, then the rest (purely cosmetic, stable)
    return (0 if clause.startswith(">") else 1 if clause.startswith("<") else 2, clause)


def merge_specs(depends: Iterable[str]) -> list[str]:
    """One entry per package name: 'a >=1' + 'a <2' -> 'a >=1,<2' (order of first appearance)."""
    merged: dict[str, list[str]] = {}
    for dep in depends:
        name, _, ver = dep.partition(" ")
        clauses = merged.setdefault(name, [])
        for c in filter(None, ver.split(",")):
            if c not in clauses:
                clauses.append(c)
    return [f"{n} {','.join(c)}".strip() for n, c in merged.items()]


def conda_depends(
    info: WheelInfo,
    target: Target,
    closure: dict[str, list[WheelInfo]] | None = None,
    warn: Callable[[str], None] | None = None,
    extra: str = "",
) -> list[str]:
    """Requires-Dist of `info` as conda depends for `target`, installed with `extra` (if any).

    Requirements whose markers are false for the target (including every other `extra == ...`
    one) are dropped. A requirement with extras, `X[a,b]`, becomes `X` plus the requirements
    X declares for extras a and b (found in `closure`: canonical name -> wheels resolved
    together with this one); without X's metadata the extras are dropped with a warning.
    """
    closure = closure or {}
    out: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()

    def add(req: Requirement, extra: str) -> None:
        if req.marker is not None and not req.marker.evaluate(target.marker_env(extra)):
            return
        name = conda_name(req.name)
        ver = conda_spec(req.specifier)
        out.append(f"{name} {ver}".strip())
        if req.extras:
            key = (canonicalize_name(req.name), frozenset(req.extras))
            if key in seen:
                return
            seen.add(key)
            provider = _pick(closure.get(canonicalize_name(req.name), []), req.specifier)
            if provider is None:
                if warn:
                    warn(f"{info.name}: extras {sorted(req.extras)} of {req.name} dropped (no metadata for it)")
                return
            for sub in provider.requires_dist:
                sub_req = Requirement(sub)
                for e in sorted(req.extras):
                    if (
                        sub_req.marker is not None
                        and sub_req.marker.evaluate(target.marker_env(e))
                        and not sub_req.marker.evaluate(target.marker_env(""))
                    ):
                        add(Requirement(_strip_marker(sub)), "")
                        break

    for raw in info.requires_dist:
        add(Requirement(raw), extra)
    return merge_specs(out)


def _strip_marker(req: str) -> str:
    return req.split(";", 1)[0].strip()


def _pick(candidates: list[WheelInfo], specifier: SpecifierSet) -> WheelInfo | None:
    for c in sorted(candidates, key=lambda w: Version(w.version), reverse=True):
        if specifier.contains(Version(c.version), prereleases=True):
            return c
    return candidates[0] if candidates else None


def python_depends(info: WheelInfo, target: Target) -> list[str]:
    """The python (+ python_abi) entries of a converted wheel's depends."""
    if info.native:
        return []
    if info.pure:
        spec = conda_spec(info.requires_python) if info.requires_python else ""
        return [f"python {spec}".strip()]
    deps = target.python_pin()
    if info.cpython_abi:
        deps.append(target.abi_pin())
    return deps


def short_hash(*parts: object) -> str:
    """7 hex digits over the parts: the h<hash> of a build string."""
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:7]


def build_string(info: WheelInfo, target: Target, digest: str, number: int = 0, flavor: str | None = None) -> str:
    """conda-forge style: pyh<hash>_0 (noarch), h<hash>_0 (native, no python), py311h<hash>_0,
    or the form of FLAVORED for flavored packages (pytorch, jaxlib)."""
    if info.native:
        return f"h{digest}_{number}"
    if info.pure:
        return f"pyh{digest}_{number}"
    if flavor:
        return FLAVORED[info.conda_name].format(flavor=flavor, py=target.nodot, digest=digest, number=number)
    return f"py{target.nodot}h{digest}_{number}"


# --- the file layout -----------------------------------------------------------------------

WRAPPER = """#!/bin/sh
'''exec' "$(dirname -- "$(realpath -- "$0")")/python" "$0" "$@"
' '''
# -*- coding: utf-8 -*-
# {name}: console script of the {dist} wheel; runs with the python next to it.
import re
import sys
from {module} import {head}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({call}())
"""


def script_wrapper(name: str, target: str, dist: str) -> str:
    """A console-script launcher that needs no prefix rewriting (a POSIX sh / Python polyglot,
    the form pip uses for long shebangs): it execs the `python` in its own directory."""
    module, _, attr = target.partition(":")
    attr = attr.strip() or "main"
    head = attr.split(".", 1)[0]
    return WRAPPER.format(name=name, dist=dist, module=module.strip(), head=head, call=attr)


def _place(member: str, data_dir: str, sp: str, bin_dir: str, target: Target, dist: str) -> str | None:
    """Where a wheel member goes in the package (None: skip)."""
    if member.startswith(data_dir + "/"):
        kind, _, rest = member[len(data_dir) + 1 :].partition("/")
        if not rest:
            return None
        if kind == "scripts":
            return f"{bin_dir}/{rest}"
        if kind == "data":
            return rest
        if kind == "headers":
            return f"include/python{target.short}/{dist}/{rest}"
        if kind in ("purelib", "platlib"):
            return f"{sp}/{rest}"
        return None
    return f"{sp}/{member}"


def stage_wheel(
    info: WheelInfo,
    dest: Path,
    target: Target,
    on_bytes: Callable[[int], None] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> int:
    """Extract `info` into `dest` in its conda layout (the members `keep` accepts, default
    all); returns the number of files."""
    noarch = info.pure
    sp = "site-packages" if noarch else target.site_packages
    bin_dir = "python-scripts" if noarch else "bin"
    count = 0
    with zipfile.ZipFile(info.path) as zf:
        data_dir = next(
            (n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".data")),
            f"{info.name}-{info.version}.data",
        )
        dist_info = next(n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info"))
        for zi in zf.infolist():
            if zi.is_dir() or (keep is not None and not keep(zi.filename)):
                continue
            rel = (
                nvidia.place(zi.filename, dist_info, info.conda_name)
                if info.native
                else _place(zi.filename, data_dir, sp, bin_dir, target, info.name)
            )
            if rel is None or zi.filename == f"{dist_info}/INSTALLER":
                continue
            out = dest / rel
            if not out.resolve().is_relative_to(dest.resolve()):
                raise ValueError(f"{info.path.name}: member {zi.filename!r} escapes the package")
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(zi) as src, open(out, "wb") as dst:
                first = src.read(1 << 16)
                if rel.startswith(bin_dir + "/") and first.startswith(b"#!python"):
                    # a `#!python` script of .data/scripts: the same relocatable launcher
                    body = first.split(b"\n", 1)[1] if b"\n" in first else b""
                    dst.write(WRAPPER.split("# -*-")[0].encode() + body)
                else:
                    dst.write(first)
                shutil.copyfileobj(src, dst, 1 << 20)
            mode = (zi.external_attr >> 16) & 0o777
            executable = rel.startswith(bin_dir + "/") or bool(mode & 0o111)
            os.chmod(out, 0o755 if executable else 0o644)
            count += 1
            if on_bytes:
                on_bytes(zi.file_size)
    di = dest / sp / dist_info
    if di.is_dir() and not info.native:
        (di / "INSTALLER").write_text("conda\n")
        count += 1
    for script, ep in sorted(info.entry_points.items()):
        out = dest / bin_dir / script
        if out.exists():
            continue  # the wheel ships the program itself (e.g. ninja in .data/scripts)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(script_wrapper(script, ep, info.name))
        out.chmod(0o755)
        count += 1
    return count


def uncompressed_size(info: WheelInfo) -> int:
    with zipfile.ZipFile(info.path) as zf:
        return sum(i.file_size for i in zf.infolist())


# --- wheel -> conda package ------------------------------------------------------------------


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
    bundled: tuple[WheelInfo, ...] = ()  # wheels packed into the same package (CUDA jaxlib)
    part: str | None = None  # "libtorch" / "pytorch": one side of a torch wheel
    flavor: str | None = None  # "cpu" / "cuda130" of a FLAVORED package

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def plan_wheel(
    info: WheelInfo,
    target: Target,
    closure: dict[str, list[WheelInfo]],
    warn: Callable[[str], None] | None = None,
    bundle: tuple[WheelInfo, ...] = (),
) -> WheelPlan:
    """How `info` becomes a conda package; `bundle`: the CUDA plugin wheels of a CUDA jaxlib."""
    name = info.conda_name
    depends = python_depends(info, target) + conda_depends(info, target, closure, warn)
    depends += EXTRA_DEPENDS.get(name, [])
    cuda = info.torch_cuda
    if bundle:
        cuda = f"{JAX_CUDA_PLUGIN.match(bundle[0].key).group(1)}.0"
        depends += bundle_depends(bundle, target, closure, warn)
    flavor, number = None, 0
    if name in FLAVORED:
        flavor, number = "cpu", BLAS_BUILD_NUMBER.get(name, 0)
        if cuda:
            flavor = "cuda" + cuda.replace(".", "")
            major, minor = cuda.split(".")[:2]
            depends += [f"cuda-version >={major}.{minor},<{int(major) + 1}", "__cuda"]
            number += CUDA_BUILD_NUMBER
    depends = merge_specs(depends)
    # a Python-independent package is the same for every target python
    for_target = target.subdir if info.python_independent else target
    digest = short_hash(
        CONVERTER_VERSION, info.sha256, [b.sha256 for b in bundle], for_target, depends, flavor, number, *nvidia.layout(flavor)
    )
    return WheelPlan(
        info=info,
        name=name,
        version=info.conda_version,
        subdir="noarch" if info.pure else target.subdir,
        build=build_string(info, target, digest, number, flavor),
        build_number=number,
        depends=depends,
        noarch="python" if info.pure else None,
        bundled=bundle,
        flavor=flavor,
    )


def bundle_depends(
    bundle: tuple[WheelInfo, ...], target: Target, closure: dict[str, list[WheelInfo]], warn: Callable[[str], None] | None = None
) -> list[str]:
    """The CUDA libraries the plugin wheels ask for (their `with-cuda` extra), as conda depends;
    what the channel lacks is left out with a warning, the bundled wheels themselves too."""
    inside = {b.conda_name for b in bundle}
    in_channel = {conda_name(key) for key in closure}
    out = []
    for b in bundle:
        for dep in conda_depends(b, target, closure, warn, extra="with-cuda"):
            name = dep.split(" ", 1)[0]
            if name in inside:
                continue
            if name not in in_channel:
                if warn:
                    warn(f"CUDA jaxlib {b.version}: {name} is not in the channel; left out of its depends")
                continue
            out.append(dep)
    return out


def cuda_jaxlib_plans(
    infos: list[WheelInfo], target: Target, closure: dict[str, list[WheelInfo]], warn: Callable[[str], None] | None = None
) -> tuple[list[WheelPlan], set[str]]:
    """A CUDA jaxlib for every jaxlib version whose plugin and pjrt wheels are among `infos`,
    and the paths of the plugin wheels used (they become no package of their own)."""
    plans, used = [], set()
    for jl in (i for i in infos if i.key == "jaxlib"):
        bundle = tuple(
            sorted((i for i in infos if JAX_CUDA_PLUGIN.match(i.key) and i.version == jl.version), key=lambda i: i.key)
        )
        if len(bundle) == 2:
            plans.append(plan_wheel(jl, target, closure, warn, bundle))
            used |= {str(b.path) for b in bundle}
    return plans, used
