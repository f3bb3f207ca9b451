"""pip builds never compile against the wrong framework (backend/fuselet_backend.py), and an
sdist installs the pure core where no framework is present."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backend"))
import fuselet_backend  # noqa: E402

from tests.version import source_version  # noqa: E402

pytestmark = pytest.mark.builds  # the make test tier (tests/conftest.py)

VERSION = source_version()


def pip(*args, env=None, cwd=None, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"FUSELET_FRAMEWORK": "torch", "FUSELET_TORCH_VERSION": "2.13.0"}, ["torch==2.13.0"]),
        ({"FUSELET_FRAMEWORK": "jax", "FUSELET_JAX_VERSION": "0.8.3"}, ["jax==0.8.3", "jaxlib==0.8.3"]),
        (
            {"FUSELET_FRAMEWORK": "all", "FUSELET_TORCH_VERSION": "2.13.0", "FUSELET_JAX_VERSION": "0.10.2"},
            ["torch==2.13.0", "jax==0.10.2", "jaxlib==0.10.2"],
        ),
        ({"FUSELET_FRAMEWORK": "none", "FUSELET_TORCH_VERSION": "2.13.0"}, []),
        ({"FUSELET_FRAMEWORK": "auto", "FUSELET_TORCH_VERSION": "2.13.0"}, ["torch==2.13.0"]),
    ],
)
def test_framework_versions_become_build_requirements(environ, expected):
    assert fuselet_backend.framework_requirements(environ) == expected


def test_installed_framework_needs_no_requirement():
    """--no-build-isolation: torch is importable, so nothing is added (the installed one is used)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed here")
    assert fuselet_backend.framework_requirements({"FUSELET_FRAMEWORK": "torch"}) == []


def test_framework_without_version_where_it_is_missing_fails(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(fuselet_backend.FrameworkRequirementError) as err:
        fuselet_backend.framework_requirements({"FUSELET_FRAMEWORK": "jax"})
    assert "--no-build-isolation" in str(err.value) and "FUSELET_JAX_VERSION=<version>" in str(err.value)


def test_unknown_framework_is_named():
    with pytest.raises(fuselet_backend.FrameworkRequirementError, match="got 'pytorch'"):
        fuselet_backend.framework_requirements({"FUSELET_FRAMEWORK": "pytorch"})


def test_the_wheel_requires_the_framework_it_was_compiled_against(monkeypatch, tmp_path):
    """Requires-Dist (dynamic_metadata): the torch minor of a torch build, and for a jax build
    the oldest jaxlib of the XLA FFI level in the headers compiled against."""
    import importlib.metadata

    versions = {"torch": "2.13.0+cpu", "jaxlib": "0.10.2"}
    header = tmp_path / "jaxlib" / "include" / "xla" / "ffi" / "api" / "c_api.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define XLA_FFI_API_MAJOR 0\n#define XLA_FFI_API_MINOR 3\n")
    spec = importlib.util.spec_from_file_location(
        "jaxlib", tmp_path / "jaxlib" / "__init__.py", submodule_search_locations=[str(tmp_path / "jaxlib")]
    )
    monkeypatch.setattr(importlib.metadata, "version", versions.__getitem__)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name in ("torch", "jax", "jaxlib") else None)
    deps = fuselet_backend.framework_dependencies
    assert deps({"FUSELET_FRAMEWORK": "torch"}) == ["torch>=2.13,<2.14"]
    assert deps({"FUSELET_FRAMEWORK": "jax"}) == ["jaxlib>=0.9.1"]  # FFI 0.3 began with 0.9.1
    assert deps({"FUSELET_FRAMEWORK": "auto"}) == ["torch>=2.13,<2.14", "jaxlib>=0.9.1"]
    assert deps({"FUSELET_FRAMEWORK": "none"}) == []
    versions.update(torch="2.9.1", jaxlib="0.12.0")
    header.write_text("#define XLA_FFI_API_MAJOR 0\n#define XLA_FFI_API_MINOR 9\n")
    assert deps({"FUSELET_FRAMEWORK": "all"}) == ["torch>=2.9,<2.10", "jaxlib>=0.12.0"]  # unknown level: itself
    with pytest.raises(ValueError, match="dependencies"):
        fuselet_backend.dynamic_metadata("version")


def test_a_stable_abi_build_takes_and_requires_any_torch_since_its_target(monkeypatch):
    """FUSELET_TORCH_ABI=stable: an isolated build without a version asks for torch >= the target
    (not an error: any such torch builds the same library), and the wheel requires torch >= the
    target with no upper bound, whatever torch it was built with."""
    import importlib.metadata

    stable = {"FUSELET_FRAMEWORK": "torch", "FUSELET_TORCH_ABI": "stable"}
    monkeypatch.setattr(importlib.metadata, "version", {"torch": "2.14.1"}.__getitem__)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert fuselet_backend.framework_requirements(stable) == ["torch>=2.12"]
    assert fuselet_backend.framework_requirements({**stable, "FUSELET_TORCH_TARGET": "2.13"}) == ["torch>=2.13"]
    assert fuselet_backend.framework_requirements({**stable, "FUSELET_TORCH_VERSION": "2.13.0"}) == ["torch==2.13.0"]
    with pytest.raises(fuselet_backend.FrameworkRequirementError, match="FUSELET_TORCH_ABI must be exact or stable"):
        fuselet_backend.framework_requirements({**stable, "FUSELET_TORCH_ABI": "abi3"})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "torch" else None)
    assert fuselet_backend.framework_dependencies(stable) == ["torch>=2.12"]
    assert fuselet_backend.framework_dependencies({"FUSELET_FRAMEWORK": "torch"}) == ["torch>=2.14,<2.15"]


