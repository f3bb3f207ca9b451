"""The fuselet package: framework-free import, provenance report, missing frameworks,
and the import-time ABI guard (fuselet/_guard.py), unit and end to end."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fuselet
import pytest
from fuselet import _guard

from tests.conftest import import_layer
from tests.version import source_version

PACKAGE = Path(fuselet.__file__).resolve().parent
LAYERS = ("torch", "jax")


def built(layer: str) -> dict | None:
    """What the installed fuselet.<layer> recorded at build time (None: not built)."""
    return _guard.read_build_info(PACKAGE / layer)


def python(code: str, *args: str, pythonpath=None, cwd=None, **env) -> subprocess.CompletedProcess:
    """Run `code` (or `python *args`) in a fresh interpreter; `pythonpath` goes first on its path."""
    full_env = {k: v for k, v in os.environ.items() if k != _guard.SKIP_ENV}
    if pythonpath:
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
    full_env.update(env)
    cmd = [sys.executable, *args] if code is None else [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120)


# --- import and provenance --------------------------------------------------------------------


def test_import_needs_no_framework():
    out = python(
        "import sys, fuselet\nprint(fuselet.__version__, sorted(m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [fuselet.__version__, "[]"]


def test_version_is_the_recipes():
    """fuselet.__version__, the wheel's metadata and libfuselet all come from the recipe's version."""
    version = source_version()
    assert fuselet.__version__ == version == importlib.metadata.version("fuselet")
    assert fuselet.report()["core"]["version"] == version


def test_python_m_fuselet():
    out = python(None, "-m", "fuselet")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"fuselet {fuselet.__version__} ")
    assert lines[1].startswith("  core:  libfuselet ")
    for layer in LAYERS:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"  {layer}: "))
        if built(layer) is None:
            assert "not built" in lines[index]
            continue
        assert lines[index].startswith(f"  {layer}: built against ")
        expected = "ok" if importlib.util.find_spec(layer) else f"{layer} not installed"
        assert lines[index + 1].strip().startswith("found ") and lines[index + 1].endswith(f": {expected}")


def test_report_structure():
    report = fuselet.report()
    assert set(report) == {"fuselet", "python", "platform", "core", "torch", "jax"}
    assert report["fuselet"] == fuselet.__version__
    assert report["python"] == sys.version.split()[0]
    core = report["core"]
    assert set(core) == {"path", "version", "cuda_kernels", "cuda_archs", "num_threads", "cpu_isa"}, core
    assert Path(core["path"]).exists() and core["version"] == fuselet.__version__ and core["num_threads"] >= 1
    assert core["cpu_isa"] in ("baseline", "avx2", "avx512")
    for layer in LAYERS:
        status = report[layer]
        assert set(status) == {"built", "running", "status", "path"}
        assert status["built"] == built(layer)
        if status["built"] is None:
            assert status["status"] == "not built" and status["path"] is None
        elif importlib.util.find_spec(layer) is None:
            assert status["status"] == f"{layer} not installed"
        else:
            keys = {"version", "cuda", "cxx11_abi"} if layer == "torch" else {"jaxlib_version", "ffi_api"}
            assert set(status["running"]) == keys
            assert status["status"] == "ok"
            # the provenance names the framework this build was compiled against: the one here
            for key in keys - {"cxx11_abi"}:
                assert status["built"][key] == status["running"][key], (layer, key, status)
            assert status["path"] == str(PACKAGE / layer)  # a pip install: inside the package


@pytest.mark.parametrize("layer", LAYERS)
def test_a_conda_environment_has_the_layer_libraries_in_its_lib_folder(layer, tmp_path, monkeypatch):
    """fuselet-torch / fuselet-jax install lib/fuselet/<layer>/ (no Python in them): the noarch
    fuselet finds them there when its own package folder holds none, and the package folder
    (a pip wheel) first when it does."""
    from fuselet import _core

    package, prefix = tmp_path / "site" / "fuselet", tmp_path / "env"
    monkeypatch.setattr(_core, "_HERE", package)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    assert _core.layer_candidates(layer) == [package / layer, prefix / "lib" / "fuselet" / layer]
    assert _core.layer_dir(layer) is None
    conda = prefix / "lib" / "fuselet" / layer
    conda.mkdir(parents=True)
    assert _core.layer_dir(layer) is None  # a folder without provenance is no layer
    (conda / "_build_info.json").write_text(json.dumps(TORCH))
    assert _core.layer_dir(layer) == conda
    (package / layer).mkdir(parents=True)
    (package / layer / "_build_info.json").write_text(json.dumps(TORCH))
    assert _core.layer_dir(layer) == package / layer


# --- a framework that cannot be imported --------------------------------------------------------


@pytest.mark.parametrize("framework", LAYERS)
def test_missing_framework(framework):
    code = (
        f"import sys\nsys.modules[{framework!r}] = None  # 'import {framework}' raises ImportError\n"
        f"try:\n    import fuselet.{framework}\nexcept ImportError as e:\n    print(type(e).__name__, e)\n"
        f"else:\n    sys.exit('imported')"
    )
    out = python(code)
    assert out.returncode == 0, out.stderr
    info = built(framework)
    if framework == "torch":
        hint = f"pip install torch=={info['version'].split('+')[0]}" if info else "pip install torch"
    else:
        hint = f"=={info['jaxlib_version']}" if info else "pip install jax"
    assert out.stdout.startswith("ImportError fuselet." + framework + " needs ")
    assert hint in out.stdout and "pip install" in out.stdout


@pytest.mark.parametrize("framework", LAYERS)
def test_a_conda_environment_without_the_layer_names_its_package(framework, tmp_path, monkeypatch):
    """A conda env holding fuselet alone: the fix is the layer's conda package (which brings the
    framework), not pip's framework, after which the layer library would still be missing."""
    loader = importlib.import_module(f"fuselet.{framework}._load")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert loader._install_hint(None) == f"pip install {framework}"
    (tmp_path / "conda-meta").mkdir()
    assert loader._install_hint(None).startswith(f"conda install fuselet-{framework} ")


