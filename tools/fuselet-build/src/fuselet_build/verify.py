"""`fuselet-build verify`: every built package carries the pins and the provenance of its
variant and what conda-forge's CI checks (fuselet_build.contents: linkage, readable files,
dist-info), installs into a fresh prefix from the channels, and runs one op there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fuselet_build import build as build_mod
from fuselet_build import channel, contents, matrix

SMOKE = {
    "fuselet-torch": (
        "import torch, fuselet.torch as ft; x = torch.randn(4, 64); w = torch.rand(64); "
        "ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w; "
        "assert torch.allclose(ft.rms_norm(x, w), ref, atol=1e-5), 'rms_norm mismatch'; "
        "print('fuselet-torch', torch.__version__, 'ok')"
    ),
    "fuselet-jax": (
        "import jax.numpy as jnp, numpy as np, fuselet.jax as fj, jaxlib; "
        "x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 64)), jnp.float32); "
        "w = jnp.ones(64); ref = x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6); "
        "assert float(jnp.abs(fj.rms_norm(x, w) - ref).max()) < 1e-5, 'rms_norm mismatch'; "
        "print('fuselet-jax on jaxlib', jaxlib.__version__, 'ok')"
    ),
    "fuselet": "import fuselet; fuselet.info()",
    "libfuselet": None,
}


PYTHON_PARTS = ("fuselet",)  # packages with a dist-info
FRAMEWORK_LAYERS = {"fuselet-torch": "torch", "fuselet-jax": "jax"}  # packages that hold no Python


@dataclass
class Check:
    job: matrix.Job
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def expected_pins(job: matrix.Job) -> list[str]:
    """Regexes every dependency list of `job` must match (one dependency each)."""
    v = job.variant
    cuda = str(v.get("cuda_compiler_version", "None"))
    flavor = "cpu" if cuda == "None" else "cuda" + cuda.replace(".", "")
    pins = []
    if job.name in ("fuselet-torch", "fuselet-jax"):
        pins.append(rf"^libfuselet ==?{re.escape(job.version)} " + re.escape(str(v.get("libfuselet", "")).split(" ")[-1]) + "$")
    if job.name == "fuselet-torch" and v.get("torch_abi") == "stable":
        pins.append(r"^pytorch >=\d+\.\d+$")  # every torch from the stable ABI's target on
        pins.append(rf"^pytorch \* {flavor}\*$")
    elif job.name == "fuselet-torch":
        major, minor = str(v["pytorch"]).split(".")[:2]
        pins.append(rf"^pytorch >={major}\.{minor}\.\d+,<{major}\.{int(minor) + 1}\.0a0$")
        pins.append(rf"^pytorch \* {flavor}\*$")
    if job.name == "fuselet-jax":
        pins.append(rf"^jaxlib >={re.escape(str(v['jaxlib']))},<{re.escape(str(v['jaxlib_below']))}$")
        pins.append(rf"^jaxlib \* {'cpu' if cuda == 'None' else 'cuda'}\*$")
    if cuda != "None" and job.name != "fuselet":
        pins += [r"^cuda-version >=" + re.escape(cuda) + r",<\d+$", r"^__cuda$"]
    return pins


def pin_problems(job: matrix.Job, depends: list[str]) -> list[str]:
    """The expected pins of `job` that no dependency in `depends` matches."""
    return [
        f"missing pin /{pin}/ in depends {depends}" for pin in expected_pins(job) if not any(re.match(pin, d) for d in depends)
    ]


def extract(pkg_path: Path, job: matrix.Job, workdir: Path) -> Path:
    import rattler.package_streaming as ps

    dest = workdir / job.key
    ps.extract(pkg_path, dest)
    return dest


def provenance(dest: Path, job: matrix.Job) -> tuple[dict | None, list[str]]:
    """The _build_info.json inside a framework package (extracted at `dest`), and how it
    disagrees with the variant."""
    layer = FRAMEWORK_LAYERS.get(job.name)
    if layer is None:
        return None, []
    path = dest / "lib" / "fuselet" / layer / "_build_info.json"
    if not path.is_file():
        return None, [f"no lib/fuselet/{layer}/_build_info.json in the package"]
    info = json.loads(path.read_text())
    v, problems = job.variant, []
    cuda = str(v.get("cuda_compiler_version", "None"))
    if layer == "torch":
        if not info["version"].startswith(str(v["pytorch"]) + "."):
            problems.append(f"built against torch {info['version']}, variant says pytorch {v['pytorch']}")
        if (info["cuda"] is None) != (cuda == "None"):
            problems.append(f"built against torch CUDA {info['cuda']}, variant says cuda {cuda}")
        if info.get("abi", "exact") != v.get("torch_abi", "exact"):
            problems.append(f"a {info.get('abi', 'exact')}-ABI torch layer, variant says {v.get('torch_abi', 'exact')}")
    else:
        if info["jaxlib_version"] != str(v["jaxlib"]):
            problems.append(f"built against jaxlib {info['jaxlib_version']}, variant says {v['jaxlib']}")
        if ".".join(map(str, info["ffi_api"])) != str(v["jaxlib_ffi"]):
            problems.append(f"XLA FFI API {info['ffi_api']}, variant says {v['jaxlib_ffi']}")
    if bool(info.get("cuda_kernels")) != (cuda != "None"):
        problems.append(f"cuda_kernels={info.get('cuda_kernels')} for a {cuda} variant")
    return info, problems


def python_free_problems(dest: Path, depends: list[str], job: matrix.Job) -> list[str]:
    """A framework package serves every Python: no python / python_abi dependency, no file
    under a pythonX.Y folder, and no ELF file linking libpython."""
    if job.name not in FRAMEWORK_LAYERS:
        return []
    problems = [
        f"depends on {d}: the package would be tied to one Python" for d in depends if d.split(" ")[0] in ("python", "python_abi")
    ]
    problems += [f"{p.relative_to(dest)} is under a Python folder" for p in dest.glob("lib/python*/**/*") if p.is_file()]
    for path in sorted(p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()):
        problems += [
            f"{path.relative_to(dest)} links {n}"
            for n in contents.elf_needed(path) or []
            if n.startswith(("libpython", "libtorch_python"))
        ]
    return problems


def install_env(job: matrix.Job, channels: list[str], workdir: Path) -> tuple[Path | None, list[str]]:
    """The package and its run dependencies in a fresh prefix: (prefix, []) or (None, [why not])."""
    prefix = workdir / f"env-{job.key}"
    spec = f"{job.name} =={job.version} {job.build_string}"
    cuda = str(job.variant.get("cuda_compiler_version", "None"))
    specs = [spec] + (["python 3.11.*"] if job.name != "libfuselet" else [])
    try:
        channel.install(prefix, specs, channels, cuda=None if cuda == "None" else cuda)
    except Exception as exc:
        return None, [f"cannot install {spec}: {str(exc).strip()[:500]}"]
    return prefix, []


def smoke(job: matrix.Job, prefix: Path, workdir: Path) -> list[str]:
    """Run the package's smoke test with the python of `prefix`; [] when it passed."""
    code = SMOKE.get(job.name)
    if code is None:
        return []
    proc = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=600, cwd=workdir, env=clean_env()
    )
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return [f"smoke test failed in {prefix}: {last}"]
    return []


