"""`fuselet-build seed`'s report (the summary table) and its rich progress bars."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# --- report --------------------------------------------------------------------------------


@dataclass
class PackageResult:
    name: str
    version: str
    build: str
    subdir: str
    filename: str
    size: int
    seconds: float
    cached: bool
    source: str = ""  # the wheel, "host", or "interpreter"


@dataclass
class SeedReport:
    channel: Path
    packages: list[PackageResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    resolve_seconds: float = 0.0
    index_seconds: float = 0.0
    indexed: bool = False
    removed: list[str] = field(default_factory=list)

    @property
    def channel_bytes(self) -> int:
        return sum(p.size for p in self.packages)

    def find(self, name: str) -> list[PackageResult]:
        return [p for p in self.packages if p.name == name]

    def summary(self) -> str:
        new = sum(not p.cached for p in self.packages)
        return (
            f"seeded {self.channel}: {len(self.packages)} packages ({new} new), "
            f"{self.channel_bytes / 2**20:.0f} MiB, {self.seconds:.1f} s "
            f"(resolve {self.resolve_seconds:.1f} s, index "
            f"{f'{self.index_seconds:.1f} s' if self.indexed else 'unchanged'})"
        )

    def print(self, file=None) -> None:
        """The summary table (rich when available)."""
        rows = sorted(self.packages, key=lambda p: (p.name, p.version, p.build))
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            out = file or sys.stdout
            for p in rows:
                print(
                    f"{p.name:28} {p.version:14} {p.build:34} {p.size / 2**20:9.1f} MiB {p.seconds:6.1f} s"
                    f"{'  cached' if p.cached else ''}",
                    file=out,
                )
            print(self.summary(), file=out)
            for w in self.warnings:
                print(f"warning: {w}", file=out)
            return
        table = Table(title=f"offline channel {self.channel}", show_lines=False)
        for col, kw in (
            ("package", {}),
            ("version", {}),
            ("build", {}),
            ("size", {"justify": "right"}),
            ("seconds", {"justify": "right"}),
            ("cached?", {}),
        ):
            table.add_column(col, **kw)
        for p in rows:
            table.add_row(
                p.name, p.version, p.build, f"{p.size / 2**20:.1f} MiB", f"{p.seconds:.1f}", "cached" if p.cached else "new"
            )
        console = Console(file=file, stderr=file is None)
        if not console.is_terminal:
            console.width = 160
        console.print(table)
        console.print(self.summary())
        for w in self.warnings:
            console.print(f"[yellow]warning:[/] {w}")


# --- progress ------------------------------------------------------------------------------


class ProgressUi:
    """rich progress (an overall bar, plus one bar per package being made) or nothing."""

    def __init__(self, enabled: bool):
        self.progress = None
        self.overall = None
        if enabled:
            try:
                from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            except ImportError:
                return
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
            )
            self.progress.start()

    def log(self, msg: str) -> None:
        if self.progress is not None:
            self.progress.console.print(msg)

    def total(self, n: int) -> None:
        if self.progress is not None:
            if self.overall is None:
                self.overall = self.progress.add_task("[bold]offline channel", total=n, info=f"0/{n} packages")
            self.progress.update(self.overall, total=n)

    def done(self) -> None:
        if self.progress is not None and self.overall is not None:
            self.progress.advance(self.overall)
            task = self.progress.tasks[self.overall]
            self.progress.update(self.overall, info=f"{task.completed:.0f}/{task.total:.0f} packages")

    @contextmanager
    def package(self, label: str, total_bytes: int | None) -> Iterator[Callable[..., None]]:
        """A bar for one package; yields update(advance=bytes, stage=text)."""
        if self.progress is None:
            yield lambda advance=0, stage=None: None
            return
        total = f"/{total_bytes / 2**20:.0f} MiB" if total_bytes else ""
        task = self.progress.add_task(label, total=total_bytes, info="")
        done = 0

        def update(advance: int = 0, stage: str | None = None) -> None:
            nonlocal done
            done += advance
            kw = {"description": f"{label} [dim]{stage}[/]"} if stage else {}
            self.progress.update(task, advance=advance, info=f"{done / 2**20:.0f}{total}" if total else "", **kw)

        try:
            yield update
        finally:
            self.progress.remove_task(task)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
