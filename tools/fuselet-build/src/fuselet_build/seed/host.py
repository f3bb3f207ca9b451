"""The host: its toolchain facts, the activation packages made from them (compilers, stdlib,
CUDA) and the `python` package made from the running interpreter's prefix."""

from __future__ import annotations

import errno
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fuselet_build.buildlog import BuildLog
from fuselet_build.seed import wheels
from fuselet_build.seed.cache import Cache, Options, SeedError, timestamp, tmpdir_env
from fuselet_build.seed.wheels import Target

# --- host facts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HostToolchain:
    """The host compilers the activation packages point at."""

    gcc_version: str  # "12.2.0"
    triplet: str  # "x86_64-linux-gnu"
    tools: dict[str, str]  # CC, CXX, AR, ... -> absolute paths
    glibc: str  # "2.36"
    cuda_root: Path | None = None  # the toolkit root (resolved through a wrapper script)
    nvcc_version: str | None = None  # "13.0.88"


_GCC_TOOLS = {
    "CC": "gcc",
    "CPP": "cpp",
    "GCC": "gcc",
    "AR": "ar",
    "AS": "as",
    "LD": "ld",
    "NM": "nm",
    "OBJCOPY": "objcopy",
    "OBJDUMP": "objdump",
    "RANLIB": "ranlib",
    "READELF": "readelf",
    "SIZE": "size",
    "STRINGS": "strings",
    "STRIP": "strip",
    "GCC_AR": "gcc-ar",
    "GCC_NM": "gcc-nm",
    "GCC_RANLIB": "gcc-ranlib",
    "CXX": "g++",
    "GXX": "g++",
    "CXXFILT": "c++filt",
}


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
        raise SeedError(
            "no host C/C++ compiler: `gcc` and `g++` must be on PATH for the compiler activation packages (apt-get install g++)"
        )
    tools = {var: p for var, exe in _GCC_TOOLS.items() if (p := shutil.which(exe))}
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0").split()[-1]
    host = dict(gcc_version=_out([gcc, "-dumpfullversion"]), triplet=_out([gcc, "-dumpmachine"]), tools=tools, glibc=glibc)
    root = find_cuda_root() if with_cuda else None
    if root is not None:
        m = re.search(r"V(\d+\.\d+\.\d+)", _out([str(root / "bin" / "nvcc"), "--version"]))
        host.update(cuda_root=root, nvcc_version=m.group(1) if m else None)
    return HostToolchain(**host)


def activation_scripts(
    package: str, env: dict[str, str], append: dict[str, str] | None = None, note: str = ""
) -> tuple[str, str]:
    """(activate.sh, deactivate.sh) exporting `env` (and appending `append` to existing
    values, e.g. CMAKE_ARGS); deactivation restores what was there before."""
    tag = re.sub(r"\W", "_", package).upper()
    act = [f"# {package}: {note}".rstrip(), "# Written by `fuselet-build seed` (fuselet_build.seed.host)."]
    deact = list(act)
    for var in [*env, *(append or {})]:
        bak = f"_FUSELET_{tag}_BACKUP_{var}"
        act.append(f'if [ -n "${{{var}+x}}" ]; then export {bak}="${{{var}}}"; fi')
        deact.append(f'if [ -n "${{{bak}+x}}" ]; then export {var}="${{{bak}}}"; unset {bak}; else unset {var}; fi')
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
    subdir: str  # "linux-64" or "noarch" (noarch: generic)
    depends: list[str] = field(default_factory=list)
    constrains: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    append: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    build_string: str | None = None  # fixed build string (python_abi: 8_cp311), else h<hash>_0

    def scripts(self) -> tuple[str, str] | None:
        if not self.env and not self.append:
            return None
        return activation_scripts(self.name, self.env, self.append, self.summary)

    @property
    def build(self) -> str:
        if self.build_string:
            return self.build_string
        digest = wheels.short_hash(
            wheels.CONVERTER_VERSION, self.name, self.version, self.depends, self.constrains, self.scripts(), self.summary
        )
        return f"h{digest}_0"

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def python_abi_package(interp: Interpreter, subdir: str) -> HostPackage:
    """python_abi as python_abi-feedstock makes it: build string 8_cp3XY, constraining python to
    the build-string tag of that minor."""
    return HostPackage(
        "python_abi",
        interp.short,
        subdir,
        constrains=[f"python {interp.short}.* *_{interp.tag}"],
        summary=f"Metadata: CPython {interp.short} ABI (cp{interp.nodot})",
        build_string=f"8_cp{interp.nodot}",
    )


