"""`fuselet-build` as a user runs it: matrix output, and clear errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

from fuselet_build import paths


def test_matrix_json_is_one_entry_per_build_job(cli):
    proc = cli("matrix", "--json", "--variants", "variants/conda-forge.yaml")
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout)
    ids = [j["id"] for j in jobs]
    assert len(ids) == len(set(ids)) and len(ids) == 3 + 1 + (6 + 3) + 4  # no python axis; fuselet-torch: 6 exact + 3 stable
    assert {j["name"] for j in jobs} == {"libfuselet", "fuselet", "fuselet-torch", "fuselet-jax"}
    assert all(j["subdir"] in ("linux-64", "noarch") for j in jobs)


def test_matrix_table_lists_packages_per_output(cli):
    proc = cli("matrix")
    assert proc.returncode == 0, proc.stderr
    assert "packages per output: libfuselet 2, fuselet 1, fuselet-torch 4, fuselet-jax 4" in proc.stdout


def test_unknown_variant_file_is_a_clear_error(cli):
    proc = cli("matrix", "--variants", "variants/no-such-file.yaml")
    assert proc.returncode == 2
    assert "--variants: no such variant file" in proc.stderr and "Traceback" not in proc.stderr


def test_paths_given_are_relative_to_the_working_directory(cli, tmp_path):
    """As with any command: `--variants v.yaml` run elsewhere than the source tree means that
    folder's v.yaml (and `--output out` its out/, never one inside the tree); the defaults are
    the tree's own."""
    (tmp_path / "v.yaml").write_text((paths.root() / paths.OFFLINE_VARIANTS).read_text())
    proc = cli("matrix", "--variants", "v.yaml", cwd=tmp_path)
    assert proc.returncode == 0 and "packages per output: libfuselet 2" in proc.stdout, proc.stderr
    proc = cli("matrix", "--variants", paths.OFFLINE_VARIANTS, cwd=tmp_path)
    assert proc.returncode == 2 and f"{tmp_path / paths.OFFLINE_VARIANTS}" in proc.stderr, proc.stderr
    proc = cli("matrix", cwd=tmp_path)
    assert proc.returncode == 0 and "packages per output: libfuselet 2" in proc.stdout, proc.stderr
    proc = cli("build", "--output", "out", "--offline-channel", "no-channel", cwd=tmp_path)
    assert proc.returncode == 2 and f"the offline channel {tmp_path / 'no-channel'} is not seeded" in proc.stderr


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
    proc = cli("build", "--offline-channel", str(chan), "--output", str(tmp_path / "out"), "--select", "no-such-package")
    assert proc.returncode == 2
    assert "--select" in proc.stderr and "matches none" in proc.stderr


HOLD_LOCK = """
import sys, time
from fuselet_build.errors import UserError
from fuselet_build.lock import folder_lock
with folder_lock(sys.argv[1], "test holder", UserError):
    print("holding", flush=True)
    time.sleep(120)
"""


def test_one_build_per_output_folder_and_a_killed_holder_frees_it(cli, tmp_path):
    """A second build into a busy output folder stops at once, naming the holder; once the holder
    is killed (SIGKILL: no clean-up runs) the folder is free again."""
    import signal

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        proc = cli("build", "--output", str(out), "--select", "libfuselet", timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert f"{out} is in use by pid {holder.pid} (`-c {out}`" in proc.stderr, proc.stderr
        assert "one fuselet-build build at a time per folder" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    from fuselet_build.errors import UserError
    from fuselet_build.lock import folder_lock

    with folder_lock(out, "fuselet-build build", UserError):  # the dead holder's lock is gone
        pass


def test_a_misspelled_variant_key_is_named_with_the_key_it_means(cli, tmp_path):
    """A typo in a variant file must not be ignored silently: an extra key close to one the
    recipe uses is an error saying which; a key the recipe does not know is a warning."""
    import yaml

    variants = yaml.safe_load((paths.root() / "variants/offline.yaml").read_text())
    extra = tmp_path / "extra.yaml"
    extra.write_text("jaxlib_belw: ['0.12']\n")
    proc = cli("matrix", "--variants", "variants/offline.yaml", "--variants", str(extra))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "variant key `jaxlib_belw` is used nowhere in the recipe: did you mean `jaxlib_below`?" in proc.stderr
    # the key renamed away: the render fails, and the error says what was meant
    variants["pytroch"] = variants.pop("pytorch")
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(yaml.safe_dump(variants))
    proc = cli("matrix", "--variants", str(renamed))
    assert proc.returncode == 2 and "cannot render" in proc.stderr, proc.stderr
    assert "did you mean `pytorch`?" in proc.stderr and "Traceback" not in proc.stderr
    # a key no output uses and nothing resembles: a warning, and the matrix
    extra.write_text("my_setting: [1]\n")
    proc = cli("matrix", "--variants", "variants/offline.yaml", "--variants", str(extra))
    assert proc.returncode == 0 and "warning: variant key `my_setting`" in proc.stderr, proc.stderr


def test_a_recipe_with_a_yaml_error_is_a_clear_error(cli, tmp_path):
    bad = tmp_path / "recipe.yaml"
    bad.write_text("schema_version: 1\npackage:\n  name: x\n  version: [1\n")
    for cmd in ("matrix", "build"):
        proc = cli(cmd, "--recipe", str(bad))
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert f"cannot render {bad}" in proc.stderr and "Failed to parse YAML" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
