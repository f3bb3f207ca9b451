"""fuselet_build.contents and the channel's file modes, on small real files (no build needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fuselet_build import channel, contents

CC = shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no gcc on PATH to make a shared library")


def shared_library(tmp: Path, name: str, links: list[str] = ()) -> Path:
    """lib<name>.so linked against `links` (other -l names, found in tmp)."""
    src = tmp / f"{name}.c"
    src.write_text(f"int {name}_answer(void) {{ return 42; }}\n")
    out = tmp / f"lib{name}.so"
    libs = [f"-l{lib}" for lib in links]
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src), f"-L{tmp}", "-Wl,--no-as-needed", *libs], check=True)
    return out


@needs_cc
def test_elf_needed_reads_the_dynamic_section(tmp_path):
    shared_library(tmp_path, "dep")
    lib = shared_library(tmp_path, "top", ["dep"])
    assert "libdep.so" in contents.elf_needed(lib)
    assert contents.elf_needed(tmp_path / "top.c") is None  # not an ELF file


@needs_cc
def test_linkage_names_what_no_dependency_provides(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    shared_library(build, "dep")
    pkg = tmp_path / "pkg"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "info").mkdir()
    shutil.copy(shared_library(build, "top", ["dep"]), pkg / "lib")
    problems = contents.linkage_problems(pkg, None)
    assert problems == ["lib/libtop.so needs libdep.so, which no run dependency provides"]
    env = tmp_path / "env"
    (env / "lib").mkdir(parents=True)
    shutil.copy(build / "libdep.so", env / "lib")  # a run dependency installed it
    assert contents.linkage_problems(pkg, env) == []
    (pkg / "lib" / "libdep.so").symlink_to("libtop.so")  # or the package itself
    assert contents.linkage_problems(pkg, None) == []


def test_unreadable_packages_and_index_files_are_named(tmp_path):
    pkg = tmp_path / "linux-64" / "x-1-h0_0.conda"
    pkg.parent.mkdir()
    pkg.write_bytes(b"")
    (pkg.parent / "repodata.json").write_text("{}")
    pkg.chmod(0o600)
    assert contents.readable_problems(pkg) == ["x-1-h0_0.conda is mode -rw-------: not readable by everyone"]
    pkg.chmod(0o644)
    assert contents.readable_problems(pkg) == []


def test_indexing_makes_packages_and_index_readable_by_everyone(tmp_path):
    import rattler_build

    files = tmp_path / "files"
    (files / "share").mkdir(parents=True)
    (files / "share" / "a.txt").write_text("a\n")
    out = rattler_build.assemble_package("tiny", "1.0", "linux-64", "h0_0", tmp_path / "out", files_dir=files)
    chan = tmp_path / "chan"
    (chan / "linux-64").mkdir(parents=True)
    pkg = chan / "linux-64" / Path(out.path).name
    shutil.move(out.path, pkg)
    pkg.chmod(0o600)  # as rattler-build writes its packages
    channel.index(chan)
    for path in [pkg, *(chan / sub / "repodata.json" for sub in channel.SUBDIRS)]:
        assert path.stat().st_mode & 0o444 == 0o444, (path, oct(path.stat().st_mode))
    assert contents.readable_problems(pkg) == []


def test_dist_info_is_required_of_the_python_parts(tmp_path):
    sp = tmp_path / "lib/python3.11/site-packages"
    (sp / "fuselet/torch").mkdir(parents=True)
    assert "no site-packages/fuselet-0.2.0.dist-info" in contents.dist_info_problems(tmp_path, "fuselet", "0.2.0")[0]
    di = sp / "fuselet-0.2.0.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: fuselet\nVersion: 0.2.0\n")
    assert contents.dist_info_problems(tmp_path, "fuselet", "0.2.0") == []


@needs_cc
def test_verify_refuses_a_framework_package_tied_to_one_python(tmp_path):
    """fuselet-torch / fuselet-jax serve every python: a python pin, a file under lib/pythonX.Y or
    a library linking libpython each make verify fail, naming it."""
    from fuselet_build import matrix, verify

    job = matrix.Job("fuselet-torch", "0.2.0", "cpu_torch213_h0000000_0", "linux-64", {})
    pkg = tmp_path / "pkg"
    (pkg / "lib" / "fuselet" / "torch").mkdir(parents=True)
    shutil.copy(shared_library(tmp_path, "clean"), pkg / "lib" / "fuselet" / "torch" / "libfuselet_torch.so")
    assert verify.python_free_problems(pkg, ["pytorch >=2.13.0,<2.14.0a0", "libfuselet ==0.2.0 cpu_h0_0"], job) == []
    assert verify.python_free_problems(pkg, ["python >=3.11,<3.12.0a0"], job) == [
        "depends on python >=3.11,<3.12.0a0: the package would be tied to one Python"
    ]
    (pkg / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (pkg / "lib" / "python3.11" / "site-packages" / "x.py").write_text("")
    assert verify.python_free_problems(pkg, [], job) == ["lib/python3.11/site-packages/x.py is under a Python folder"]
    shutil.rmtree(pkg / "lib" / "python3.11")
    shared_library(tmp_path, "python3")
    shutil.copy(shared_library(tmp_path, "ext", ["python3"]), pkg / "lib" / "fuselet" / "torch" / "libext.so")
    assert verify.python_free_problems(pkg, [], job) == ["lib/fuselet/torch/libext.so links libpython3.so"]
    other = matrix.Job("fuselet", "0.2.0", "pyh0000000_0", "noarch", {})
    assert verify.python_free_problems(pkg, ["python >=3.10"], other) == []  # the noarch package may
