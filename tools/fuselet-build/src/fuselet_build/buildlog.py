"""The one adapter between rattler-build's progress callbacks and fuselet-build: every event
goes to a log file, and the step names to an optional progress display."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


class BuildLog:
    """A `progress_callback` for rattler-build's `run_build`: writes each build step and log
    line to `path`; `on_step(step_name)` (optional) is told each new step. A log that cannot be
    written (a full disk) stops there and keeps the OSError in `error`: the build goes on, and
    its failure, if any, is reported with that error."""

    def __init__(self, path: Path, on_step: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.error: OSError | None = None
        self.file = None
        try:
            self.file = self.path.open("w")
        except OSError as exc:
            self.error = exc
        self.on_step = on_step

    def _write(self, text: str) -> None:
        if self.file is None:
            return
        try:
            self.file.write(text)
        except OSError as exc:
            self.error = exc
            self.close()

    def on_build_step(self, event) -> None:
        self._write(f"== {event.step_name}: {event.message}\n")
        if self.on_step is not None:
            self.on_step(event.step_name)

    def on_log(self, event) -> None:
        self._write(f"[{event.level}] {event.message}\n")

    def on_download_start(self, event) -> None:
        self._write(f"download {event.url}\n")

    def on_download_progress(self, event) -> None:
        pass

    def on_download_complete(self, event) -> None:
        pass

    def close(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            try:
                file.close()
            except OSError as exc:  # the buffered end of the log could not be written
                self.error = self.error or exc

    def __enter__(self) -> BuildLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
