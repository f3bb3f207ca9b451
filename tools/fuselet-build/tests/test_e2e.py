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
import rattler
from fuselet_build import build, channel, matrix, paths

ROOT = paths.root()
OUTPUT = ROOT / paths.OUTPUT
OFFLINE = ROOT / paths.OFFLINE_CHANNEL
CHANNELS = [str(OUTPUT), str(OFFLINE)]


HAS_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="no nvcc on PATH: the CUDA variants of offline.yaml "
                                                     "(torch 2.14.1 cuda130) cannot be built here")
CPU_SELECT = [] if HAS_NVCC else ["-cpu_", "-pyh"]   # without nvcc: the CPU packages only
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
    assert len(torch) == 2 and len(jax) == 4, (torch, jax)


def test_verify_passes(built, cli):
    proc = cli("verify", *CPU_ONLY)
    assert proc.returncode == 0, proc.stdout[-4000:]


@pytest.fixture(scope="session")
def torch213_env(built, tmp_path_factory):
    return env_with(tmp_path_factory, "torch213", ["fuselet-torch * cpu_torch213*", "python 3.11.*", "numpy"])


def test_fuselet_torch_installs_with_torch_213_and_matches_the_reference(torch213_env):
    proc = run(torch213_env, """
import numpy as np, torch, fuselet.torch as ft
rng = np.random.default_rng(0)
x, w = rng.standard_normal((8, 129)), rng.standard_normal(129)
y = ft.rms_norm(torch.from_numpy(x).float(), torch.from_numpy(w).float(), 1e-6).double().numpy()
ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
assert np.abs(y - ref).max() < 1e-5 * (1 + np.abs(ref).max()), np.abs(y - ref).max()
print(torch.__version__)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("2.13.0")


@needs_nvcc
def test_solver_refuses_the_213_build_with_torch_2141(built):
    with pytest.raises(Exception) as err:
        channel.solve(["fuselet-torch * cpu_torch213*", "pytorch ==2.14.1", "python 3.11.*"], CHANNELS,
                      virtual_packages=rattler.VirtualPackage.detect())
    message = str(err.value)
    assert "pytorch" in message and "fuselet-torch" in message, message


@needs_nvcc
def test_forced_mismatch_raises_the_guard_error(torch213_env, tmp_path_factory):
    """The 2.13-built extension copied next to torch 2.14.1: one clear ImportError, no crash."""
    prefix = tmp_path_factory.mktemp("torch2141") / "env"
    channel.install(prefix, ["pytorch ==2.14.1", "python 3.11.*"], CHANNELS, cuda="13.0")
    site = next(prefix.glob("lib/python3.11/site-packages"))
    shutil.copytree(next(torch213_env.glob("lib/python3.11/site-packages/fuselet")), site / "fuselet")
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
