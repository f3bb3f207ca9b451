"""`fuselet-build seed` (fuselet_build.seed and its modules): the offline conda channel.

Fast tests (no network): wheel metadata -> conda depends (markers, extras, renames, specs),
build strings, the conda file layout of a wheel, the activation scripts, the failure paths
(no space, a wheel that has gone, an interrupt: clear message, index untouched).
One slow end-to-end test seeds a CPU-only channel (or reuses FUSELET_OFFLINE_CHANNEL when it
points at a seeded channel) and runs torch from an environment made from it alone.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from fuselet_build import paths, seed
from fuselet_build.seed import host, report, wheels
from fuselet_build.seed.cache import Cache, SeedError
from fuselet_build.seed.channel import check_space
from fuselet_build.seed.pip import ResolvedWheel, fetch_wheels
from fuselet_build.seed.wheels import plan_wheel

ROOT = paths.root()

T = wheels.Target(python=(3, 11))


def make_wheel(
    tmp: Path,
    name: str,
    version: str,
    *,
    requires=(),
    tag="py3-none-any",
    files=None,
    entry_points: str = "",
    purelib: bool = True,
) -> Path:
    """A small wheel file written with zipfile (no network, no build backend)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = tmp / f"{dist}-{tag}.whl"
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        "Summary: test wheel",
        "License: MIT",
        "Requires-Python: >=3.9",
    ] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA", "\n".join(meta) + "\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
        if entry_points:
            zf.writestr(f"{dist}.dist-info/entry_points.txt", entry_points)
        for rel, (data, mode) in (files or {}).items():
            info = zipfile.ZipInfo(rel.replace("{data}", f"{dist}.data"))
            info.external_attr = (mode & 0xFFFF) << 16
            zf.writestr(info, data)
    return path


# --- specs, names, markers, extras ---------------------------------------------------------


@pytest.mark.parametrize(
    "pep440, conda",
    [
        (">=1.4.2,<14", ">=1.4.2,<14"),
        ("~=3.8.0", ">=3.8.0,3.8.*"),
        ("~=2.1", ">=2.1,2.*"),
        ("==13.1.1.3.*", "13.1.1.3.*"),
        ("==2.13.0+cpu", "==2.13.0"),
        ("!=1.2.*", "!=1.2.*"),
        ("===1.0", "==1.0"),
        ("", ""),
    ],
)
def test_pep440_specifiers_become_conda_match_specs(pep440, conda):
    assert wheels.conda_spec(pep440) == conda


def test_names_follow_conda_forge():
    assert wheels.conda_name("torch") == "pytorch"
    assert wheels.conda_name("Typing_Extensions") == "typing_extensions"
    assert wheels.conda_name("ml-dtypes") == "ml_dtypes"
    assert wheels.conda_name("scikit_build_core") == "scikit-build-core"
    assert wheels.conda_name("Jinja2") == "jinja2"
    assert wheels.conda_version("2.13.0+cpu") == "2.13.0"


def test_depends_evaluate_markers_drop_extras_and_rename(tmp_path):
    whl = make_wheel(
        tmp_path,
        "demo",
        "1.0",
        requires=[
            "torch>=2.13",
            "typing-extensions>=4.10",
            "numpy; python_version >= '3.10'",
            "tomli; python_version < '3.11'",
            "pywin32; sys_platform == 'win32'",
            "pytest; extra == 'test'",
            "sympy>=1.13,<1.15",
            "sympy!=1.13.1",
            "nvidia-nccl-cu13==2.30.7; platform_system == 'Linux' and platform_machine == 'x86_64'",
        ],
    )
    info = wheels.read_wheel(whl)
    deps = wheels.conda_depends(info, T)
    assert deps == [
        "pytorch >=2.13",
        "typing_extensions >=4.10",
        "numpy",
        "sympy >=1.13,<1.15,!=1.13.1",
        "nvidia-nccl-cu13 ==2.30.7",
    ]


def test_extras_expand_to_what_they_stand_for(tmp_path):
    """torch 2.14 needs cuda-toolkit[cublas,cudart]: the extras' own requirements become depends."""
    torch = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "torch",
            "2.14.1",
            tag="cp311-cp311-manylinux_2_28_x86_64",
            purelib=False,
            requires=['cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"'],
        )
    )
    toolkit = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "cuda-toolkit",
            "13.0.3.0",
            requires=[
                "nvidia-cublas==13.1.1.3.*; sys_platform == 'linux' and extra == 'cublas'",
                "nvidia-cuda-runtime==13.0.96.*; sys_platform == 'linux' and extra == 'cudart'",
                "nvidia-npp==13.0.1.2.*; sys_platform == 'linux' and extra == 'npp'",
                "nvidia-cublas==13.1.1.3.*; sys_platform == 'win32' and extra == 'cudart'",
            ],
        )
    )
    warnings = []
    deps = wheels.conda_depends(torch, T, {"cuda-toolkit": [toolkit]}, warnings.append)
    assert deps == ["cuda-toolkit ==13.0.3", "nvidia-cublas 13.1.1.3.*", "nvidia-cuda-runtime 13.0.96.*"]
    assert not warnings
    # without the extra's metadata: the package alone, and a warning naming what was dropped
    deps = wheels.conda_depends(torch, T, {}, warnings.append)
    assert deps == ["cuda-toolkit ==13.0.3"] and "cublas" in warnings[0]


# --- build strings and layout --------------------------------------------------------------


