"""End to end, offline: seed the local channel, build variants/offline.yaml with rattler-build,
then install the packages with py-rattler and use them as a user would.

Slow the first time (seed + every variant compiled); later runs reuse build/offline-channel
and output/ (the build skips packages that exist). FUSELET_SKIP_PACKAGE_BUILD=1 uses what is
already in output/ without building.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fuselet_build import build, channel, matrix, paths

ROOT = paths.root()
OUTPUT = ROOT / paths.OUTPUT
OFFLINE = ROOT / paths.OFFLINE_CHANNEL
CHANNELS = [str(OUTPUT), str(OFFLINE)]


HAS_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(
    not HAS_NVCC, reason="no nvcc on PATH: the CUDA variants of offline.yaml (torch 2.14.1 cuda130) cannot be built here"
)
CPU_SELECT = [] if HAS_NVCC else ["-cpu_", "-pyh"]  # without nvcc: the CPU packages only
CPU_ONLY = [f"--select={s}" for s in CPU_SELECT]


@pytest.fixture(scope="session")
def built(cli):
    """The offline channel and output/ with every package of variants/offline.yaml (the CPU
    ones only, where no nvcc exists)."""
    if not os.environ.get("FUSELET_SKIP_PACKAGE_BUILD"):
        assert cli("seed", *([] if HAS_NVCC else ["--no-cuda"])).returncode == 0, "fuselet-build seed failed"
        assert cli("build", *CPU_ONLY).returncode == 0, "fuselet-build build failed (see output/logs)"
    # The packages of this tree's recipe and version (output/ may also hold older builds).
    jobs = matrix.select(matrix.jobs(ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS]), CPU_SELECT)
    missing = [j.key for j in jobs if build.existing_package(OUTPUT, j) is None]
    assert not missing, f"not built in {OUTPUT}: {missing}"
    return sorted(build.existing_package(OUTPUT, j).name for j in jobs)


def env_with(tmp_path_factory, name: str, specs: list[str]) -> Path:
    prefix = tmp_path_factory.mktemp(name) / "env"
    channel.install(prefix, specs, CHANNELS)
    return prefix


def run(prefix: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=600)


@needs_nvcc
def test_two_torch_abis_and_two_ffi_levels_are_distinct_packages(built):
    torch = {p for p in built if p.startswith("fuselet-torch-")}
    jax = {p for p in built if p.startswith("fuselet-jax-")}
    assert any("_torch213_" in p for p in torch) and any("_torch214_" in p for p in torch), torch
    assert any("_ffi02_" in p for p in jax) and any("_ffi03_" in p for p in jax), jax
    assert {p.split("-")[-1].split("_h")[0] for p in torch} == {
        "cpu_torch213",
        "cuda130_torch214",
        "cpu_stable",
        "cuda130_stable",
    }
    assert len(torch) == 4 and len(jax) == 4, (torch, jax)


def test_verify_passes(built, cli):
    proc = cli("verify", *CPU_ONLY)
    assert proc.returncode == 0, proc.stdout[-4000:]


@pytest.fixture(scope="session")
def torch213_env(built, tmp_path_factory):
    return env_with(tmp_path_factory, "torch213", ["fuselet-torch * cpu_torch213*", "python 3.11.*", "numpy"])


def test_fuselet_torch_installs_with_torch_213_and_matches_the_reference(torch213_env):
    proc = run(
        torch213_env,
        """
import numpy as np, torch, fuselet.torch as ft
rng = np.random.default_rng(0)
x, w = rng.standard_normal((8, 129)), rng.standard_normal(129)
y = ft.rms_norm(torch.from_numpy(x).float(), torch.from_numpy(w).float(), 1e-6).double().numpy()
ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
assert np.abs(y - ref).max() < 1e-5 * (1 + np.abs(ref).max()), np.abs(y - ref).max()
print(torch.__version__)
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("2.13.0")