def host_packages(host: HostToolchain, target: Target) -> list[HostPackage]:
    """Compiler, stdlib and CUDA activation packages for `host` (what compiler('cxx'),
    compiler('cuda') with cuda_compiler=cuda-nvcc, and stdlib('c') with c_stdlib=sysroot
    resolve to: gxx_linux-64, cuda-nvcc_linux-64, sysroot_linux-64)."""
    t = host.tools
    gcc_env = {
        k: t[k]
        for k in (
            "CC",
            "CPP",
            "GCC",
            "AR",
            "AS",
            "LD",
            "NM",
            "OBJCOPY",
            "OBJDUMP",
            "RANLIB",
            "READELF",
            "SIZE",
            "STRINGS",
            "STRIP",
            "GCC_AR",
            "GCC_NM",
            "GCC_RANLIB",
        )
        if k in t
    }
    gcc_env.update(HOST=host.triplet, BUILD=host.triplet, CONDA_TOOLCHAIN_HOST=host.triplet, CONDA_TOOLCHAIN_BUILD=host.triplet)
    pkgs = [
        HostPackage(
            "gcc_linux-64",
            host.gcc_version,
            "linux-64",
            env=gcc_env,
            summary=f"activation of the host GCC {host.gcc_version} ({t['CC']})",
        ),
        HostPackage(
            "gxx_linux-64",
            host.gcc_version,
            "linux-64",
            depends=[f"gcc_linux-64 =={host.gcc_version}"],
            env={k: t[k] for k in ("CXX", "GXX", "CXXFILT") if k in t},
            summary=f"activation of the host G++ {host.gcc_version} ({t['CXX']})",
        ),
        HostPackage(
            "sysroot_linux-64", host.glibc, "noarch", summary=f"Metadata: the host glibc {host.glibc} is the C standard library"
        ),
    ]
    if host.cuda_root is not None and host.nvcc_version:
        root = str(host.cuda_root)
        mm, nxt = cuda_version_range(host.nvcc_version)
        pin = f"cuda-version >={mm},<{nxt}.0a0"
        pkgs += [
            _cuda_version_package(mm, root),
            HostPackage(
                "cuda-nvcc_linux-64",
                host.nvcc_version,
                "linux-64",
                depends=[pin],
                env={
                    "CUDA_HOME": root,
                    "CUDA_PATH": root,
                    "CUDAToolkit_ROOT": root,
                    "CUDACXX": f"{root}/bin/nvcc",
                    "CUDAHOSTCXX": t.get("CXX", "g++"),
                },
                append={
                    "CMAKE_ARGS": f"-DCUDAToolkit_ROOT={root} -DCUDA_TOOLKIT_ROOT_DIR={root} "
                    f"-DCMAKE_CUDA_COMPILER={root}/bin/nvcc"
                },
                summary=f"activation of the host nvcc {host.nvcc_version} ({root}/bin/nvcc)",
            ),
        ]
    return pkgs


def cuda_version_range(version: str) -> tuple[str, str]:
    """'13.0.96' -> ('13.0', '13.1'): the cuda-version range a CUDA 13.0 library needs."""
    major, minor = version.split(".")[:2]
    return f"{major}.{minor}", f"{major}.{int(minor) + 1}"


def _cuda_version_package(mm: str, root: str | None) -> HostPackage:
    where = f"the host toolkit at {root}" if root else "no host toolkit: what the CUDA wheels were built for"
    return HostPackage(
        "cuda-version",
        mm,
        "noarch",
        constrains=[f"__cuda >={mm.split('.')[0]}", f"cudatoolkit {mm}|{mm}.*"],
        summary=f"Metadata: CUDA {mm} ({where})",
    )


def cuda_version_packages(plans: list, hosts: list[HostPackage]) -> list[HostPackage]:
    """`cuda-version` for the CUDA wheels' versions (pytorch cuda130 needs cuda-version 13.0)
    that the host toolkit did not already give (e.g. a machine without nvcc)."""
    have = {p.version for p in hosts if p.name == "cuda-version"}
    wanted = {".".join(p.info.torch_cuda.split(".")[:2]) for p in plans if p.info.torch_cuda}
    return [_cuda_version_package(mm, None) for mm in sorted(wanted - have)]


RECIPES = Path(__file__).parent / "recipes"

PYTHON_BUILD_BYTES = 400 * 2**20  # rattler-build's host prefix + work copy of the interpreter


