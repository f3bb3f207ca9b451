"""The `fuselet-build` command line: matrix, seed, build, verify, index, env create."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fuselet_build import paths
from fuselet_build.errors import UserError


def _recipe(args) -> Path:
    return paths.given(args.recipe, paths.RECIPE)


def _output(args) -> Path:
    return paths.given(args.output, paths.OUTPUT)


def _variants(args) -> list[Path]:
    return [paths.given(v, "") for v in args.variants] if args.variants else [paths.given(None, paths.OFFLINE_VARIANTS)]


def _channels(args) -> list[str]:
    if args.channel == "offline":
        chan = paths.given(args.offline_channel, paths.OFFLINE_CHANNEL)
        if not (chan / "noarch" / "repodata.json").exists():
            raise UserError(
                f"the offline channel {chan} is not seeded yet: run `fuselet-build seed` "
                f"(or pass --channel conda-forge to build against conda-forge)"
            )
        return [str(chan)]
    return [args.channel]


def cmd_matrix(args) -> int:
    from fuselet_build import matrix

    jobs = matrix.jobs(_recipe(args), _variants(args), args.target_platform)
    if args.json:
        print(matrix.to_json(jobs))
    else:
        matrix.print_table(jobs, f"{args.recipe or paths.RECIPE} x {', '.join(args.variants or [paths.OFFLINE_VARIANTS])}")
    return 0


def cmd_build(args) -> int:
    from fuselet_build import build

    results = build.build(
        _recipe(args),
        _variants(args),
        _output(args),
        _channels(args),
        select=args.select,
        skip_existing=not args.force,
        test=not args.no_test,
        show_progress=sys.stderr.isatty() or args.progress,
    )
    build.print_summary(results)
    failed = [r for r in results if r.status == "failed"]
    if failed:
        print(
            f"fuselet-build: {len(failed)} of {len(results)} packages failed; logs in {_output(args) / 'logs'}", file=sys.stderr
        )
    return 1 if failed else 0


def cmd_verify(args) -> int:
    from fuselet_build import verify

    checks = verify.verify(
        _recipe(args), _variants(args), _output(args), _channels(args), install=not args.no_install, select=args.select
    )
    verify.print_checks(checks)
    return 0 if all(c.ok for c in checks) else 1


def cmd_index(args) -> int:
    from fuselet_build import channel

    target = Path(args.channel_dir)
    if not target.is_dir():
        raise UserError(f"channel_dir: no such folder: {target}")
    channel.index(target)
    print(f"indexed {target}")
    return 0


def cmd_env_create(args) -> int:
    from fuselet_build import envcreate

    return envcreate.main(args, [paths.given(None, paths.OUTPUT), paths.given(None, paths.OFFLINE_CHANNEL)])


def cmd_seed(args) -> int:
    from fuselet_build import seed

    return seed.run(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fuselet-build", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp, output=True):
        sp.add_argument("--recipe", help=f"recipe (default: {paths.RECIPE} of the source tree)")
        sp.add_argument(
            "--variants",
            "-m",
            action="append",
            help=f"variant file, repeatable (default: {paths.OFFLINE_VARIANTS} of the source tree)",
        )
        sp.add_argument("--target-platform", default="linux-64")
        if output:
            sp.add_argument("--output", help=f"output channel (default: {paths.OUTPUT} of the source tree)")
            sp.add_argument(
                "--channel",
                default="offline",
                help="'offline' (the seeded local channel, default) or a channel such as conda-forge",
            )
            sp.add_argument(
                "--offline-channel", help=f"the seeded local channel (default: {paths.OFFLINE_CHANNEL} of the source tree)"
            )
            sp.add_argument("--select", action="append", help="only packages whose id contains this text (repeatable)")

    sp = sub.add_parser("matrix", help="the packages each output will produce (rattler-build render)")
    common(sp, output=False)
    sp.add_argument("--json", action="store_true", help="one JSON entry per build job (for a CI fan-out)")
    sp.set_defaults(func=cmd_matrix)

    sp = sub.add_parser("build", help="build the variants into the output channel")
    common(sp)
    sp.add_argument("--force", action="store_true", help="rebuild packages that already exist")
    sp.add_argument("--no-test", action="store_true", help="skip the recipe's tests")
    sp.add_argument("--progress", action="store_true", help="show live progress even without a terminal")
    sp.set_defaults(func=cmd_build)

    sp = sub.add_parser(
        "verify",
        help="check pins, provenance, linkage, file modes, dist-info and Python-free framework packages, install and run them",
    )
    common(sp)
    sp.add_argument(
        "--no-install",
        action="store_true",
        help="only what needs no install: pins, provenance, file modes, dist-info, no Python in the framework packages",
    )
    sp.set_defaults(func=cmd_verify)

    sp = sub.add_parser("index", help="(re)write the repodata of a local channel folder (py-rattler)")
    sp.add_argument("channel_dir", help="a folder with noarch/ and linux-64/ subfolders of packages")
    sp.set_defaults(func=cmd_index)

    sp = sub.add_parser("env", help="conda environments from the built packages, without conda")
    env_sub = sp.add_subparsers(dest="env_command", required=True)
    sp = env_sub.add_parser(
        "create",
        help="solve SPECs from the channels and install them into PREFIX (py-rattler)",
        description="Make a conda environment at PREFIX from the built channel: "
        'fuselet-build env create ./env fuselet-jax "python 3.11.*"',
    )
    sp.add_argument("prefix", metavar="PREFIX", help="a new or empty folder, or an existing conda environment")
    sp.add_argument("specs", metavar="SPEC", nargs="+", help='conda match specs: fuselet-jax, "python 3.11.*", ...')
    sp.add_argument(
        "--channel",
        "-c",
        action="append",
        help=f"a channel folder or URL, repeatable (default: {paths.OUTPUT} and {paths.OFFLINE_CHANNEL} of the source tree)",
    )
    sp.add_argument(
        "--cuda", metavar="VERSION", help="declare a CUDA driver of VERSION where none is detected (to install CUDA builds)"
    )
    sp.add_argument("--progress", action="store_true", help="show download/link progress even without a terminal")
    sp.set_defaults(func=cmd_env_create)

    from fuselet_build import seed

    sp = sub.add_parser("seed", help="make the offline conda channel from PyPI wheels and the host toolchain")
    seed.add_arguments(sp)
    sp.set_defaults(func=cmd_seed)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    paths.rattler_cache()
    if args.command == "env" and argv is None:
        # py-rattler 0.28 can crash at interpreter exit after a solve (a GIL release in its
        # threads): the command's exit status must be its own, so end here, output flushed.
        rc = run(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return run(args)


def run(args) -> int:
    try:
        return args.func(args)
    except UserError as exc:
        print(f"fuselet-build {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(
            f"fuselet-build {args.command}: error: {exc}. fuselet-build's own dependencies are missing; "
            f"reinstall it: pip install ./tools/fuselet-build",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(
            f"fuselet-build {args.command}: interrupted; finished packages are kept and the channel index is valid",
            file=sys.stderr,
        )
        return 130