def test_build_strings(tmp_path):
    pure = wheels.read_wheel(make_wheel(tmp_path, "pure", "1.0"))
    cp = wheels.read_wheel(make_wheel(tmp_path, "ext", "1.0", tag="cp311-cp311-manylinux_2_28_x86_64", purelib=False))
    cpu = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "torch",
            "2.13.0+cpu",
            tag="cp311-cp311-manylinux_2_28_x86_64",
            purelib=False,
            files={"torch/version.py": ("cuda = None\n", 0o644)},
        )
    )
    cuda = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "torch",
            "2.14.1",
            tag="cp311-cp311-manylinux_2_28_x86_64",
            purelib=False,
            files={"torch/version.py": ("cuda: Optional[str] = '13.0'\n", 0o644)},
        )
    )
    jaxlib = wheels.read_wheel(make_wheel(tmp_path, "jaxlib", "0.10.2", tag="cp311-cp311-manylinux_2_27_x86_64", purelib=False))
    plans = {k: plan_wheel(i, T, {}) for k, i in {"pure": pure, "cp": cp, "cpu": cpu, "cuda": cuda, "jaxlib": jaxlib}.items()}
    assert plans["pure"].build.startswith("pyh") and plans["pure"].build.endswith("_0")
    assert plans["pure"].subdir == "noarch" and plans["pure"].noarch == "python"
    assert plans["pure"].depends == ["python >=3.9"]
    assert plans["cp"].build.startswith("py311h") and plans["cp"].subdir == "linux-64"
    assert plans["cp"].depends == ["python >=3.11,<3.12.0a0", "python_abi 3.11.* *_cp311"]
    assert plans["cpu"].name == "pytorch" and plans["cpu"].version == "2.13.0"
    # pytorch-cpu-feedstock: cpu_<blas>_py311_h<hash>_N, mkl +100, CUDA +200
    assert plans["cpu"].build.startswith("cpu_mkl_py311_h") and plans["cpu"].build.endswith("_100")
    assert "numpy" in plans["cpu"].depends  # the wheel does not declare it; conda-forge's does
    assert plans["cuda"].build.startswith("cuda130_mkl_py311_h") and plans["cuda"].build.endswith("_300")
    assert plans["cuda"].build_number == 300 and "cuda-version >=13.0,<14" in plans["cuda"].depends
    assert "__cuda" in plans["cuda"].depends and "__cuda" not in plans["cpu"].depends
    # jaxlib-feedstock: cpu_py311h<hash>_0 (no "_" before the hash)
    assert re.fullmatch(r"cpu_py311h[0-9a-f]{7}_0", plans["jaxlib"].build), plans["jaxlib"].build
    for p in plans.values():  # h + 7 hex digits, and the file name conda expects
        assert len(p.build.split("h")[-1].split("_")[0]) == 7
        assert p.filename == f"{p.name}-{p.version}-{p.build}.conda"
    # the hash follows the wheel's content
    assert plan_wheel(pure, T, {}).build == plans["pure"].build
    pure.sha256 = "0" * 64
    assert plan_wheel(pure, T, {}).build != plans["pure"].build


def test_a_cuda_jaxlib_packs_its_plugin_wheels_as_conda_forge_does(tmp_path):
    jaxlib = wheels.read_wheel(
        make_wheel(tmp_path, "jaxlib", "0.10.2", tag="cp311-cp311-manylinux_2_27_x86_64", purelib=False, requires=["numpy>=1.26"])
    )
    plugin = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "jax-cuda13-plugin",
            "0.10.2",
            tag="cp311-cp311-manylinux_2_27_x86_64",
            purelib=False,
            requires=[
                "jax-cuda13-pjrt==0.10.2",
                'nvidia-cublas>=13.0.0.19; sys_platform == "linux" and extra == "with-cuda"',
                'nvidia-nvvm; extra == "with-cuda"',
            ],
            files={"jax_cuda13_plugin/__init__.py": ("", 0o644)},
        )
    )
    pjrt = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "jax-cuda13-pjrt",
            "0.10.2",
            tag="py3-none-manylinux_2_27_x86_64",
            purelib=False,
            files={"jax_plugins/xla_cuda13/__init__.py": ("", 0o644)},
        )
    )
    other = wheels.read_wheel(
        make_wheel(tmp_path, "jax-cuda13-plugin", "0.8.3", tag="cp311-cp311-manylinux_2_27_x86_64", purelib=False)
    )
    closure = {"nvidia-cublas": [plugin]}  # nvidia-nvvm is not in the channel
    warnings = []
    plans, used = wheels.cuda_jaxlib_plans([jaxlib, plugin, pjrt, other], T, closure, warnings.append)
    (plan,) = plans  # 0.8.3 has no pjrt wheel: no CUDA jaxlib for it
    assert used == {str(plugin.path), str(pjrt.path)}
    assert plan.name == "jaxlib" and re.fullmatch(r"cuda130_py311h[0-9a-f]{7}_200", plan.build), plan.build
    assert {"numpy >=1.26", "nvidia-cublas >=13.0.0.19", "cuda-version >=13.0,<14", "__cuda"} <= set(plan.depends)
    assert not [d for d in plan.depends if d.startswith(("jax-cuda13", "nvidia-nvvm"))], plan.depends
    assert "nvidia-nvvm" in warnings[0]
    assert plan.build != plan_wheel(jaxlib, T, closure).build
    staged = tmp_path / "staged"
    for w in (plan.info, *plan.bundled):
        wheels.stage_wheel(w, staged, T)
    sp = staged / T.site_packages
    assert (sp / "jax_plugins/xla_cuda13/__init__.py").exists() and (sp / "jax_cuda13_plugin/__init__.py").exists()


