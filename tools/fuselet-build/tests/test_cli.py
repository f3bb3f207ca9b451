"""`fuselet-build` as a user runs it: matrix output, and clear errors for bad input."""
from __future__ import annotations

import json


def test_matrix_json_is_one_entry_per_build_job(cli):
    proc = cli("matrix", "--json", "--variants", "variants/conda-forge.yaml")
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout)
    ids = [j["id"] for j in jobs]
    assert len(ids) == len(set(ids)) and len(ids) == 3 + 1 + 6 + 4   # no python axis in the framework packages
    assert {j["name"] for j in jobs} == {"libfuselet", "fuselet", "fuselet-torch", "fuselet-jax"}
    assert all(j["subdir"] in ("linux-64", "noarch") for j in jobs)


def test_matrix_table_lists_packages_per_output(cli):
    proc = cli("matrix")
    assert proc.returncode == 0, proc.stderr
    assert "packages per output: libfuselet 2, fuselet 1, fuselet-torch 2, fuselet-jax 4" in proc.stdout


def test_unknown_variant_file_is_a_clear_error(cli):
    proc = cli("matrix", "--variants", "variants/no-such-file.yaml")
    assert proc.returncode == 2
    assert "--variants: no such variant file" in proc.stderr and "Traceback" not in proc.stderr


def test_unreadable_variant_file_is_a_clear_error(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("python: [3.11\n")
    proc = cli("matrix", "--variants", str(bad))
    assert proc.returncode == 2
    assert "--variants: cannot read" in proc.stderr and "Traceback" not in proc.stderr


def test_build_without_a_seeded_channel_says_how_to_seed(cli, tmp_path):
    proc = cli("build", "--offline-channel", str(tmp_path / "none"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "is not seeded yet: run `fuselet-build seed`" in proc.stderr


def test_select_matching_nothing_is_a_clear_error(cli, tmp_path):
    chan = tmp_path / "chan"
    (chan / "noarch").mkdir(parents=True)
    (chan / "noarch" / "repodata.json").write_text('{"packages": {}}')
    proc = cli("build", "--offline-channel", str(chan), "--output", str(tmp_path / "out"),
                         "--select", "no-such-package")
    assert proc.returncode == 2
    assert "--select" in proc.stderr and "matches none" in proc.stderr