# --- the ABI guard: units ------------------------------------------------------------------------

TORCH = {"version": "2.13.0+cpu", "cuda": None, "cxx11_abi": True}
TORCH_CUDA = {"version": "2.13.0+cu130", "cuda": "13.0", "cxx11_abi": True}


@pytest.mark.parametrize(
    "built_info, running, expected",
    [
        (TORCH, TORCH, []),
        (TORCH, {**TORCH, "version": "2.13.1"}, []),
        (TORCH_CUDA, {**TORCH_CUDA, "cuda": "13.2"}, []),
        (TORCH, {**TORCH, "version": "2.12.0+cpu"}, ["torch 2.13 != 2.12"]),
        (TORCH, {**TORCH, "version": "3.13.0"}, ["torch 2.13 != 3.13"]),
        (TORCH, TORCH_CUDA, ["CPU build != CUDA 13.0 torch"]),
        (TORCH_CUDA, TORCH, ["CUDA 13.0 build != CPU torch"]),
        (TORCH_CUDA, {**TORCH_CUDA, "cuda": "12.8"}, ["CUDA major 13 != 12"]),
        (TORCH, {**TORCH, "cxx11_abi": False}, ["_GLIBCXX_USE_CXX11_ABI 1 != 0"]),
        (
            {**TORCH_CUDA, "version": "2.12.0", "cxx11_abi": False},
            {**TORCH, "version": "2.13.0"},
            ["torch 2.12 != 2.13", "CUDA 13.0 build != CPU torch", "_GLIBCXX_USE_CXX11_ABI 0 != 1"],
        ),
    ],
    ids=["same", "patch", "cuda-minor", "minor", "major", "cpu-vs-cuda", "cuda-vs-cpu", "cuda-major", "cxx11-abi", "several"],
)
def test_torch_mismatches(built_info, running, expected):
    assert _guard.torch_mismatches(built_info, running) == expected


STABLE = {**TORCH, "abi": "stable", "torch_target": "2.12", "cuda_kernels": False}
STABLE_CUDA = {**TORCH_CUDA, "version": "2.14.1+cu130", "abi": "stable", "torch_target": "2.12", "cuda_kernels": True}
OLDER = "torch 2.11 < 2.12, the oldest torch this stable-ABI build runs on"