def test_a_torch_wheel_becomes_libtorch_and_pytorch_as_conda_forge_splits_it(tmp_path):
    from fuselet_build.seed import libtorch

    cuda = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "torch",
            "2.14.1",
            tag="cp311-cp311-manylinux_2_28_x86_64",
            purelib=False,
            requires=["nvidia-cublas==13.1.1.3", "sympy>=1.13"],
            files={
                "torch/version.py": ("cuda = '13.0'\n", 0o644),
                "torch/__init__.py": ("", 0o644),
                "torch/lib/libtorch_cpu.so": ("elf", 0o755),
                "torch/lib/libtorch_python.so": ("elf", 0o755),
                "torch/include/": ("", 0o755),  # a folder entry
                "torch/include/ATen/ATen.h": ("", 0o644),
                "torch/share/cmake/Torch/TorchConfig.cmake": ("", 0o644),
                "torch/bin/torch_shm_manager": ("", 0o755),
            },
        )
    )
    plan = plan_wheel(cuda, T, {})
    pytorch, lib = libtorch.split_plan(plan, T)
    # pytorch-cpu-feedstock: libtorch has no python in its build string; pytorch pins it exactly
    assert re.fullmatch(r"cuda130_mkl_h[0-9a-f]{7}_300", lib.build), lib.build
    assert re.fullmatch(r"cuda130_mkl_py311_h[0-9a-f]{7}_300", pytorch.build), pytorch.build
    assert f"libtorch ==2.14.1 {lib.build}" in pytorch.depends
    assert "nvidia-cublas ==13.1.1.3" in lib.depends and "cuda-version >=13.0,<14" in lib.depends
    assert not [d for d in lib.depends if d.startswith(("python", "sympy"))], lib.depends
    assert "sympy >=1.13" in pytorch.depends and "nvidia-cublas ==13.1.1.3" not in pytorch.depends
    files, native = tmp_path / "files", tmp_path / "libtorch"
    wheels.stage_wheel(cuda, files, T)
    libtorch.split_files(files, T, native, cuda.path)
    torch = files / T.site_packages / "torch"
    for rel in ("lib/libtorch_cpu.so", "include/ATen/ATen.h", "share/cmake/Torch/TorchConfig.cmake", "bin/torch_shm_manager"):
        assert (native / rel).is_file(), rel
    assert (torch / "lib/libtorch_python.so").is_file() and not (torch / "lib/libtorch_python.so").is_symlink()
    # in the prefix, site-packages/torch/lib/libtorch_cpu.so is a link to <prefix>/lib/libtorch_cpu.so
    link = torch / "lib/libtorch_cpu.so"
    assert link.is_symlink() and (link.parent / os.readlink(link)).resolve() == (files / "lib/libtorch_cpu.so").resolve()
    assert (torch / "share/cmake").is_symlink() and (torch / "include/ATen").is_symlink()
    # its dist-info no longer asks pip for the nvidia-* wheels (libtorch's packages provide them)
    (meta,) = (files / T.site_packages).glob("torch-*.dist-info/METADATA")
    assert "Requires-Dist: sympy>=1.13" in meta.read_text() and "nvidia" not in meta.read_text()
    # each side stages only its own members (the libraries are never extracted for pytorch)
    for part in ("pytorch", "libtorch"):
        files, native = tmp_path / part / "files", tmp_path / part / "libtorch"
        wheels.stage_wheel(cuda, files, T, keep=libtorch.keeps(part))
        libtorch.split_files(files, T, native, cuda.path)
        torch = files / T.site_packages / "torch"
        assert (torch / "lib/libtorch_cpu.so").is_symlink() and (torch / "include/ATen").is_symlink()
        assert (native / "lib/libtorch_cpu.so").is_file() == (part == "libtorch")
        assert (torch / "__init__.py").is_file() == (torch / "lib/libtorch_python.so").is_file() == (part == "pytorch")


def _torch_wheel(tmp: Path, tag: str, lib: str) -> wheels.WheelInfo:
    (tmp / tag).mkdir()
    return wheels.read_wheel(
        make_wheel(
            tmp / tag,
            "torch",
            "2.14.1",
            tag=f"{tag}-{tag}-manylinux_2_28_x86_64",
            purelib=False,
            requires=["nvidia-cublas==13.1.1.3"],
            files={
                "torch/version.py": ("cuda = '13.0'\n", 0o644),
                "torch/lib/libtorch_cpu.so": (lib, 0o755),
                "torch/lib/libtorch_python.so": (tag, 0o755),
                f"torch/_C.{tag}.so": (tag, 0o755),
            },
        )
    )


def test_the_pytorch_of_another_python_pins_the_same_libtorch(tmp_path):
    """The torch wheels of one release carry the same C++ libraries for every CPython: the
    pytorch of python 3.12 is pinned to the libtorch made from the 3.11 wheel."""
    from fuselet_build.seed import libtorch

    t312 = wheels.Target(python=(3, 12))
    w311, w312 = _torch_wheel(tmp_path, "cp311", "elf"), _torch_wheel(tmp_path, "cp312", "elf")
    assert libtorch.same_libraries(w311.path, w312.path) == []  # libtorch_python and _C differ: not libtorch's
    _, lib = libtorch.split_plan(plan_wheel(w311, T, {}), T)
    main = [lib]
    cache = Cache(tmp_path / "cache")
    (py312,) = seed._shared_libtorch(cache, plan_wheel(w312, t312, {}), t312, main, [])
    assert f"libtorch ==2.14.1 {lib.build}" in py312.depends and "python >=3.12,<3.13.0a0" in py312.depends
    assert re.fullmatch(r"cuda130_mkl_py312_h[0-9a-f]{7}_300", py312.build), py312.build
    # a wheel whose C++ library differs gets a libtorch of its own, and a warning naming the file
    other = _torch_wheel(tmp_path, "cp313", "other elf")
    warnings: list[str] = []
    parts = seed._shared_libtorch(cache, plan_wheel(other, T, {}), T, main, warnings)
    assert {p.name for p in parts} == {"pytorch", "libtorch"} and parts[1].build != lib.build
    assert "torch/lib/libtorch_cpu.so" in warnings[0], warnings


def test_libraries_are_interchangeable_when_they_map_the_same_bytes(tmp_path):
    """What the torch wheels of two CPythons may differ in: the unloaded symbol table of an ELF
    file, the build's temporary folder in a text file. Anything else is a different library."""
    from fuselet_build.seed import libtorch

    cc = shutil.which("gcc") or pytest.skip("no gcc")
    built = {}
    for name, helper, value in (("a", "helper_one", 1), ("b", "helper_two", 1), ("c", "helper_one", 2)):
        src = tmp_path / f"{name}.c"
        src.write_text(f"static int {helper}(int x) {{ return x + {value}; }}\nint api(int x) {{ return {helper}(x); }}\n")
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(tmp_path / f"{name}.so"), str(src)], check=True)
        built[name] = (tmp_path / f"{name}.so").read_bytes()
    assert built["a"] != built["b"]  # the local symbol's name differs ...
    assert libtorch._equivalent(built["a"], built["b"])  # ... in what is not loaded
    assert not libtorch._equivalent(built["a"], built["c"])  # other code is another library
    cfg = 'set(ATEN_INCLUDE_DIR "/tmp/tmp{}/wheel/platlib/torch/include")\n'
    assert libtorch._equivalent(cfg.format("zagopw2n").encode(), cfg.format("2r7f3y59").encode())
    assert not libtorch._equivalent(cfg.format("zagopw2n").encode(), cfg.replace("include", "inc").format("x").encode())