@needs_nvcc
def test_solver_refuses_the_213_build_with_torch_2141(built):
    virtual = channel.virtual_packages("13.0")  # torch 2.14.1 is a CUDA build: the same __cuda for both
    with pytest.raises(Exception) as err:
        channel.solve(["fuselet-torch * cpu_torch213*", "pytorch ==2.14.1", "python 3.11.*"], CHANNELS, virtual_packages=virtual)
    message = str(err.value)
    assert "pytorch" in message and "fuselet-torch" in message, message
    # the positive control: with its own torch the same solve succeeds
    solved = channel.solve(
        ["fuselet-torch * cpu_torch213*", "pytorch ==2.13.0", "python 3.11.*"], CHANNELS, virtual_packages=virtual
    )
    versions = {r.name.normalized: str(r.version) for r in solved}
    assert versions["pytorch"] == "2.13.0" and "fuselet-torch" in versions, versions


# --- the stable-ABI fuselet-torch (cpu_stable / cuda130_stable): which build the solver takes,
# and one package file under two torch releases ---------------------------------------------------


def _build_of(records, name: str) -> str:
    return next(str(r.build) for r in records if r.name.normalized == name)


def test_the_solver_takes_the_exact_build_where_one_fits(built):
    """Both CPU fuselet-torch builds fit torch 2.13; the stable one carries a track feature
    (down_prioritize_variant), so the exact one is installed, asked for with or without the torch."""
    virtual = channel.virtual_packages()
    for specs in (["fuselet-torch", "pytorch ==2.13.0", "python 3.11.*"], ["fuselet-torch", "python 3.11.*"]):
        solved = channel.solve(specs, CHANNELS, virtual_packages=virtual)
        assert _build_of(solved, "fuselet-torch").startswith("cpu_torch213_"), (specs, _build_of(solved, "fuselet-torch"))
    solved = channel.solve(
        ["fuselet-torch * cpu_stable*", "pytorch ==2.13.0", "python 3.11.*"], CHANNELS, virtual_packages=virtual
    )
    (stable,) = [r for r in solved if r.name.normalized == "fuselet-torch"]
    assert list(stable.track_features), stable  # what makes it the last choice
    assert any(str(d) == "pytorch >=2.12" for d in stable.depends), stable.depends


def test_the_solver_takes_the_stable_build_where_no_exact_build_fits(built, tmp_path):
    """A torch newer than every exact build (a pytorch 2.15.0 in a channel of its own: metadata
    only, the solver reads repodata) gets the stable build; the exact ones pin their minor."""
    import json

    newer = tmp_path / "newer-torch"
    record = {
        "name": "pytorch",
        "version": "2.15.0",
        "build": "cpu_generic_py311_h0000000_0",
        "build_number": 0,
        "depends": ["python >=3.11,<3.12.0a0"],
        "subdir": "linux-64",
    }
    for subdir, packages in (("linux-64", {"pytorch-2.15.0-cpu_generic_py311_h0000000_0.conda": record}), ("noarch", {})):
        (newer / subdir).mkdir(parents=True)
        repodata = {"info": {"subdir": subdir}, "packages": {}, "packages.conda": packages}
        (newer / subdir / "repodata.json").write_text(json.dumps(repodata))
    solved = channel.solve(
        ["fuselet-torch", "pytorch ==2.15.0", "python 3.11.*"],
        [str(newer), *CHANNELS],
        virtual_packages=channel.virtual_packages(),
    )
    assert _build_of(solved, "fuselet-torch").startswith("cpu_stable_"), _build_of(solved, "fuselet-torch")


STABLE_RUN = """
import numpy as np, torch, fuselet.torch as ft
assert ft.BUILD_INFO["abi"] == "stable" and ft.BUILD_INFO["torch_target"] == "2.12", ft.BUILD_INFO
rng = np.random.default_rng(0)
x, w = rng.standard_normal((8, 129)), rng.standard_normal(129)
y = ft.rms_norm(torch.from_numpy(x).float(), torch.from_numpy(w).float(), 1e-6).double().numpy()
ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
assert np.abs(y - ref).max() < 1e-5 * (1 + np.abs(ref).max()), np.abs(y - ref).max()
print(torch.__version__, ft.BUILD_INFO["cuda_kernels"])
"""


@pytest.fixture(scope="session")
def stable213_env(built, tmp_path_factory):
    return env_with(tmp_path_factory, "stable213", ["fuselet-torch * cpu_stable*", "pytorch ==2.13.0", "python 3.11.*", "numpy"])