@pytest.mark.parametrize(
    "built_info, running, expected",
    [
        (STABLE, TORCH, []),
        (STABLE, {**TORCH, "version": "2.12.0+cpu"}, []),
        (STABLE, {**TORCH, "version": "2.16.0.dev20270101+cpu"}, []),  # any later torch, nightlies too
        (STABLE, {**TORCH, "version": "3.0.0"}, []),
        (STABLE, TORCH_CUDA, []),  # CPU kernels under a CUDA torch: CPU tensors work
        (STABLE, {**TORCH, "cxx11_abi": False}, []),  # no C++ symbol crosses: the flag does not matter
        (STABLE, {**TORCH, "version": "2.11.0+cpu"}, [OLDER]),
        (STABLE_CUDA, {**TORCH_CUDA, "version": "2.12.0+cu130"}, []),
        (STABLE_CUDA, TORCH, ["a build with CUDA kernels (it links libtorch_cuda) != CPU torch"]),
        (STABLE_CUDA, {**TORCH_CUDA, "cuda": "12.8"}, ["CUDA major 13 != 12"]),
        (
            STABLE_CUDA,
            {**TORCH, "version": "2.11.0"},
            [OLDER, "a build with CUDA kernels (it links libtorch_cuda) != CPU torch"],
        ),
    ],
    ids=[
        "same",
        "target",
        "nightly",
        "major",
        "cuda-torch",
        "cxx11-abi",
        "older",
        "cuda",
        "cuda-vs-cpu",
        "cuda-major",
        "several",
    ],
)
def test_stable_torch_mismatches(built_info, running, expected):
    """A stable-ABI build runs on every torch >= its target; with CUDA kernels, on its CUDA major."""
    assert _guard.torch_mismatches(built_info, running) == expected


def jaxlib(version, api):
    return {"jaxlib_version": version, "ffi_api": api}


@pytest.mark.parametrize(
    "built_api, running_api, compatible",
    [
        ([0, 3], [0, 3], True),
        ([0, 2], [0, 3], True),  # XLA accepts older handlers of the same major
        ([0, 9], [0, 3], False),  # newer than the running jaxlib
        ([1, 0], [0, 3], False),
        ([0, 3], [1, 0], False),  # a new major: incompatible either way
    ],
)
def test_jax_mismatches(built_api, running_api, compatible):
    problems = _guard.jax_mismatches(jaxlib("0.10.9", built_api), jaxlib("0.10.2", running_api))
    if compatible:
        assert problems == []
    else:
        assert problems == [
            f"XLA FFI API {built_api[0]}.{built_api[1]} (jaxlib 0.10.9) is newer than or "
            f"incompatible with {running_api[0]}.{running_api[1]} (jaxlib 0.10.2)"
        ]


def test_enforce(monkeypatch):
    monkeypatch.delenv(_guard.SKIP_ENV, raising=False)
    running = {**TORCH, "version": "2.12.0+cpu"}
    _guard.enforce("torch", TORCH, TORCH, [], "do nothing")  # compatible: silent
    with pytest.raises(_guard.FuseletABIError) as raised:
        _guard.enforce("torch", TORCH, running, ["torch 2.13 != 2.12"], "rebuild it")
    assert isinstance(raised.value, ImportError)
    assert str(raised.value) == (
        "fuselet.torch was built against torch 2.13.0+cpu (CPU, cxx11_abi=1) but found torch 2.12.0+cpu "
        "(CPU, cxx11_abi=1) (torch 2.13 != 2.12). Loading it could crash or compute garbage. Fix: rebuild it "
        f"(to load it anyway, at your own risk: {_guard.SKIP_ENV}=1)."
    )
    monkeypatch.setenv(_guard.SKIP_ENV, "1")
    with pytest.warns(RuntimeWarning, match="Loading anyway; it could crash"):
        _guard.enforce("torch", TORCH, running, ["torch 2.13 != 2.12"], "rebuild it")


def test_describe():
    assert _guard.describe("torch", TORCH_CUDA) == "torch 2.13.0+cu130 (CUDA 13.0, cxx11_abi=1)"
    assert _guard.describe("jax", jaxlib("0.10.2", [0, 3])) == "jaxlib 0.10.2 (XLA FFI API 0.3)"
    assert _guard.describe("torch", STABLE) == "the stable ABI of torch >= 2.12 (built with torch 2.13.0+cpu)"


def test_read_build_info(tmp_path):
    assert _guard.read_build_info(tmp_path) is None
    (tmp_path / "_build_info.json").write_text(json.dumps(TORCH))
    assert _guard.read_build_info(tmp_path) == TORCH


# --- the ABI guard: end to end, on a copy of the installed package with doctored provenance -------


def doctored_copy(tmp_path: Path, layer: str, **changes) -> dict:
    """Copy the installed fuselet to tmp_path and change its <layer>/_build_info.json."""
    shutil.copytree(PACKAGE, tmp_path / "fuselet", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "fuselet" / layer / "_build_info.json"
    info = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(info))
    return info


