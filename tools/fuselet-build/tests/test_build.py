"""`fuselet-build build` killed at each point of a build, or out of disk space: the output
channel stays consistent (every package its index lists is there, complete and tested; nothing
untested is served) and the next run completes. A recipe of seconds (tests/tiny) stands in for
fuselet's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fuselet_build import build, channel
from fuselet_build.failpoints import ENV as KILL_AT

TINY = Path(__file__).parent / "tiny"


def run_build(
    out: Path, chan: Path, tmp: Path, *select: str, kill_at: str = "", fill: Path | None = None
) -> subprocess.CompletedProcess:
    """fuselet-build build of tests/tiny into `out`; `kill_at`: where it is SIGKILLed (by the
    recipe's own build or test script, or by a failpoint of fuselet-build); `fill`: a mount
    point whose free space tiny's build script takes."""
    pidfile = tmp / "pid"
    env = {**os.environ, "TINY_KILL_AT": "", "TINY_KILL_PIDFILE": str(pidfile), KILL_AT: "", "TINY_FILL_DISK": str(fill or "")}
    if kill_at in ("compile", "test"):
        env["TINY_KILL_AT"] = kill_at
    elif kill_at:
        env[KILL_AT] = kill_at
    args = [
        sys.executable,
        "-m",
        "fuselet_build",
        "build",
        "--recipe",
        str(TINY / "recipe.yaml"),
        "--variants",
        str(TINY / "variants.yaml"),
        "--output",
        str(out),
        "--offline-channel",
        str(chan),
        *(f"--select={s}" for s in select),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pidfile.write_text(str(proc.pid))
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def state(out: Path) -> dict:
    """What a client of the channel sees, and what fuselet-build remembers."""
    return {
        "packages": sorted(p.relative_to(out).as_posix() for s in channel.SUBDIRS for p in (out / s).glob("*.conda")),
        "index": {s: (out / s / "repodata.json").read_bytes() for s in channel.SUBDIRS},
        "manifest": (out / build.MANIFEST).read_bytes() if (out / build.MANIFEST).exists() else b"",
    }


def assert_consistent(out: Path) -> None:
    """Every package the index lists is in the channel with that sha256, and recorded as built
    and tested in the manifest."""
    manifest = build.read_manifest(out)
    recorded = {e["file"]: e for e in manifest.values()}
    for sub in channel.SUBDIRS:
        index = json.loads((out / sub / "repodata.json").read_text())
        for name, record in {**index.get("packages", {}), **index.get("packages.conda", {})}.items():
            path = out / sub / name
            assert path.is_file(), f"the index lists {sub}/{name}, which is not there"
            assert build.sha256_file(path) == record["sha256"], f"{sub}/{name} is not the file the index lists"
            entry = recorded.get(f"{sub}/{name}")
            assert entry and entry["tested"] and entry["sha256"] == record["sha256"], (name, entry)


@pytest.fixture(scope="module")
def one_built(tmp_path_factory):
    """An output channel holding tiny's flavor `a`, built and tested; and the (empty) channel."""
    tmp = tmp_path_factory.mktemp("tiny")
    chan, out = tmp / "chan", tmp / "out"
    channel.index(chan)
    proc = run_build(out, chan, tmp, "alpha_")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (pkg,) = state(out)["packages"]
    assert pkg.startswith("noarch/tiny-1.0-alpha_"), pkg
    return chan, out


def status_of(summary: str, build_prefix: str) -> str:
    """A package's status in `fuselet-build build`'s summary table."""
    m = re.search(rf"{build_prefix}\S*\s+│\s+(\w+)", summary)
    assert m, summary[-2000:]
    return m.group(1)


def test_a_package_sees_those_published_earlier_in_the_same_run(one_built, tmp_path):
    """tiny-user needs a tiny in its host and test environments: built in one run after tiny,
    it must find the tiny published minutes before (rattler-build re-reads only its output
    folder between builds: the staging folder that mirrors the channel)."""
    chan, _ = one_built
    out = tmp_path / "out"
    proc = run_build(out, chan, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.split("-1.0-")[0] for p in state(out)["packages"]] == ["noarch/tiny", "noarch/tiny", "noarch/tiny-user"]
    assert_consistent(out)


@pytest.mark.parametrize("kill_at", ["compile", "test", "publish", "index"])
def test_a_build_killed_leaves_the_channel_consistent_and_the_next_run_completes(one_built, kill_at, tmp_path):
    chan, built = one_built
    out = tmp_path / "out"
    shutil.copytree(built, out)
    before = state(out)
    proc = run_build(out, chan, tmp_path, "beta_", kill_at=kill_at)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    after = state(out)
    assert after["index"] == before["index"]  # clients see the index of before the run
    assert_consistent(out)
    if kill_at in ("compile", "test", "publish"):
        # the new package was never in the channel (killed during its tests: only in .staging)
        assert after["packages"] == before["packages"], after["packages"]
    if kill_at in ("compile", "test"):
        assert after["manifest"] == before["manifest"]
    if kill_at == "index":
        # complete and recorded, not yet listed: the next run lists it without building it again
        (new,) = set(after["packages"]) - set(before["packages"])
        assert build.read_manifest(out)[Path(new).name.removesuffix(".conda")]["tested"]
    again = run_build(out, chan, tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert_consistent(out)
    final = state(out)
    assert len(final["packages"]) == 3, final["packages"]
    listed = {n for s in channel.SUBDIRS for n in json.loads(final["index"][s]).get("packages.conda", {})}
    assert {Path(p).name for p in final["packages"]} == listed
    # nothing left under test: the staging folder holds links to the published packages only
    staged = sorted(p.relative_to(out / build.STAGING).as_posix() for p in (out / build.STAGING).glob("*/*.conda"))
    assert staged == final["packages"], staged
    assert all(os.path.samefile(out / build.STAGING / p, out / p) for p in staged)
    assert status_of(again.stdout, "alpha_") == "exists"
    assert status_of(again.stdout, "beta_") == ("exists" if kill_at == "index" else "built")


@pytest.fixture
def small_disk(tmp_path):
    """A file system of its own to fill: a tmpfs of 2.2 GiB (build asks for 2 GiB free before
    it starts), taking memory only for what is written to it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2200m", "tmpfs", str(disk)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill here (needs root or CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        assert os.path.ismount(disk)
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def test_a_full_disk_fails_the_package_clearly_and_the_channel_stays_as_it_was(one_built, small_disk, tmp_path):
    """tiny's build takes the disk's last byte, so rattler-build cannot write the package (nor
    fuselet-build its log): the package fails with a reason naming the full disk, no traceback,
    the channel (packages, index, manifest) is the one of before; with space freed the next run
    completes."""
    chan, built = one_built
    out = small_disk / "out"
    shutil.copytree(built, out)
    before = state(out)
    proc = run_build(out, chan, tmp_path, "beta_", fill=small_disk)
    assert shutil.disk_usage(small_disk).free < 2**20, "the disk was not filled"
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "FAILED tiny-1.0-beta_" in proc.stdout and f"no space left on the disk of {out}" in proc.stdout, proc.stdout
    assert state(out) == before
    assert_consistent(out)
    (small_disk / "disk-filler").unlink()  # the user frees space
    again = run_build(out, chan, tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert_consistent(out)
    assert len(state(out)["packages"]) == 3
    assert status_of(again.stdout, "beta_") == "built"


def test_the_index_is_stale_when_a_package_file_changed_under_the_same_name(one_built, tmp_path):
    """A build killed after a package was rebuilt under its old name (other sources, same
    variant) but before the index: same names, other file. The run's final re-index must see it."""
    _, built = one_built
    out = tmp_path / "out"
    shutil.copytree(built, out)
    assert not channel.index_is_stale(out)
    (pkg,) = (out / "noarch").glob("*.conda")
    earlier = pkg.stat().st_mtime - 10
    os.utime(out / "noarch" / "repodata.json", (earlier, earlier))  # the package written after the index
    assert channel.index_is_stale(out)
    channel.index(out)
    assert not channel.index_is_stale(out)
    with pkg.open("ab") as f:  # another size, mtime made old again
        f.write(b"\0")
    os.utime(pkg, (0, 0))
    assert channel.index_is_stale(out)
    pkg.unlink()  # listed, not there
    assert channel.index_is_stale(out)


def test_the_recipe_takes_the_compiler_launcher_from_the_environment(monkeypatch):
    """scripts/env.sh's FUSELET_COMPILER_LAUNCHER (sccache) and SCCACHE_SERVER_PORT reach the
    compiling build scripts as CMake's launcher variables; without them a plain rattler-build
    gets none (CMake then uses no launcher), and the packages' hashes are the same."""
    from fuselet_build import matrix, paths

    def render() -> dict[str, dict]:
        rendered = matrix.render(paths.root() / paths.RECIPE, [paths.root() / paths.OFFLINE_VARIANTS])
        scripts = {matrix.job_of(r).key: r.recipe.build.script for r in rendered}
        return {key: (script.get("env") or {}) if isinstance(script, dict) else {} for key, script in scripts.items()}

    monkeypatch.setenv("FUSELET_COMPILER_LAUNCHER", "/opt/cache/bin/sccache")
    monkeypatch.setenv("SCCACHE_SERVER_PORT", "4321")
    with_launcher = render()
    monkeypatch.delenv("FUSELET_COMPILER_LAUNCHER")
    monkeypatch.delenv("SCCACHE_SERVER_PORT")
    plain = render()
    assert set(with_launcher) == set(plain)  # the same packages, the same hashes
    compiled = [k for k in plain if k.startswith(("fuselet-torch-", "fuselet-jax-"))]  # (the core: staging)
    assert compiled
    for key in compiled:
        assert with_launcher[key] == {
            f"CMAKE_{lang}_COMPILER_LAUNCHER": "/opt/cache/bin/sccache" for lang in ("C", "CXX", "CUDA")
        } | {"SCCACHE_SERVER_PORT": "4321"}
        assert not any(plain[key].get(f"CMAKE_{lang}_COMPILER_LAUNCHER") for lang in ("C", "CXX", "CUDA"))