def test_the_stable_build_installs_and_runs_beside_torch_213(stable213_env):
    proc = run(stable213_env, STABLE_RUN)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.13.0+cpu", "False"], proc.stdout


@needs_nvcc
def test_the_same_stable_package_runs_beside_torch_2141(built, stable213_env, tmp_path_factory):
    """The offline channel holds one CPU pytorch (2.13: no other CPU torch wheel is served here),
    so the second torch is the CUDA 2.14.1 one. The cuda130_stable package installs beside it (the
    solver's choice of flavor), runs CPU tensors; then the very cpu_stable package file installed
    beside torch 2.13 above is extracted over it, as `--no-deps` would (its flavor pin asks for a
    CPU pytorch), and runs there too: a CPU-only stable build under a CUDA torch, CUDA tensors
    refused by name."""
    import rattler.package_streaming as ps

    prefix = tmp_path_factory.mktemp("stable2141") / "env"
    channel.install(
        prefix, ["fuselet-torch * cuda130_stable*", "pytorch ==2.14.1", "python 3.11.*", "numpy"], CHANNELS, cuda="13.0"
    )
    proc = run(prefix, STABLE_RUN)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.14.1+cu130", "True"], proc.stdout
    (record,) = [r for r in channel.installed(stable213_env) if r.name.normalized == "fuselet-torch"]
    cpu_stable = OUTPUT / "linux-64" / f"fuselet-torch-{record.version}-{record.build}.conda"  # the file installed there
    unpacked = tmp_path_factory.mktemp("cpu_stable")
    ps.extract(cpu_stable, unpacked)
    for src in (unpacked / "lib" / "fuselet" / "torch").iterdir():
        dest = prefix / "lib" / "fuselet" / "torch" / src.name
        dest.unlink()  # an installed file may be a hard link into the package cache: never write through it
        shutil.copy2(src, dest)
    proc = run(
        prefix,
        STABLE_RUN
        + """
cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
try:
    torch.ops.fuselet.rms_norm_fwd.default.redispatch(cuda, torch.ones(2, 4), None, 1e-6)
except NotImplementedError as e:
    assert "this build has CPU kernels only" in str(e), e
    print("refused")
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.14.1+cu130", "False", "refused"], proc.stdout


@needs_nvcc
def test_forced_mismatch_raises_the_guard_error(torch213_env, tmp_path_factory):
    """The 2.13-built extension copied next to torch 2.14.1: one clear ImportError, no crash."""
    prefix = tmp_path_factory.mktemp("torch2141") / "env"
    channel.install(prefix, ["pytorch ==2.14.1", "python 3.11.*"], CHANNELS, cuda="13.0")
    site = next(prefix.glob("lib/python3.11/site-packages"))
    shutil.copytree(next(torch213_env.glob("lib/python3.11/site-packages/fuselet")), site / "fuselet")
    shutil.copytree(torch213_env / "lib" / "fuselet", prefix / "lib" / "fuselet")
    for lib in torch213_env.glob("lib/libfuselet.so*"):
        shutil.copy2(lib, prefix / "lib" / lib.name, follow_symlinks=False)
    proc = run(prefix, "import fuselet.torch")
    assert proc.returncode == 1 and "Segmentation" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fuselet._guard.FuseletABIError: fuselet.torch was built against torch 2.13.0"), last
    assert "found torch 2.14.1" in last and "Fix:" in last


def test_unsolvable_variant_names_the_missing_package(built, cli, tmp_path):
    import yaml

    variants = yaml.safe_load((ROOT / "variants/offline.yaml").read_text())
    variants.update(cuda_compiler_version=["None"], pytorch=["2.99"])
    bad = tmp_path / "no-such-torch.yaml"
    bad.write_text(yaml.safe_dump(variants))
    proc = cli("build", "--variants", str(bad), "--select", "fuselet-torch", "--output", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "No candidates were found for pytorch 2.99.* cpu*" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "out" / "noarch" / "repodata.json").exists()  # the output channel stays indexed


# --- what conda-forge would check -------------------------------------------------------------


def test_packages_and_index_are_readable_by_everyone(built):
    for name in built:
        path = OUTPUT / ("noarch" if name.startswith("fuselet-0") else "linux-64") / name
        assert path.stat().st_mode & 0o444 == 0o444, (path, oct(path.stat().st_mode))
    for sub in channel.SUBDIRS:
        for index in (OUTPUT / sub).glob("repodata*"):
            assert index.stat().st_mode & 0o444 == 0o444, index


@needs_nvcc
def test_the_cuda_core_depends_on_the_package_with_libcudart(built):
    """libfuselet links libcudart.so.13: cuda-cudart-dev's run_export makes it depend on cuda-cudart."""
    from rattler_build import Package

    version = paths.version()
    pkg = next(p for p in built if p.startswith(f"libfuselet-{version}-cuda130_"))
    depends = Package.from_file(str(OUTPUT / "linux-64" / pkg)).depends
    assert any(d.startswith("cuda-cudart >=13.0") for d in depends), depends


def test_linkage_is_checked_against_the_installed_run_dependencies(built, torch213_env, tmp_path):
    import rattler.package_streaming as ps
    from fuselet_build import contents

    pkg = next(p for p in built if p.startswith("fuselet-torch-") and "_torch213_" in p)
    ps.extract(OUTPUT / "linux-64" / pkg, tmp_path / "pkg")
    alone = contents.linkage_problems(tmp_path / "pkg", None)  # torch and libfuselet come from dependencies
    assert any("libtorch_cpu.so" in p for p in alone) and any("libfuselet.so" in p for p in alone), alone
    assert contents.linkage_problems(tmp_path / "pkg", torch213_env) == []


def test_the_python_package_is_seen_by_pip_and_importlib_metadata(torch213_env):
    """fuselet (noarch) carries the dist-info; fuselet-torch holds no Python, so none."""
    proc = run(
        torch213_env,
        "import importlib.metadata as m; print(m.version('fuselet'), "
        "[d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].startswith('fuselet')])",
    )
    assert proc.returncode == 0, proc.stderr
    version = paths.version()
    assert proc.stdout.strip() == f"{version} ['fuselet']", proc.stdout


# --- one framework package for every python -------------------------------------------------------


def _installed(prefix: Path, name: str) -> str:
    """The file name (name-version-build) of the package `name` installed in `prefix`."""
    (meta,) = [p for p in (prefix / "conda-meta").glob(f"{name}-*.json") if p.stem.rsplit("-", 2)[0] == name]
    return meta.stem


def _channel_pythons(name: str) -> set[str]:
    """The pythons ("3.11") the offline channel has a package `name` for (from its python pin)."""
    import json
    import re

    data = json.loads((OFFLINE / "linux-64" / "repodata.json").read_text())["packages.conda"]
    return {
        m.group(1)
        for r in data.values()
        if r["name"] == name
        for d in r["depends"]
        if (m := re.match(r"python >=(\d+\.\d+),", d))
    }


# framework -> (its conda framework package, the fuselet package spec, the __cuda it needs, code)
CROSS_PYTHON = {
    "fuselet-jax": (
        "jaxlib",
        "fuselet-jax * cpu_ffi03*",
        None,
        """
import sys, jax.numpy as jnp, fuselet.jax as fj
x = jnp.arange(12.0).reshape(3, 4)
ref = x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
assert float(jnp.abs(fj.rms_norm(x, jnp.ones(4)) - ref).max()) < 1e-5
print(sys.version_info[:2])
""",
    ),
    # PyPI has a CPU torch for the running python only: the channel's torch for 3.11 and 3.12 is
    # the CUDA 13.0 build (one libtorch, Python-free nvidia-* packages); its CPU ops run here.
    "fuselet-torch": (
        "pytorch",
        "fuselet-torch * cuda130_torch214*",
        "13.0",
        """
import sys, torch, fuselet.torch as ft
x = torch.arange(12.0).reshape(3, 4)
assert torch.allclose(ft.rms_norm(x, torch.ones(4)), torch.nn.functional.rms_norm(x, (4,), eps=1e-6), atol=1e-5)
assert torch.version.cuda == "13.0", torch.version.cuda
print(sys.version_info[:2])
""",
    ),
}


@pytest.mark.parametrize("name", sorted(CROSS_PYTHON))
def test_one_framework_package_serves_two_pythons(built, name, tmp_path_factory):
    """The SAME fuselet-jax (fuselet-torch) package installs next to python 3.11 and 3.12 and
    runs an op in each: its library links no Python."""
    framework, spec, cuda, code = CROSS_PYTHON[name]
    if cuda and not HAS_NVCC:
        pytest.skip(f"no nvcc on PATH: the CUDA {name} of offline.yaml is not built here")
    assert {"3.11", "3.12"} <= _channel_pythons(framework), _channel_pythons(framework)
    installed, libraries = set(), set()
    for python in ("3.11", "3.12"):
        prefix = tmp_path_factory.mktemp(f"{name}-py{python}") / "env"
        channel.install(prefix, [spec, f"python {python}.*"], CHANNELS, cuda=cuda)
        proc = run(prefix, code)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == f"({python.replace('.', ', ')})", proc.stdout
        installed.add(_installed(prefix, name))
        if cuda:
            libraries.add(_installed(prefix, "libtorch"))
    assert len(installed) == 1, installed
    assert len(libraries) <= 1, libraries  # and one libtorch under both pythons' pytorch


@pytest.mark.parametrize("name", sorted(CROSS_PYTHON))
def test_framework_packages_depend_on_no_python(built, name):
    from rattler_build import Package

    pkgs = [p for p in built if p.startswith(f"{name}-")]
    assert pkgs, built
    for pkg in pkgs:
        depends = Package.from_file(str(OUTPUT / "linux-64" / pkg)).depends
        assert not [d for d in depends if d.split(" ")[0] in ("python", "python_abi")], (pkg, depends)


def test_the_guard_reads_the_conda_layout_before_loading(built, tmp_path_factory):
    """In a conda env the torch library and its provenance lie in lib/fuselet/torch: a doctored
    provenance there is refused with the guard's message, before the library is mapped."""
    import json

    prefix = env_with(tmp_path_factory, "guard-conda", ["fuselet-torch * cpu_torch213*", "python 3.11.*"])
    info_path = prefix / "lib" / "fuselet" / "torch" / "_build_info.json"
    info = json.loads(info_path.read_text())
    info_path.unlink()  # installed as a hard link into the package cache: replace, never edit in place
    info_path.write_text(json.dumps({**info, "version": "2.12.0+cpu"}))
    proc = run(
        prefix,
        """
import fuselet, sys
try:
    import fuselet.torch
except ImportError as e:
    print(type(e).__name__, e)
print("mapped" if "libfuselet_torch.so" in open("/proc/self/maps").read() else "not mapped")
fuselet.info()
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("FuseletABIError fuselet.torch was built against torch 2.12.0+cpu"), proc.stdout
    assert "found torch 2.13.0" in proc.stdout and "\nnot mapped\n" in proc.stdout, proc.stdout
    assert str(prefix / "lib" / "fuselet" / "torch") in proc.stdout  # fuselet.info() names where it found it


@needs_nvcc
@pytest.mark.parametrize("fuselet_flavor,jaxlib_flavor", [("cpu", "cuda"), ("cuda130", "cpu")])
def test_the_solver_keeps_fuselet_jax_with_a_jaxlib_of_its_flavor(built, fuselet_flavor, jaxlib_flavor):
    """A CPU fuselet-jax registers no CUDA handlers; a CUDA one needs a CUDA jaxlib."""
    with pytest.raises(Exception) as err:
        channel.solve(
            [f"fuselet-jax * {fuselet_flavor}_ffi03*", f"jaxlib * {jaxlib_flavor}*", "python 3.11.*"],
            CHANNELS,
            virtual_packages=channel.virtual_packages("13.0"),
        )
    assert "jaxlib" in str(err.value), str(err.value)
    # and with its own flavor it solves
    channel.solve(
        [f"fuselet-jax * {fuselet_flavor}_ffi03*", "python 3.11.*"], CHANNELS, virtual_packages=channel.virtual_packages("13.0")
    )


def _channel_jaxlibs() -> list[str]:
    import json

    data = json.loads((OFFLINE / "linux-64" / "repodata.json").read_text())
    return sorted(
        {r["version"] for r in data.get("packages.conda", {}).values() if r["name"] == "jaxlib"},
        key=lambda v: tuple(map(int, v.split("."))),
    )


@pytest.mark.parametrize("jaxlib", _channel_jaxlibs() if (OFFLINE / "linux-64" / "repodata.json").exists() else [])
def test_the_oldest_ffi_level_runs_on_every_jaxlib_of_its_range(built, jaxlib, tmp_path_factory):
    """fuselet-jax's pin `jaxlib >=oldest,<jaxlib_below` is proven, not assumed: the FFI 0.2 build
    (compiled against jaxlib 0.8.3) installs next to every jaxlib of the channel and runs."""
    import yaml

    below = str(yaml.safe_load((ROOT / "variants/offline.yaml").read_text())["jaxlib_below"][0])
    if tuple(map(int, jaxlib.split("."))) >= tuple(map(int, below.split("."))):
        pytest.skip(f"jaxlib {jaxlib} is outside the range fuselet-jax accepts (< {below})")
    prefix = env_with(
        tmp_path_factory, f"jaxlib-{jaxlib}", ["fuselet-jax * cpu_ffi02*", f"jaxlib =={jaxlib} cpu*", "python 3.11.*"]
    )
    proc = run(
        prefix,
        """
import jax, jaxlib, jax.numpy as jnp, fuselet.jax as fj
x = jnp.arange(12.0).reshape(3, 4)
y = fj.rms_norm(x, jnp.ones(4))
ref = x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
assert float(jnp.abs(y - ref).max()) < 1e-5
print(jaxlib.__version__)
""",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == jaxlib


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


@pytest.mark.parametrize("flavor", ["cpu", "cuda130"] if HAS_NVCC else ["cpu"])
@pytest.mark.parametrize("jaxlib", _channel_jaxlibs() if (OFFLINE / "linux-64" / "repodata.json").exists() else [])
def test_the_solver_installs_the_build_made_for_the_users_jaxlib(built, jaxlib, flavor):
    """Where two fuselet-jax builds accept the user's jaxlib, the one compiled against the newest
    jaxlib not newer than it is installed (the recipe's build numbers), never the build order's."""
    import yaml

    below = str(yaml.safe_load((ROOT / "variants/offline.yaml").read_text())["jaxlib_below"][0])
    cuda = "None" if flavor == "cpu" else "13.0"
    builds = [
        j
        for j in matrix.jobs(ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS])
        if j.name == "fuselet-jax" and j.variant["cuda_compiler_version"] == cuda
    ]
    fits = [j for j in builds if _version(str(j.variant["jaxlib"])) <= _version(jaxlib) < _version(below)]
    specs = ["fuselet-jax", f"jaxlib =={jaxlib} {'cpu' if flavor == 'cpu' else 'cuda'}*", "python 3.11.*"]
    if not fits:
        with pytest.raises(Exception, match="fuselet-jax"):
            channel.solve(specs, CHANNELS, virtual_packages=channel.virtual_packages("13.0"))
        return
    expected = max(fits, key=lambda j: _version(str(j.variant["jaxlib"])))
    solved = {r.name.normalized: r for r in channel.solve(specs, CHANNELS, virtual_packages=channel.virtual_packages("13.0"))}
    assert str(solved["fuselet-jax"].build) == expected.build_string, (jaxlib, [j.build_string for j in fits])


def test_an_unpinned_install_takes_the_newest_ffi_level_and_its_jaxlib(built):
    """No jaxlib asked for: the newest jaxlib of the channel, with the build compiled against it."""
    solved = {r.name.normalized: r for r in channel.solve(["fuselet-jax", "python 3.11.*"], CHANNELS)}
    newest = max(_channel_jaxlibs(), key=_version)
    (made_for_it,) = [
        j
        for j in matrix.jobs(ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS])
        if j.name == "fuselet-jax" and j.variant["cuda_compiler_version"] == "None" and str(j.variant["jaxlib"]) == newest
    ]
    assert str(solved["jaxlib"].version) == newest
    assert str(solved["fuselet-jax"].build) == made_for_it.build_string


def test_torch_comes_as_libtorch_and_pytorch_as_on_conda_forge(torch213_env):
    """fuselet-torch configures against the split layout: TorchConfig.cmake, the headers and the
    libraries in the prefix (libtorch), site-packages/torch pointing there (pytorch)."""
    import json

    data = json.loads((OFFLINE / "linux-64" / "repodata.json").read_text())["packages.conda"]
    libtorch = {(r["version"], r["build"]) for r in data.values() if r["name"] == "libtorch"}
    for r in (r for r in data.values() if r["name"] == "pytorch"):
        (pin,) = [d for d in r["depends"] if d.startswith("libtorch ")]
        _, version, build = pin.split(" ")
        assert (version.removeprefix("=="), build) in libtorch, pin
    assert (torch213_env / "lib/libtorch_cpu.so").is_file()
    assert (torch213_env / "share/cmake/Torch/TorchConfig.cmake").is_file()
    assert (torch213_env / "include/ATen/ATen.h").is_file()
    assert (torch213_env / "lib/python3.11/site-packages/torch/lib/libtorch_cpu.so").is_symlink()


@pytest.mark.parametrize("python", ["3.10", "3.12", "3.13"])
def test_the_channel_has_more_than_one_python(built, python, tmp_path_factory):
    """python 3.10-3.13 and their python_abi, as conda-forge's python variants: the noarch
    fuselet installs and runs on each (fuselet's own test runs on python_min, 3.10)."""
    import json

    data = json.loads((OFFLINE / "linux-64" / "repodata.json").read_text())["packages.conda"]
    pythons = {r["version"].rsplit(".", 1)[0] for r in data.values() if r["name"] == "python"}
    if python not in pythons:
        pytest.skip(f"no python {python} interpreter beside the seed's (pyenv) on this machine: {sorted(pythons)}")
    prefix = env_with(tmp_path_factory, f"py{python}", [f"python {python}.*", "fuselet", "libfuselet * cpu*"])
    proc = run(prefix, "import sys, fuselet; print(sys.version_info[:2], fuselet.__version__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"({python.replace('.', ', ')})"), proc.stdout


# --- verify fails on what it exists to catch ---------------------------------------------------------


def _torch213_job():
    jobs = matrix.jobs(ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS])
    return next(j for j in jobs if j.name == "fuselet-torch" and j.build_string.startswith("cpu_torch213_"))


def test_verify_names_a_missing_torch_range_pin(built):
    from fuselet_build import verify
    from rattler_build import Package

    job = _torch213_job()
    depends = Package.from_file(str(build.existing_package(OUTPUT, job))).depends
    assert verify.pin_problems(job, depends) == []
    doctored = [d for d in depends if not d.startswith("pytorch >=")]
    (problem,) = verify.pin_problems(job, doctored)
    assert problem.startswith("missing pin /^pytorch >=2\\.13\\.\\d+,<2\\.14\\.0a0$/"), problem


def test_verify_names_doctored_provenance(built, tmp_path):
    import json

    from fuselet_build import verify

    job = _torch213_job()
    dest = verify.extract(build.existing_package(OUTPUT, job), job, tmp_path)
    info, problems = verify.provenance(dest, job)
    assert problems == [] and info["version"].startswith("2.13.")
    path = dest / "lib" / "fuselet" / "torch" / "_build_info.json"
    path.write_text(json.dumps({**info, "version": "2.14.1", "cuda": "13.0"}))
    assert verify.provenance(dest, job)[1] == [
        "built against torch 2.14.1, variant says pytorch 2.13",
        "built against torch CUDA 13.0, variant says cuda None",
    ]
    path.unlink()
    assert verify.provenance(dest, job)[1] == ["no lib/fuselet/torch/_build_info.json in the package"]


def test_verify_names_a_smoke_op_that_computes_garbage(built, tmp_path):
    """The package installs, but its op is wrong: the smoke test fails and says so."""
    from fuselet_build import verify

    job = _torch213_job()
    prefix, problems = verify.install_env(job, CHANNELS, tmp_path)
    assert problems == [] and verify.smoke(job, prefix, tmp_path) == []
    norm = next(prefix.glob("lib/python3.11/site-packages/fuselet/torch/norm.py"))
    text = norm.read_text()
    norm.unlink()  # a hard link into the package cache: replace it, never edit it in place
    norm.write_text(text + "\n_rms_norm_right = rms_norm\nrms_norm = lambda *a, **k: 2 * _rms_norm_right(*a, **k)\n")
    (problem,) = verify.smoke(job, prefix, tmp_path)
    assert problem.startswith(f"smoke test failed in {prefix}: AssertionError: rms_norm mismatch"), problem


def test_verify_reports_a_damaged_package_and_goes_on(built, cli, tmp_path):
    """A truncated package is a failed row naming the file and the fix; the others are checked."""
    out = tmp_path / "out"
    jobs = [
        j
        for j in matrix.jobs(ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS])
        if j.name in ("fuselet", "fuselet-torch") and (j.subdir == "noarch" or "cpu_torch213_" in j.build_string)
    ]
    for job in jobs:
        src = build.existing_package(OUTPUT, job)
        (out / job.subdir).mkdir(parents=True, exist_ok=True)
        shutil.copy(src, out / job.subdir / src.name)
    shutil.copy(OUTPUT / build.MANIFEST, out / build.MANIFEST)  # what build recorded of them
    torch_pkg = next(out.glob("linux-64/fuselet-torch-*.conda"))
    torch_pkg.write_bytes(torch_pkg.read_bytes()[:4096])  # an interrupted copy
    select = [f"--select={j.key}" for j in jobs]
    proc = cli("verify", "--no-install", "--output", str(out), *select)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr
    from fuselet_build import verify

    checks = {
        c.job.name: c
        for c in verify.verify(
            ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS], out, CHANNELS, install=False, select=[j.key for j in jobs]
        )
    }
    assert checks["fuselet"].ok, checks["fuselet"].problems  # the others are still checked
    (problem,) = checks["fuselet-torch"].problems
    assert problem.startswith(f"cannot read {torch_pkg}: ") and problem.endswith(
        "delete it and run `fuselet-build build` again"
    ), problem


def test_build_skips_only_what_it_built_and_tested(built, cli, tmp_path):
    """A package counts as built when the manifest has it with the same sha256 and sources:
    a copied-in valid pair is skipped; a truncated one is made again, with the reason."""
    out = tmp_path / "out"
    jobs = [
        j
        for j in matrix.jobs(ROOT / paths.RECIPE, [ROOT / paths.OFFLINE_VARIANTS])
        if j.name == "fuselet" or (j.name == "libfuselet" and j.build_string.startswith("cpu_"))
    ]
    for job in jobs:
        src = build.existing_package(OUTPUT, job)
        (out / job.subdir).mkdir(parents=True, exist_ok=True)
        shutil.copy(src, out / job.subdir / src.name)
    shutil.copy(OUTPUT / build.MANIFEST, out / build.MANIFEST)
    select = [f"--select={j.key}" for j in jobs]
    source = build.source_hash(ROOT)
    assert [build.package_state(out, j, source)[1] for j in jobs] == ["", ""]
    assert build.package_state(out, jobs[0], "some-other-source")[1] == "fuselet's sources changed since it was built"
    proc = cli("build", "--output", str(out), *select, timeout=900)
    assert proc.returncode == 0 and proc.stdout.count(" exists ") == 2, proc.stdout[-3000:]
    noarch = next(j for j in jobs if j.name == "fuselet")
    pkg = build.existing_package(out, noarch)
    pkg.write_bytes(pkg.read_bytes()[:2048])  # truncated by an interrupted copy
    assert build.package_state(out, noarch, source)[1] == "the file changed since it was built (sha256 differs)"
    proc = cli("build", "--output", str(out), *select, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "rebuilt: the file changed since it was built" in " ".join(proc.stdout.split()), proc.stdout[-3000:]
    assert build.package_state(out, noarch, source) == (build.existing_package(out, noarch), "")
