"""Conda channel helpers over py-rattler: index, solve (and explain), install."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from fuselet_build.errors import UserError


def index(channel_dir: Path) -> None:
    """(Re)write the channel's repodata with py-rattler.

    Runs in a subprocess: py-rattler 0.28 can abort at interpreter exit after indexing, and a
    crash there must not take the caller down (nor leave a half-written index: rattler writes
    repodata.json atomically).
    """
    channel_dir = Path(channel_dir)
    for subdir in ("noarch", "linux-64"):
        (channel_dir / subdir).mkdir(parents=True, exist_ok=True)
    code = ("import asyncio, inspect, os, sys, rattler.index as i\n"
            "r = i.index_fs(sys.argv[1])\n"
            "if inspect.isawaitable(r): asyncio.run(r)\n"
            "sys.stdout.flush(); os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(channel_dir)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"indexing {channel_dir} failed: {proc.stderr.strip()[-2000:]}")


def channel_urls(channels: list[str]) -> list[str]:
    out = []
    for c in channels:
        p = Path(c)
        out.append(p.resolve().as_uri() if p.exists() else c)
    return out


def solve(specs: list[str], channels: list[str], virtual_packages: list | None = None):
    """rattler.solve for linux-64 (+noarch); raises the solver's own explanation."""
    import rattler

    async def run():
        return await rattler.solve(sources=channel_urls(channels), specs=specs,
                                   platforms=["linux-64", "noarch"],
                                   virtual_packages=virtual_packages or [])

    return asyncio.run(run())


def why_unsolvable(rendered, channels: list[str]) -> str:
    """Ask rattler's solver why the build/host environment of a rendered variant fails."""
    req = rendered.recipe.requirements
    for env_name, specs in (("host", req.host), ("build", req.build)):
        # Pins to the recipe's own outputs render as {'pin_subpackage': ...}: not channel specs.
        specs = [str(s) for s in specs if not str(s).startswith(("__", "{"))]
        if not specs:
            continue
        try:
            solve(specs, channels)
        except Exception as exc:  # the solver's message names the missing package
            return f"the {env_name} environment cannot be solved: {str(exc).strip()}"
    return ""


def has_cuda_driver() -> bool:
    """Whether this machine reports a `__cuda` virtual package (an NVIDIA driver)."""
    import rattler

    return any("cuda" in str(v).lower() for v in rattler.VirtualPackage.detect())


def virtual_packages(cuda: str | None = None) -> list:
    """This machine's virtual packages; with `cuda`, a `__cuda` of that version is declared
    where no driver reports one, so CUDA packages install (their CPU paths still run)."""
    import rattler

    detected = list(rattler.VirtualPackage.detect())
    if cuda and not has_cuda_driver():
        detected.append(rattler.GenericVirtualPackage(rattler.PackageName("__cuda"), rattler.Version(cuda),
                                                      rattler.BuildString("0")))
    return detected


def install(prefix: Path, specs: list[str], channels: list[str], *, cuda: str | None = None) -> None:
    """A fresh environment at `prefix` from `channels` (py-rattler solve + install)."""
    import rattler

    records = solve(specs, channels, virtual_packages=virtual_packages(cuda))
    asyncio.run(rattler.install(records, target_prefix=str(prefix), show_progress=False))