# --- packages made from the host ---------------------------------------------------------


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
        with tmpdir_env(work):
            out = rattler_build.assemble_package(
                pkg.name,
                pkg.version,
                pkg.subdir,
                pkg.build,
                work / "out",
                files_dir=files,
                depends=pkg.depends or None,
                constrains=pkg.constrains or None,
                summary=pkg.summary,
                noarch="generic" if pkg.subdir == "noarch" else None,
                timestamp=timestamp(),
                compression_level=opts.compression_level,
                compression_threads=opts.compression_threads,
                detect_prefix=False,
            )
        return cache.store(out.path, pkg.subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Interpreter:
    """A standalone CPython prefix the `python` package is made from."""

    prefix: Path
    version: str  # "3.11.7"

    @property
    def short(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def nodot(self) -> str:
        return self.short.replace(".", "")

    @property
    def tag(self) -> str:
        """The end of conda-forge's python build strings (python-feedstock): _cpython up to
        3.12, _cp313 from 3.13 on (python_abi's constraint matches it)."""
        return "cpython" if int(self.short.split(".")[1]) <= 12 else f"cp{self.nodot}"

    @property
    def exe(self) -> Path:
        return self.prefix / "bin" / f"python{self.short}"

    def filename(self, key: str) -> str:
        return f"python-{self.version}-h{key}_0_{self.tag}.conda"

    @classmethod
    def running(cls) -> Interpreter:
        return cls(Path(sys.base_prefix), platform.python_version())


PYTHON_MINORS = ("3.10", "3.11", "3.12", "3.13")  # conda-forge's python variants


def find_interpreters(running: Interpreter, minors: tuple[str, ...] = PYTHON_MINORS) -> list[Interpreter]:
    """The running interpreter and, for every other minor of `minors`, the newest standalone
    prefix beside it (pyenv's versions/3.X.Y), so the channel has one python per minor."""
    found = {running.short: running}
    for prefix in sorted(running.prefix.parent.iterdir(), key=lambda p: _version_key(p.name)):
        m = re.fullmatch(r"(\d+\.\d+)\.\d+", prefix.name)
        if m and m.group(1) in minors and m.group(1) != running.short and (prefix / "bin" / f"python{m.group(1)}").exists():
            found[m.group(1)] = Interpreter(prefix, prefix.name)
    return [found[m] for m in minors if m in found]


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else -1 for x in name.split("."))


def python_package_key(interp: Interpreter) -> str:
    texts = [p.read_text() for p in sorted((RECIPES / "python").iterdir()) if p.is_file()]
    st = interp.exe.stat()
    return wheels.short_hash(texts, str(interp.prefix), interp.version, st.st_size, st.st_mtime_ns)


def check_interpreter(interp: Interpreter) -> None:
    base = interp.prefix
    exe, lib = interp.exe, base / "lib" / f"python{interp.short}"
    if str(base) in ("/usr", "/"):
        raise SeedError(
            f"the interpreter's prefix is {base}, the system's: the `python` package is made "
            f"from a standalone prefix (pyenv, python-build-standalone); run seed with one"
        )
    missing = [p for p in (exe, lib) if not p.exists()]
    if not list((base / "lib").glob(f"libpython{interp.short}*.so*")):
        missing.append(base / "lib" / f"libpython{interp.short}.so")
    if missing:
        raise SeedError(f"{base} is not a shared CPython prefix (missing {', '.join(map(str, missing))})")


def make_python_package(cache: Cache, interp: Interpreter, subdir: str, opts: Options, key: str) -> Path:
    """`python` from the interpreter prefix `interp` with the recipes/python recipe (rattler-build)."""
    import rattler_build as rb

    work = cache.workdir(f"python{interp.short}")
    try:
        recipe = rb.Stage0Recipe.from_file(RECIPES / "python" / "recipe.yaml")
        ctx = {
            "src_prefix": str(interp.prefix),
            "py_version": interp.version,
            "py_short": interp.short,
            "py_nodot": interp.nodot,
            "py_tag": interp.tag,
            "seed_hash": key,
        }
        variants = recipe.render(
            rb.VariantConfig(), rb.RenderConfig(platform=rb.PlatformConfig(target_platform=subdir), extra_context=ctx)
        )
        log_path = cache.root / f"python{interp.short}-build.log"
        try:
            with tmpdir_env(work), BuildLog(log_path) as log:
                result = variants[0].run_build(
                    tool_config=rb.ToolConfiguration(compression_threads=opts.compression_threads),
                    output_dir=work / "out",
                    channels=[],
                    progress_callback=log,
                    package_format=f"conda:{opts.compression_level}",
                )
        except Exception as exc:
            if shutil.disk_usage(cache.root).free < PYTHON_BUILD_BYTES:
                raise OSError(errno.ENOSPC, f"{exc} (log: {log_path})") from exc
            raise SeedError(f"building the `python` package from {interp.prefix} failed: {exc}\n  log: {log_path}") from exc
        return cache.store(Path(result.packages[0]), subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