def test_nvidia_library_wheels_become_python_free_packages(tmp_path):
    """conda-forge's CUDA libraries hold no Python: nvidia/<x>/... goes to lib/nvidia/<x>/...,
    one package (one file name) serves every python."""
    info = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "nvidia-cublas",
            "13.1.1.3",
            tag="py3-none-manylinux_2_27_x86_64",
            purelib=False,
            requires=["nvidia-cuda-nvrtc"],
            files={
                "nvidia/cu13/lib/libcublas.so.13": ("elf", 0o755),
                "nvidia/cu13/include/cublas.h": ("", 0o644),
                "nvidia/__init__.py": ("", 0o644),
                "nvidia_cublas-13.1.1.3.dist-info/licenses/License.txt": ("L", 0o644),
            },
        )
    )
    assert info.native and info.python_independent and not info.pure
    p311, p312 = plan_wheel(info, T, {}), plan_wheel(info, wheels.Target(python=(3, 12)), {})
    assert p311.filename == p312.filename and p311.subdir == "linux-64" and p311.noarch is None
    assert p311.depends == ["nvidia-cuda-nvrtc"] and re.fullmatch(r"h[0-9a-f]{7}_0", p311.build), p311
    out = tmp_path / "pkg"
    wheels.stage_wheel(info, out, T)
    got = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert got == [
        "lib/nvidia/cu13/include/cublas.h",
        "lib/nvidia/cu13/lib/libcublas.so.13",
        "share/licenses/nvidia-cublas/License.txt",
    ], got
    # a wheel of one CPython is not native, whatever its name
    assert not wheels.read_wheel(
        make_wheel(tmp_path, "nvidia-x", "1", tag="cp311-cp311-manylinux_2_27_x86_64", purelib=False)
    ).native


SP = "lib/python3.11/site-packages"


@pytest.mark.parametrize(
    "entries, written_for, loaded_from, expected",
    [
        # libtorch: written for site-packages/torch/lib, lives in lib/, loaded from both
        (
            ["$ORIGIN/../../nvidia/cu13/lib", "$ORIGIN"],
            f"{SP}/torch/lib",
            ["lib", f"{SP}/torch/lib"],
            ["$ORIGIN/nvidia/cu13/lib", "$ORIGIN/../../../../nvidia/cu13/lib", "$ORIGIN"],
        ),
        # the CUDA jaxlib's plugin: only the entry that reaches site-packages/nvidia moves
        (
            ["$ORIGIN/../../nvidia/cudnn/lib", "$ORIGIN/../nvidia/cudnn/lib", "$ORIGIN/../../tensorrt"],
            f"{SP}/jax_plugins/xla_cuda13",
            [f"{SP}/jax_plugins/xla_cuda13"],
            ["$ORIGIN/../../../../nvidia/cudnn/lib", "$ORIGIN/../nvidia/cudnn/lib", "$ORIGIN/../../tensorrt"],
        ),
        (
            ["/usr/lib", "$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/cu13/lib"],
            f"{SP}/jax_cuda13_plugin",
            [f"{SP}/jax_cuda13_plugin"],
            ["/usr/lib", "$ORIGIN/../../../nvidia/cu13/lib"],
        ),
    ],
)
def test_runpaths_into_site_packages_nvidia_reach_lib_nvidia(entries, written_for, loaded_from, expected):
    from fuselet_build.seed import nvidia

    assert nvidia.new_runpath(entries, written_for, loaded_from, SP) == expected