IMPORT_COPY = """
import warnings
import fuselet
assert fuselet.__file__.startswith({root!r}), fuselet.__file__  # the doctored copy
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        import fuselet.{layer}
    except ImportError as e:
        print("ImportError", type(e).__name__, e)
        # the guard decides BEFORE the library is loaded: a refused library is never mapped
        print("mapped" if "libfuselet_{layer}.so" in open("/proc/self/maps").read() else "not mapped")
        raise SystemExit
for w in caught:
    print("warning", w.category.__name__, w.message)
{run}
"""
RUN = {  # one small op, to show the library loaded and works
    "torch": "import torch\nprint(fuselet.torch.rms_norm(torch.ones(2, 3), torch.ones(3)).sum().item())",
    "jax": "import jax.numpy as jnp\nprint(float(fuselet.jax.rms_norm(jnp.ones((2, 3)), jnp.ones(3)).sum()))",
}


def import_copy(tmp_path: Path, layer: str, **env) -> subprocess.CompletedProcess:
    code = IMPORT_COPY.format(root=str(tmp_path), layer=layer, run=RUN[layer])
    out = python(code, pythonpath=tmp_path, cwd=tmp_path, **env)
    assert out.returncode == 0, out.stderr
    return out


def claimed_torch_version() -> tuple[str, str]:
    """(the running torch with its minor release minus one, e.g. "2.12.0+cpu"; the running "2.13")."""
    version = importlib.metadata.version("torch")
    major, minor = map(int, version.split(".")[:2])
    local = version.partition("+")[2]
    return f"{major}.{minor - 1}.0" + (f"+{local}" if local else ""), f"{major}.{minor}"


def test_abi_guard_refuses_other_torch_minor(tmp_path):
    import_layer("torch")
    claimed, running = claimed_torch_version()
    doctored_copy(tmp_path, "torch", version=claimed)
    out = import_copy(tmp_path, "torch")
    assert out.stdout.startswith("ImportError FuseletABIError fuselet.torch was built against torch " + claimed)
    for part in (
        f"found torch {running}",
        f"torch {'.'.join(claimed.split('.')[:2])} != {running}",
        "Fix:",
        f"{_guard.SKIP_ENV}=1",
    ):
        assert part in out.stdout
    assert out.stdout.endswith("\nnot mapped\n"), out.stdout


def test_abi_guard_skip_env_torch(tmp_path):
    import_layer("torch")
    claimed, _ = claimed_torch_version()
    doctored_copy(tmp_path, "torch", version=claimed)
    out = import_copy(tmp_path, "torch", **{_guard.SKIP_ENV: "1"})
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"warning RuntimeWarning fuselet.torch was built against torch {claimed}")
    assert "Loading anyway" in lines[0]
    assert float(lines[-1]) == pytest.approx(6.0, rel=1e-5)  # the op library loaded and ran


def test_abi_guard_stable_refuses_older_torch(tmp_path):
    """A stable-ABI build for torch >= the next minor refuses the running torch, unmapped."""
    import_layer("torch")
    _, running = claimed_torch_version()
    major, minor = map(int, running.split("."))
    target = f"{major}.{minor + 1}"
    doctored_copy(tmp_path, "torch", abi="stable", torch_target=target, cuda_kernels=False)
    out = import_copy(tmp_path, "torch")
    assert out.stdout.startswith(
        f"ImportError FuseletABIError fuselet.torch was built against the stable ABI of torch >= {target}"
    )
    assert f"(torch {running} < {target}, the oldest torch this stable-ABI build runs on)" in out.stdout
    assert f"pip install 'torch>={target}'" in out.stdout
    assert out.stdout.endswith("\nnot mapped\n"), out.stdout


def test_abi_guard_refuses_newer_ffi_api(tmp_path):
    import_layer("jax")
    info = doctored_copy(tmp_path, "jax", ffi_api=[0, 9])
    out = import_copy(tmp_path, "jax")
    assert out.stdout.startswith(
        f"ImportError FuseletABIError fuselet.jax was built against jaxlib {info['jaxlib_version']} (XLA FFI API 0.9)"
    )
    assert "is newer than or incompatible with" in out.stdout and "Fix:" in out.stdout
    assert out.stdout.endswith("\nnot mapped\n"), out.stdout


def test_abi_guard_skip_env_jax(tmp_path):
    import_layer("jax")
    doctored_copy(tmp_path, "jax", ffi_api=[0, 9])
    out = import_copy(tmp_path, "jax", **{_guard.SKIP_ENV: "1"})
    lines = out.stdout.splitlines()
    assert lines[0].startswith("warning RuntimeWarning fuselet.jax was built against jaxlib")
    assert "Loading anyway" in lines[0]
    assert float(lines[-1]) == pytest.approx(6.0, rel=1e-5)