def test_isolated_build_without_version_fails_at_once(tmp_path):
    proc = pip("wheel", "--no-deps", "-w", str(tmp_path), str(ROOT), env={"FUSELET_FRAMEWORK": "torch"}, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "FUSELET_TORCH_VERSION=<version> pip install ." in out and "pip install --no-build-isolation ." in out


@pytest.fixture(scope="module")
def torch_wheel(tmp_path_factory) -> Path:
    """The wheel an isolated `pip wheel .` makes with FUSELET_TORCH_VERSION=2.13.0."""
    out = tmp_path_factory.mktemp("wheel")
    proc = pip(
        "wheel", "--no-deps", "-w", str(out), str(ROOT), env={"FUSELET_FRAMEWORK": "torch", "FUSELET_TORCH_VERSION": "2.13.0"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("fuselet-*.whl")
    return wheel


def test_isolated_build_compiles_against_the_named_torch(torch_wheel):
    """With isolation, FUSELET_TORCH_VERSION puts exactly that torch into the build env."""
    with zipfile.ZipFile(torch_wheel) as z:
        info = json.loads(z.read("fuselet/torch/_build_info.json"))
        names = z.namelist()
    assert info["version"].startswith("2.13.0") and info["cuda"] is None
    assert "fuselet/jax/_build_info.json" not in names  # jax was not asked for


def test_the_wheel_holds_the_library_and_nothing_else(torch_wheel):
    """The Python package, its version module, libfuselet and the torch op library, and the
    dist-info: no packaging tool, no console script, no tests."""
    with zipfile.ZipFile(torch_wheel) as z:
        names = set(z.namelist())
        entry_points = [n for n in names if n.endswith("entry_points.txt")]
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    python = {str(p.relative_to(ROOT / "python")) for p in (ROOT / "python/fuselet").rglob("*.py")}
    # the metadata of fuselet.torch.hub's build variants (the kernels package's local repository)
    hub = {str(p.relative_to(ROOT / "python")) for p in (ROOT / "python/fuselet/torch/hub").rglob("metadata.json")}
    binaries = {n for n in names if n.endswith(".so") or ".so." in n}
    dist_info = {n for n in names if ".dist-info/" in n}
    assert len(hub) == 2 and hub <= names
    assert names - python - hub - binaries - dist_info == {"fuselet/_version.py", "fuselet/torch/_build_info.json"}
    assert python <= names
    assert {Path(n).name for n in binaries} == {"libfuselet.so", "libfuselet_torch.so"}, sorted(binaries)
    assert {Path(n).name for n in dist_info} <= {"METADATA", "WHEEL", "RECORD", "LICENSE"}, sorted(dist_info)
    assert entry_points == [] and not any(n.startswith("fuselet_build") for n in names)
    assert f"Version: {VERSION}\n" in metadata


def test_the_wheel_serves_every_python_and_names_its_torch(torch_wheel):
    """No Python C API in the libraries: tagged py3-none-<platform>; built against torch 2.13, it
    requires torch>=2.13,<2.14, so pip keeps the two together."""
    with zipfile.ZipFile(torch_wheel) as z:
        names = z.namelist()
        wheel = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert torch_wheel.name.split("-", 2)[2].startswith("py3-none-linux_x86_64"), torch_wheel.name
    assert "Tag: py3-none-linux_x86_64" in wheel, wheel
    requires = [ln.split(": ", 1)[1] for ln in metadata.splitlines() if ln.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["torch<2.14,>=2.13"], requires


def test_sdist_installs_the_pure_core_without_frameworks(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sdist,) = tmp_path.glob("fuselet-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = {Path(n).parts[1] for n in names if len(Path(n).parts) > 1}
    tests = {Path(n).parts[2] for n in names if len(Path(n).parts) > 2 and Path(n).parts[1] == "tests"}
    # the library's sources and tests, no packaging tool nor its configuration
    assert not top & {"tools", "variants", ".github", "pixi.toml"}, sorted(top)
    assert {"csrc", "python", "backend", "CMakeLists.txt", "pyproject.toml"} <= top, sorted(top)
    recipe = {Path(*Path(n).parts[1:]).as_posix() for n in names if len(Path(n).parts) > 2 and Path(n).parts[1] == "recipe"}
    assert recipe == {"recipe/recipe.yaml"}, recipe  # only for the version CMake reads
    assert "config" not in tests and {"torch", "jax", "core"} <= tests, sorted(tests)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    install = subprocess.run(
        [py, "-m", "pip", "install", "-q", str(sdist)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "FUSELET_FRAMEWORK": "auto"},
    )
    assert install.returncode == 0, install.stderr[-3000:]
    info = subprocess.run([py, "-m", "fuselet"], capture_output=True, text=True, cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert f"fuselet {VERSION} " in info.stdout and f"libfuselet {VERSION}," in info.stdout
    assert "torch: not built" in info.stdout
    for layer in ("torch", "jax"):
        imp = subprocess.run([py, "-c", f"import fuselet.{layer}"], capture_output=True, text=True, cwd=tmp_path)
        assert imp.returncode != 0 and f"fuselet.{layer} needs" in imp.stderr, imp.stderr