def clean_env() -> dict:
    """The caller's environment without what would make a prefix's python import other code."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


def verify(
    recipe: Path,
    variant_files: list[Path],
    output: Path,
    channels: list[str],
    *,
    install: bool = True,
    select: list[str] | None = None,
) -> list[Check]:
    from rattler_build import Package

    checks = []
    source = build_mod.source_hash(recipe.resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="fuselet-verify-") as tmp:
        work = Path(tmp)
        for job in matrix.select(matrix.jobs(recipe, variant_files), select):
            check = Check(job)
            checks.append(check)
            path = build_mod.existing_package(output, job)
            if path is None:
                check.problems.append(f"not built: no {job.key}.conda in {output / job.subdir}")
                continue
            try:
                depends = Package.from_file(str(path)).depends
                dest = extract(path, job, work)
            except Exception as exc:  # a damaged file is this package's failure, never the run's
                check.problems.append(
                    f"cannot read {path}: {str(exc).strip()[:200]}. The file is damaged (an "
                    f"interrupted copy or build?): delete it and run `fuselet-build build` again"
                )
                continue
            why = build_mod.package_state(output, job, source)[1]
            if why:
                check.problems.append(f"{path.name}: {why}; run `fuselet-build build` to make it again")
            check.problems += pin_problems(job, depends)
            check.problems += provenance(dest, job)[1]
            check.problems += python_free_problems(dest, depends, job)
            check.problems += contents.readable_problems(path)
            if job.name in PYTHON_PARTS:
                check.problems += contents.dist_info_problems(dest, job.name, job.version)
            if install and check.ok:
                prefix, problems = install_env(job, [str(output)] + channels, work)
                check.problems += problems
                if prefix is not None:
                    check.problems += contents.linkage_problems(dest, prefix)
                if check.ok:
                    check.problems += smoke(job, prefix, work)
                if check.ok:
                    check.notes.append("installed, linkage ok" + (" + op ran" if SMOKE.get(job.name) else ""))
            elif check.ok:
                check.notes.append("pins ok (not installed: linkage and op unchecked)")
    return checks


def print_checks(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fuselet-build verify")
    for col in ("package", "build string", "result", "details"):
        table.add_column(col)
    for c in checks:
        table.add_row(
            c.job.name, c.job.build_string, "[green]ok" if c.ok else "[red]FAILED", "; ".join(c.problems or c.notes)[:400]
        )
    Console(width=200).print(table)
