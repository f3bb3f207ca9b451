"""`fuselet-build env create PREFIX SPEC...`: a conda environment from the built channel without
conda, mamba or pixi (py-rattler solves and installs, as `verify` and the tests do)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from fuselet_build import channel
from fuselet_build.errors import UserError


def check_specs(specs: list[str]) -> list[str]:
    """The specs as the solver reads them; a spec that does not parse is an error naming it."""
    import rattler

    for spec in specs:
        try:
            rattler.MatchSpec(spec)
        except Exception as exc:
            raise UserError(
                f"SPEC {spec!r} is not a valid conda match spec: {str(exc).splitlines()[0]} "
                f'(examples: fuselet-jax, "python 3.11.*", python=3.11, "libfuselet * cpu*")'
            ) from None
    return specs


def check_channels(given: list[str] | None, defaults: list[Path]) -> list[str]:
    """The channels to solve from: `given` (--channel, folders or URLs/names) or `defaults`
    (the project's output/ and offline channel). A local folder must be an indexed channel."""
    if given:
        chans = []
        for c in given:
            local = Path(c).expanduser()
            if "://" in c or (not local.exists() and "/" not in c and not c.startswith(".")):
                chans.append(c)  # a URL or a channel name such as conda-forge
                continue
            if not local.is_dir():
                raise UserError(f"--channel {c}: no such folder ({local.absolute()})")
            if not (local / "noarch" / "repodata.json").exists():
                raise UserError(
                    f"--channel {c}: {local.absolute()} is not a conda channel (no noarch/repodata.json); "
                    f"index it with `fuselet-build index {c}`"
                )
            chans.append(str(local.absolute()))
        return chans
    for d in defaults:
        if not (d / "noarch" / "repodata.json").exists():
            raise UserError(
                f"--channel (default): the channel {d} is missing or not indexed; build the packages "
                f"first (`make packages`), or name channels with --channel DIR"
            )
    return [str(d) for d in defaults]


def check_prefix(prefix: Path) -> bool:
    """Whether `prefix` is an existing conda environment (installed into, keeping its
    packages). A new or empty folder is fine; anything else is refused: never overwrite files."""
    if not prefix.exists() and not prefix.is_symlink():
        return False
    if not prefix.is_dir():
        raise UserError(f"PREFIX {prefix} exists and is not a folder; choose another path")
    if (prefix / "conda-meta").is_dir():
        return True
    if any(prefix.iterdir()):
        raise UserError(
            f"PREFIX {prefix} is a folder with files in it and not a conda environment (no "
            f"conda-meta/); refusing to install over them: choose a new or empty folder"
        )
    return False


def usage(prefix: Path, names: set[str]) -> list[str]:
    """How to use the environment, by what it holds."""
    lines = []
    if "python" in names:
        code = "import fuselet; fuselet.info()" if "fuselet" in names else "import sys; print(sys.version)"
        lines.append(f'{prefix}/bin/python -c "{code}"')
        if "fuselet-jax" in names and "fuselet" in names:
            lines.append(
                f'{prefix}/bin/python -c "import jax.numpy as jnp, fuselet.jax as fj; '
                f'print(fj.rms_norm(jnp.ones((2, 8)), jnp.ones(8)))"'
            )
        if "fuselet-torch" in names and "fuselet" in names:
            lines.append(
                f'{prefix}/bin/python -c "import torch, fuselet.torch as ft; print(ft.rms_norm(torch.ones(2, 8), torch.ones(8)))"'
            )
    if "libfuselet" in names:
        lines.append(f"cmake -DCMAKE_PREFIX_PATH={prefix} ...   # find_package(fuselet) for C++")
    lines.append(f"export PATH={prefix}/bin:$PATH   # or put the environment first on PATH")
    return lines


def plan(records: list, prefix: Path) -> str:
    """What the install will do, in a few words."""
    have = {(r.name.normalized, str(r.version), r.build) for r in channel.installed(prefix)}
    new = [r for r in records if (r.name.normalized, str(r.version), r.build) not in have]
    size = f"{sum(r.size or 0 for r in new) / 1e6:.0f} MB"
    if not have:
        return f"{len(records)} packages ({size}) into {prefix}"
    return f"{len(new)} new or changed packages ({size}) of {len(records)} into {prefix}"


def create(
    prefix: Path,
    specs: list[str],
    channels: list[str] | None,
    defaults: list[Path],
    *,
    cuda: str | None = None,
    show_progress: bool = False,
) -> int:
    from rattler.exceptions import GatewayError
    from rich.console import Console

    out, err = Console(highlight=False, soft_wrap=True), Console(stderr=True, highlight=False, soft_wrap=True)
    prefix = prefix.absolute()
    check_specs(specs)
    chans = check_channels(channels, defaults)
    existing = check_prefix(prefix)
    made = not prefix.exists()
    err.print(
        f"==> solving {' '.join(specs)} from {', '.join(chans)}"
        + (f" (into the existing environment {prefix})" if existing else ""),
        markup=False,
    )
    start = time.monotonic()
    try:
        records = channel.install(
            prefix,
            specs,
            chans,
            cuda=cuda,
            show_progress=show_progress,
            on_solved=lambda recs: err.print(f"==> installing {plan(recs, prefix)}", markup=False),
        )
    except channel.Unsolvable as exc:
        raise UserError(f"SPEC {' '.join(map(repr, specs))}: cannot be installed from {', '.join(chans)}: {exc}") from None
    except UserError:
        raise
    except GatewayError as exc:  # nothing is installed before the solve
        if made:
            shutil.rmtree(prefix, ignore_errors=True)
        raise UserError(f"--channel: cannot read the channels {', '.join(chans)}: {str(exc).strip()[:1500]}") from None
    except Exception as exc:
        if made:
            shutil.rmtree(prefix, ignore_errors=True)  # a half-made environment is of no use
        raise UserError(f"installing into PREFIX {prefix} failed: {str(exc).strip()[:1500]}") from None
    names = {r.name.normalized for r in records}
    out.print(
        f"created {prefix} in {time.monotonic() - start:.0f} s: "
        + ", ".join(
            sorted(
                f"{r.name.normalized} {r.version}"
                for r in records
                if r.name.normalized in ("fuselet", "fuselet-jax", "fuselet-torch", "libfuselet", "python", "jaxlib", "pytorch")
            )
        ),
        markup=False,
    )
    out.print("use it:", markup=False)
    for line in usage(prefix, names):
        out.print(f"  {line}", markup=False)
    return 0


def main(args, defaults: list[Path]) -> int:
    show = sys.stderr.isatty() or args.progress
    return create(Path(args.prefix), list(args.specs), args.channel, defaults, cuda=args.cuda, show_progress=show)