def test_a_relocated_library_loads_from_the_prefix_and_through_site_packages(tmp_path):
    """The loader's view: a library moved from site-packages/torch/lib to lib/ (with a link
    left behind) finds its NVIDIA dependency in lib/nvidia from both places."""
    from fuselet_build.seed import nvidia

    cc = shutil.which("gcc") or pytest.skip("no gcc")
    prefix = tmp_path / "prefix"
    nv = prefix / "lib/nvidia/cu13/lib"
    nv.mkdir(parents=True)
    (tmp_path / "b.c").write_text("int nv_b(void) { return 42; }\n")
    (tmp_path / "a.c").write_text("int nv_b(void);\nint torch_a(void) { return nv_b(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(nv / "libnvb.so"), str(tmp_path / "b.c")], check=True)
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-o",
            str(prefix / "lib/libtorcha.so"),
            str(tmp_path / "a.c"),
            f"-L{nv}",
            "-lnvb",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/cu13/lib:$ORIGIN",
        ],
        check=True,
    )
    link_dir = prefix / SP / "torch/lib"
    link_dir.mkdir(parents=True)
    (link_dir / "libtorcha.so").symlink_to("../../../../libtorcha.so")
    load = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).torch_a())"
    paths = [prefix / "lib/libtorcha.so", link_dir / "libtorcha.so"]
    before = [subprocess.run([sys.executable, "-c", load, str(p)], capture_output=True, text=True) for p in paths]
    assert all(p.returncode != 0 and "libnvb.so" in p.stderr for p in before)  # the wheel's RUNPATH misses
    assert nvidia.relocate_runpaths(prefix, SP, {"lib": f"{SP}/torch/lib"}) == 1
    for p in paths:
        proc = subprocess.run([sys.executable, "-c", load, str(p)], capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stdout.strip() == "42", (p, proc.stderr)


def test_wheel_layout_scripts_and_entry_points(tmp_path):
    whl = make_wheel(
        tmp_path,
        "tool",
        "2.0",
        tag="py3-none-manylinux_2_17_x86_64",
        purelib=False,
        entry_points="[console_scripts]\ntool-cli = toolmod.cli:main\ntool-bin = toolmod:other\n",
        files={
            "toolmod/__init__.py": ("def other():\n    return 0\n", 0o644),
            "toolmod/cli.py": ("import sys\ndef main():\n    print('cli', sys.argv[1:])\n", 0o644),
            "{data}/scripts/tool-bin": (b"\x7fELF-not-really", 0o755),
            "{data}/scripts/tool-py": ("#!python\nprint('script ran')\n", 0o755),
            "{data}/data/share/tool/data.txt": ("x", 0o644),
        },
    )
    info = wheels.read_wheel(whl)
    out = tmp_path / "pkg"
    wheels.stage_wheel(info, out, T)
    sp = out / "lib/python3.11/site-packages"
    assert (sp / "toolmod/cli.py").exists() and (out / "share/tool/data.txt").exists()
    assert (sp / "tool-2.0.dist-info/INSTALLER").read_text() == "conda\n"
    assert (out / "bin/tool-bin").read_bytes() == b"\x7fELF-not-really"  # the wheel's own program wins
    for script in ("tool-cli", "tool-py", "tool-bin"):
        assert os.access(out / "bin" / script, os.X_OK), script
    # the launchers run with the python next to them, whatever the prefix is
    os.symlink(sys.executable, out / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(sp)}
    run = subprocess.run([str(out / "bin/tool-cli"), "a", "b"], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "cli ['a', 'b']", run.stderr
    run = subprocess.run([str(out / "bin/tool-py")], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "script ran", run.stderr
    # a pure wheel: noarch python layout
    pure = wheels.read_wheel(
        make_wheel(
            tmp_path, "puretool", "1.0", entry_points="[console_scripts]\npt = p:m\n", files={"p.py": ("def m(): pass\n", 0o644)}
        )
    )
    wheels.stage_wheel(pure, tmp_path / "noarch", T)
    assert (tmp_path / "noarch/site-packages/p.py").exists()
    assert (tmp_path / "noarch/python-scripts/pt").exists()


# --- host toolchain ------------------------------------------------------------------------

HOST = host.HostToolchain(
    gcc_version="12.2.0",
    triplet="x86_64-linux-gnu",
    glibc="2.36",
    tools={"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++", "GXX": "/usr/bin/g++", "AR": "/usr/bin/ar"},
    cuda_root=Path("/opt/cuda-13.0"),
    nvcc_version="13.0.88",
)


def test_host_packages_are_what_compiler_and_stdlib_ask_for():
    pkgs = {p.name: p for p in host.host_packages(HOST, T)}
    assert set(pkgs) == {
        "gcc_linux-64",
        "gxx_linux-64",
        "sysroot_linux-64",
        "cuda-version",
        "cuda-nvcc_linux-64",
    }  # cuda-cudart(-dev): from NVIDIA's wheels (seed.cuda)
    assert pkgs["gxx_linux-64"].version == "12.2.0"  # matches `gxx_linux-64 12.*`
    assert pkgs["gxx_linux-64"].depends == ["gcc_linux-64 ==12.2.0"]
    assert pkgs["sysroot_linux-64"].version == "2.36" and pkgs["sysroot_linux-64"].subdir == "noarch"
    assert pkgs["cuda-nvcc_linux-64"].version == "13.0.88"  # matches `cuda-nvcc_linux-64 13.0.*`
    assert "cuda-version >=13.0,<13.1.0a0" in pkgs["cuda-nvcc_linux-64"].depends
    assert pkgs["cuda-version"].constrains[0] == "__cuda >=13"
    assert pkgs["gcc_linux-64"].build.startswith("h") and pkgs["gcc_linux-64"].filename.endswith("_0.conda")
    no_cuda = host.HostToolchain(**{**HOST.__dict__, "cuda_root": None, "nvcc_version": None})
    assert not [p for p in host.host_packages(no_cuda, T) if p.name.startswith("cuda")]


def test_one_python_per_minor_from_the_interpreters_beside_the_running_one(tmp_path):
    versions = tmp_path / "versions"
    for v in ("3.9.18", "3.10.13", "3.11.7", "3.12.0", "3.12.1", "3.13.0", "3.14.0"):
        (versions / v / "bin").mkdir(parents=True)
        (versions / v / "bin" / f"python{v.rsplit('.', 1)[0]}").touch()
    running = host.Interpreter(versions / "3.11.7", "3.11.7")
    found = host.find_interpreters(running)
    assert [(i.version, i.prefix.name) for i in found] == [
        ("3.10.13", "3.10.13"),
        ("3.11.7", "3.11.7"),
        ("3.12.1", "3.12.1"),
        ("3.13.0", "3.13.0"),
    ]
    # python-feedstock / python_abi-feedstock: _cpython up to 3.12, _cp313 from 3.13; python_abi 8_cp3XY
    assert [i.tag for i in found] == ["cpython", "cpython", "cpython", "cp313"]
    assert found[3].filename("abc1234") == "python-3.13.0-habc1234_0_cp313.conda"
    abi = {i.short: host.python_abi_package(i, "linux-64") for i in found}
    assert abi["3.11"].build == "8_cp311" and abi["3.11"].constrains == ["python 3.11.* *_cpython"]
    assert abi["3.13"].build == "8_cp313" and abi["3.13"].constrains == ["python 3.13.* *_cp313"]


def test_cuda_wheels_get_their_cuda_version_even_without_nvcc(tmp_path):
    cuda = wheels.read_wheel(
        make_wheel(
            tmp_path,
            "torch",
            "2.14.1",
            tag="cp311-cp311-manylinux_2_28_x86_64",
            purelib=False,
            files={"torch/version.py": ("cuda = '13.0'\n", 0o644)},
        )
    )
    plans = [plan_wheel(cuda, T, {})]
    no_cuda = host.HostToolchain(**{**HOST.__dict__, "cuda_root": None, "nvcc_version": None})
    extra = host.cuda_version_packages(plans, host.host_packages(no_cuda, T))
    assert [(p.name, p.version) for p in extra] == [("cuda-version", "13.0")]
    assert host.cuda_version_packages(plans, host.host_packages(HOST, T)) == []


def test_activation_scripts_export_and_restore(tmp_path):
    pkgs = {p.name: p for p in host.host_packages(HOST, T)}
    act, deact = pkgs["cuda-nvcc_linux-64"].scripts()
    assert "export CUDACXX=/opt/cuda-13.0/bin/nvcc" in act
    assert "export CUDAToolkit_ROOT=/opt/cuda-13.0" in act
    gxx_act, _ = pkgs["gxx_linux-64"].scripts()
    assert "export CXX=/usr/bin/g++" in gxx_act
    (tmp_path / "a.sh").write_text(act)
    (tmp_path / "d.sh").write_text(deact)
    script = (
        f"export CMAKE_ARGS=-DFOO=1; unset CUDA_HOME; export CUDACXX=old; . {tmp_path}/a.sh; "
        f'echo "$CUDACXX|$CUDA_HOME|$CMAKE_ARGS"; . {tmp_path}/d.sh; '
        f'echo "$CUDACXX|${{CUDA_HOME-unset}}|$CMAKE_ARGS"'
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == (
        "/opt/cuda-13.0/bin/nvcc|/opt/cuda-13.0|-DFOO=1 -DCUDAToolkit_ROOT=/opt/cuda-13.0 "
        "-DCUDA_TOOLKIT_ROOT_DIR=/opt/cuda-13.0 -DCMAKE_CUDA_COMPILER=/opt/cuda-13.0/bin/nvcc"
    )
    assert out[1] == "old|unset|-DFOO=1"


def test_cuda_root_is_found_through_a_wrapper_script(tmp_path):
    real = tmp_path / "cuda-13.0" / "bin" / "nvcc"
    real.parent.mkdir(parents=True)
    real.write_text("#!/bin/sh\n")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    assert host.find_cuda_root(str(wrapper)) == tmp_path / "cuda-13.0"
    assert host.find_cuda_root(str(real)) == tmp_path / "cuda-13.0"


# --- failures: clear message, partial results kept, index never broken ---------------------


@pytest.fixture
def old_channel(tmp_path):
    chan = tmp_path / "channel"
    for sub in ("noarch", "linux-64"):
        (chan / sub).mkdir(parents=True)
        (chan / sub / "repodata.json").write_text('{"sentinel": true}')
    return chan


@pytest.mark.parametrize(
    "failure, expected",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device while making the `python`"),
        (KeyboardInterrupt(), "interrupted while making the `python` package"),
    ],
)
def test_failure_keeps_the_index_and_says_what_failed(monkeypatch, tmp_path, old_channel, failure, expected):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(seed, "make_python_package", fail)
    monkeypatch.setattr(seed, "check_interpreter", lambda target: None)
    monkeypatch.setattr(seed, "python_package_key", lambda target: "0000000")
    with pytest.raises(SeedError) as err:
        seed.seed(old_channel, tmp_path / "cache", with_cuda=False, progress=False, groups={})
    assert expected in str(err.value)
    assert "channel index" in str(err.value) and "unchanged" in str(err.value)
    for sub in ("noarch", "linux-64"):
        assert (old_channel / sub / "repodata.json").read_text() == '{"sentinel": true}'
    assert not (tmp_path / "cache" / "tmp").exists()


def test_not_enough_space_is_said_before_any_work(monkeypatch, tmp_path, old_channel):
    whl = make_wheel(tmp_path, "big", "1.0", files={"big/data.bin": (b"0" * 4096, 0o644)})
    plan = plan_wheel(wheels.read_wheel(whl), T, {})
    cache = Cache(tmp_path / "cache")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: type("U", (), {"free": 100})())
    with pytest.raises(SeedError, match="not enough free disk space"):
        check_space(cache, old_channel, [plan], py_cached=True)


def test_a_wheel_that_has_gone_is_named(tmp_path):
    cache = Cache(tmp_path / "cache")
    gone = ResolvedWheel("lostpkg", "1.0", (tmp_path / "lostpkg-1.0-py3-none-any.whl").as_uri(), None)
    with pytest.raises(SeedError, match="lostpkg 1.0: .* has gone"):
        fetch_wheels(cache, [gone], report.ProgressUi(False))


def test_one_seed_per_cache(tmp_path):
    cache = Cache(tmp_path / "cache")
    with cache.lock():
        with pytest.raises(SeedError, match=r"is in use by pid \d+ .* one `fuselet-build seed`"):
            seed.seed(tmp_path / "channel", tmp_path / "cache", progress=False, groups={})


def stand_in_pythons(monkeypatch, made: list | None = None) -> None:
    """seed() makes empty `python` packages (named as the real ones) instead of packing the
    interpreters; `made` collects the versions it made."""
    import rattler_build

    def fake_python(cache, interp, subdir, opts, key):
        if made is not None:
            made.append(interp.version)
        work = cache.workdir("fakepy")
        (work / "files").mkdir()
        out = rattler_build.assemble_package(
            "python", interp.version, subdir, f"h{key}_0_{interp.tag}", work / "out", files_dir=work / "files", depends=[]
        )
        return cache.store(out.path, subdir)

    monkeypatch.setattr(seed, "make_python_package", fake_python)
    monkeypatch.setattr(seed, "check_interpreter", lambda target: None)
    monkeypatch.setattr(seed, "python_package_key", lambda target: "0000000")


def test_host_only_channel_is_indexed_and_solvable(monkeypatch, tmp_path):
    """seed() with no wheels and a stand-in python: activation packages, index, warm no-op."""
    stand_in_pythons(monkeypatch)
    chan, cache = tmp_path / "channel", tmp_path / "cache"
    report = seed.seed(chan, cache, with_cuda=True, progress=False, groups={})
    names = {p.name for p in report.packages}
    assert {"python", "python_abi", "gcc_linux-64", "gxx_linux-64", "sysroot_linux-64"} <= names
    assert report.indexed and all(p.stat().st_mode & 0o777 == 0o644 for p in chan.glob("*/*.conda"))
    repodata = {sub: json.loads((chan / sub / "repodata.json").read_text()) for sub in ("noarch", "linux-64")}
    indexed = {n for r in repodata.values() for n in r["packages.conda"]}
    assert indexed == {p.name for p in chan.glob("*/*.conda")}
    again = seed.seed(chan, cache, with_cuda=True, progress=False, groups={})
    assert not again.indexed and all(p.cached for p in again.packages)
    code = (
        "import asyncio, os, sys, rattler\n"
        "r = asyncio.run(rattler.solve(sources=[rattler.Channel(sys.argv[1])], specs=sys.argv[2:],"
        " platforms=['linux-64', 'noarch'], virtual_packages=[]))\n"
        "print(' '.join(sorted(f'{x.name.normalized}={x.version}' for x in r))); sys.stdout.flush(); os._exit(0)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(chan),
            "gxx_linux-64 12.*",
            "sysroot_linux-64 2.36.*",
            "python 3.11.*",
            "python_abi 3.11.* *_cp311",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gcc_linux-64=" in proc.stdout and "python_abi=3.11" in proc.stdout
    pythons = {p.version for p in report.packages if p.name == "python"}
    assert {v.rsplit(".", 1)[0] for v in pythons} >= {"3.11"}, pythons  # + 3.10/3.12/3.13 where pyenv has them


# --- end to end (slow): a CPU channel from PyPI + the host, torch from it ------------------


@pytest.fixture(scope="session")
def cpu_channel(tmp_path_factory):
    """FUSELET_OFFLINE_CHANNEL if it points at a seeded channel, else a CPU-only seed into a
    session tmp dir (~1 min cold on 2 cores; FUSELET_SEED_CACHE keeps its cache between runs)."""
    env = os.environ.get("FUSELET_OFFLINE_CHANNEL")
    if env and (Path(env) / "noarch" / "repodata.json").exists():
        return Path(env), None, None
    base = tmp_path_factory.mktemp("seed")
    cache = Path(os.environ.get("FUSELET_SEED_CACHE") or base / "cache")
    os.environ.setdefault("RATTLER_CACHE_DIR", str(base / "rattler"))
    t = time.monotonic()
    report = seed.seed(base / "channel", cache, with_cuda=False, progress=False)
    print(f"cold seed: {time.monotonic() - t:.1f} s; {report.summary()}")
    return base / "channel", cache, report


def solve_and_run(channel: Path, prefix: Path, specs: list[str], code: str) -> subprocess.CompletedProcess:
    """A fresh env from `channel` only (py-rattler, in a subprocess), then `code` in its python."""
    script = (
        "import asyncio, os, sys, rattler\n"
        "async def main():\n"
        "    r = await rattler.solve(sources=[rattler.Channel(sys.argv[1])], specs=sys.argv[3:],"
        " platforms=['linux-64', 'noarch'], virtual_packages=rattler.VirtualPackage.detect())\n"
        "    await rattler.install(r, target_prefix=sys.argv[2], show_progress=False)\n"
        "asyncio.run(main()); sys.stdout.flush(); os._exit(0)\n"
    )
    made = subprocess.run(
        [sys.executable, "-c", script, str(channel), str(prefix), *specs], capture_output=True, text=True, timeout=900
    )
    assert made.returncode == 0, f"solve/install of {specs} failed:\n{made.stdout}\n{made.stderr}"
    return subprocess.run([str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_seeded_channel_runs_torch_cpu(cpu_channel, tmp_path):
    channel, cache, report = cpu_channel
    if report is not None:
        builds = [p.build for p in report.find("pytorch")]
        assert any(b.startswith("cpu_mkl_py311_h") for b in builds), builds
    prefix = tmp_path / "env"
    run = solve_and_run(
        channel,
        prefix,
        ["python 3.11.*", "pytorch 2.13.* cpu*", "numpy", "pip"],
        "import torch, numpy; print(torch.__version__, float(torch.ones(3).numpy().sum()))",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["2.13.0+cpu", "3.0"]
    sp = prefix / "lib/python3.11/site-packages"
    assert (sp / "torch/share/cmake/Torch/TorchConfig.cmake").exists()
    pip = subprocess.run([str(prefix / "bin/pip"), "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(sp) in pip.stdout, pip.stderr
    if report is not None:  # nothing changed: the second seed is a no-op
        t = time.monotonic()
        again = seed.seed(channel, cache, with_cuda=False, progress=False)
        assert time.monotonic() - t < 30 and not again.indexed
        assert all(p.cached for p in again.packages)


def test_other_pythons_need_their_interpreter(tmp_path):
    """A group of OTHER_PYTHONS for a python the machine lacks is left out with a warning
    (nothing resolved, nothing downloaded)."""
    warnings: list[str] = []
    running = host.Interpreter.running()
    plans = seed._other_python_plans(
        Cache(tmp_path / "cache"), "3.99", ["jax-0.10"], [running], set(), [], False, report.ProgressUi(False), warnings
    )
    assert plans == [] and warnings == [
        "no python 3.99 interpreter beside the running one: the jax-0.10 packages are made for the running python only"
    ]


def test_other_pythons_are_resolved_for_that_python(monkeypatch, tmp_path):
    """pip resolves (and downloads) another python's wheels with --python-version, remembered apart."""
    from fuselet_build.seed import pip as seed_pip

    calls = []

    def fake_pip(args, what, tmp=None):
        calls.append(args)
        report_path = Path(args[args.index("--report") + 1])
        report_path.write_text(json.dumps({"install": []}))

    monkeypatch.setattr(seed_pip, "_pip", fake_pip)
    cache = Cache(tmp_path / "cache")
    assert seed_pip.resolve_group(cache, "jax-0.10", ["jaxlib==0.10.2"], python="3.12") == []
    assert calls[0][calls[0].index("--python-version") + 1] == "3.12"
    assert (cache.resolve / "jax-0.10-py312.json").exists() and not (cache.resolve / "jax-0.10.json").exists()
    seed_pip.resolve_group(cache, "jax-0.10", ["jaxlib==0.10.2"])
    assert "--python-version" not in calls[1]


def test_a_damaged_cached_package_is_made_again(monkeypatch, tmp_path):
    """The cache records each finished package's sha256: a truncated one is made again (and
    replaces its link in the channel), never served."""
    made: list[str] = []
    stand_in_pythons(monkeypatch, made)
    monkeypatch.setattr(seed, "find_interpreters", lambda running: [running])
    chan, cache_dir = tmp_path / "channel", tmp_path / "cache"
    seed.seed(chan, cache_dir, with_cuda=False, progress=False, groups={})
    cache = Cache(cache_dir)
    (pkg,) = [p for p in cache.pkgs.glob("*/python-3*.conda")]
    assert made and cache.damaged(pkg) == ""
    pkg.write_bytes(pkg.read_bytes()[:100])  # truncated on disk
    assert "truncated or overwritten" in cache.damaged(pkg)
    made.clear()
    again = seed.seed(chan, cache_dir, with_cuda=False, progress=False, groups={})
    assert len(made) == 1 and not next(p for p in again.packages if p.name == "python").cached
    assert cache.damaged(pkg) == "" and pkg.stat().st_size > 100
    assert (chan / pkg.parent.name / pkg.name).stat().st_size == pkg.stat().st_size  # the channel's too


def test_a_damaged_cached_wheel_is_downloaded_again(monkeypatch, tmp_path):
    from fuselet_build.seed import pip as seed_pip

    cache = Cache(tmp_path / "cache")
    good = make_wheel(tmp_path, "tiny", "1.0")
    digest = cache.sha256(good)
    cached = cache.wheels / good.name
    cached.write_bytes(good.read_bytes()[:50])  # an interrupted download
    downloads = []

    def fake_pip(args, what, tmp=None):
        downloads.append(args)
        shutil.copy(good, cache.wheels / good.name)

    monkeypatch.setattr(seed_pip, "_pip", fake_pip)
    w = ResolvedWheel("tiny", "1.0", f"https://example.invalid/{good.name}", digest)
    fetch_wheels(cache, [w], report.ProgressUi(False))
    assert len(downloads) == 1 and cache.sha256(cached) == digest


# --- the per-user cache, shared by every clone ---------------------------------------------


def test_the_cache_is_per_user_and_fuselet_cache_dir_moves_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("FUSELET_CACHE_DIR", raising=False)
    assert paths.user_cache() == tmp_path / "home" / ".cache" / "fuselet"
    assert paths.seed_cache() == tmp_path / "home" / ".cache" / "fuselet" / "seed"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored (XDG spec)
    assert paths.user_cache() == tmp_path / "home" / ".cache" / "fuselet"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.seed_cache() == tmp_path / "xdg" / "fuselet" / "seed"
    monkeypatch.setenv("FUSELET_CACHE_DIR", str(tmp_path / "mine"))  # the one switch wins
    assert paths.seed_cache() == tmp_path / "mine" / "seed"
    monkeypatch.setenv("FUSELET_CACHE_DIR", "")  # empty: unset
    assert paths.user_cache() == tmp_path / "xdg" / "fuselet"


def test_the_cli_seeds_into_the_user_cache_and_waits_for_it(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSELET_CACHE_DIR", str(tmp_path / "user-cache"))
    calls = []

    def fake_seed(channel, cache, **kwargs):
        calls.append((channel, cache, kwargs["wait"]))
        return report.SeedReport(channel=channel)

    monkeypatch.setattr(seed, "seed", fake_seed)
    monkeypatch.setattr(report.SeedReport, "print", lambda self: None)
    assert seed.main(["--channel-dir", str(tmp_path / "chan")]) == 0
    assert calls[-1] == (tmp_path / "chan", tmp_path / "user-cache" / "seed", True)
    assert seed.main(["--channel-dir", str(tmp_path / "chan"), "--cache", str(tmp_path / "c2"), "--no-wait"]) == 0
    assert calls[-1] == (tmp_path / "chan", tmp_path / "c2", False)


def test_a_second_clone_waits_for_the_cache_then_reuses_it(monkeypatch, tmp_path, capfd):
    """Two clones (two channels) on one cache: the second seed waits while the first holds the
    cache, then serves the first's packages after verifying them (hard links, nothing made);
    a package overwritten in the cache (same size, other bytes) is made again, not trusted."""
    import threading

    made: list[str] = []
    stand_in_pythons(monkeypatch, made)
    monkeypatch.setattr(seed, "find_interpreters", lambda running: [running])
    cache_dir, first, second = tmp_path / "cache", tmp_path / "clone1" / "channel", tmp_path / "clone2" / "channel"
    seed.seed(first, cache_dir, with_cuda=False, progress=False, groups={})
    assert len(made) == 1
    made.clear()
    out: dict = {}
    with Cache(cache_dir).lock():  # the first clone still seeding
        waiter = threading.Thread(
            target=lambda: out.setdefault(
                "report", seed.seed(second, cache_dir, with_cuda=False, progress=False, groups={}, wait=True)
            )
        )
        waiter.start()
        deadline = time.monotonic() + 10
        while "waiting for it to finish" not in capfd.readouterr().err and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiter.is_alive() and "report" not in out  # waiting, not failed
    waiter.join(60)
    again = out["report"]
    assert not made and again.packages and all(p.cached for p in again.packages)
    cache = Cache(cache_dir)
    (pkg,) = cache.pkgs.glob("*/python-3*.conda")
    placed = second / pkg.parent.name / pkg.name
    assert placed.stat().st_ino == pkg.stat().st_ino  # linked, not copied
    data = bytearray(pkg.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    pkg.unlink()
    pkg.write_bytes(bytes(data))
    assert "truncated or overwritten" in cache.damaged(pkg)
    third = seed.seed(second, cache_dir, with_cuda=False, progress=False, groups={}, wait=True)
    assert made and not next(p for p in third.packages if p.name == "python").cached
    assert cache.damaged(pkg) == ""
