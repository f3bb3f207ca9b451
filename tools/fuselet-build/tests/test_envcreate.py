"""`fuselet-build env create`: an environment from the built channel without conda. Bad input is
an error naming the argument (exit 2, no traceback); one real environment is made from output/
and the offline channel and its python runs an op."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from fuselet_build import channel, paths

ROOT = paths.root()
OUTPUT = ROOT / paths.OUTPUT
OFFLINE = Path(os.environ.get("FUSELET_OFFLINE_CHANNEL") or ROOT / paths.OFFLINE_CHANNEL)


def refused(proc: subprocess.CompletedProcess, *parts: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr and "Fatal Python error" not in proc.stderr, proc.stderr
    for part in parts:
        assert part in proc.stderr, (part, proc.stderr)


@pytest.fixture(scope="module")
def empty_channel(tmp_path_factory) -> Path:
    chan = tmp_path_factory.mktemp("empty-channel")
    channel.index(chan)
    return chan


def test_a_spec_that_does_not_parse_is_named(cli, tmp_path, empty_channel):
    proc = cli("env", "create", str(tmp_path / "env"), "fuselet-jax >>1", "-c", str(empty_channel))
    refused(proc, "SPEC 'fuselet-jax >>1' is not a valid conda match spec", "unable to parse version spec")
    assert not (tmp_path / "env").exists()


def test_an_unsolvable_spec_shows_the_solvers_reason(cli, tmp_path, empty_channel):
    proc = cli("env", "create", str(tmp_path / "env"), "no-such-package", "-c", str(empty_channel))
    refused(proc, "SPEC 'no-such-package': cannot be installed from", "No candidates were found for no-such-package")
    assert not (tmp_path / "env").exists()


def test_a_missing_channel_folder_is_named(cli, tmp_path):
    proc = cli("env", "create", str(tmp_path / "env"), "fuselet", "--channel", str(tmp_path / "no-channel"))
    refused(proc, f"--channel {tmp_path / 'no-channel'}: no such folder")


def test_a_folder_that_is_no_channel_is_named(cli, tmp_path):
    (tmp_path / "chan").mkdir()
    proc = cli("env", "create", str(tmp_path / "env"), "fuselet", "--channel", str(tmp_path / "chan"))
    refused(proc, f"--channel {tmp_path / 'chan'}: ", "is not a conda channel", "fuselet-build index")


def test_missing_default_channels_say_to_build_the_packages(cli, tmp_path):
    proc = cli("env", "create", str(tmp_path / "env"), "fuselet", env={"FUSELET_ROOT": str(tmp_path)})
    refused(proc, f"--channel (default): the channel {tmp_path / paths.OUTPUT} is missing", "make packages")


def test_a_prefix_with_other_files_is_never_overwritten(cli, tmp_path, empty_channel):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("lost work")
    proc = cli("env", "create", str(work), "fuselet", "-c", str(empty_channel))
    refused(proc, f"PREFIX {work} is a folder with files in it and not a conda environment", "refusing")
    assert [p.name for p in work.iterdir()] == ["notes.txt"] and (work / "notes.txt").read_text() == "lost work"
    proc = cli("env", "create", str(work / "notes.txt"), "fuselet", "-c", str(empty_channel))
    refused(proc, f"PREFIX {work / 'notes.txt'} exists and is not a folder")
    assert (work / "notes.txt").read_text() == "lost work"


JAX_OP = """
import jax.numpy as jnp, numpy as np, fuselet.jax as fj
x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 64)), jnp.float32)
ref = x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
assert float(jnp.abs(fj.rms_norm(x, jnp.ones(64)) - ref).max()) < 1e-5, "rms_norm mismatch"
print("ok")
"""


def test_env_create_installs_fuselet_jax_and_its_python_runs_an_op(cli, tmp_path):
    """The real thing, from output/ and the offline channel: in make test they are built first."""
    if not (OUTPUT / "noarch" / "repodata.json").exists() or not (OFFLINE / "noarch" / "repodata.json").exists():
        if os.environ.get("FUSELET_OFFLINE_CHANNEL"):
            pytest.fail(f"FUSELET_OFFLINE_CHANNEL is set but {OUTPUT} or {OFFLINE} holds no indexed channel")
        pytest.skip(f"no built channel in {OUTPUT} and {OFFLINE}: run `make packages`")
    prefix = tmp_path / "env"
    start = time.monotonic()
    proc = cli("env", "create", str(prefix), "fuselet-jax", "python 3.11.*", "-c", str(OUTPUT), "-c", str(OFFLINE), timeout=600)
    print(f"env create took {time.monotonic() - start:.1f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "==> installing " in proc.stderr and f"created {prefix} in " in proc.stdout, proc.stdout + proc.stderr
    assert f'{prefix}/bin/python -c "import fuselet; fuselet.info()"' in proc.stdout, proc.stdout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    run = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", JAX_OP], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
    # an existing environment is installed into, its packages kept
    proc = cli("env", "create", str(prefix), "iniconfig", "-c", str(OUTPUT), "-c", str(OFFLINE), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "into the existing environment" in proc.stderr, proc.stderr
    assert "==> installing 1 new or changed packages" in proc.stderr, proc.stderr
    metas = sorted(p.name for p in prefix.glob("conda-meta/*.json"))
    assert any(m.startswith("fuselet-jax-") for m in metas) and any(m.startswith("iniconfig-") for m in metas), metas


def test_a_channel_url_that_cannot_be_read_is_named(cli, tmp_path):
    url = (tmp_path / "gone").as_uri()
    proc = cli("env", "create", str(tmp_path / "env"), "fuselet", "--channel", url)
    refused(proc, f"--channel: cannot read the channels {url}")
    assert not (tmp_path / "env").exists()
