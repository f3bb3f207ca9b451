"""One writer per folder: an advisory lock (flock) on <folder>/.fuselet-build.lock.

The kernel drops a flock when its process dies, so a lock left by a killed run is never
stale: the next run takes it. The holder writes its pid, command and start time into the
file, and a run that finds the folder busy names them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".fuselet-build.lock"


def holder(folder: Path) -> str:
    """Who holds the lock of `folder`, as the holder wrote it ("" when unknown)."""
    try:
        info = json.loads((Path(folder) / LOCK_NAME).read_text())
        started = time.strftime("%H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} (`{info['command']}`, since {started})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


@contextmanager
def folder_lock(folder: Path, what: str, error: type[Exception], wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock of `folder` for `what` ("fuselet-build build"); raise `error` at once,
    naming the holder, when another run holds it; with `wait`, say so through it (the holder
    named) and wait for the lock instead."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            who = holder(folder) or "another process"
            if wait is None:
                raise error(
                    f"{folder} is in use by {who}: one {what} at a time per folder; wait for it to "
                    f"finish (or stop it), or choose another folder"
                ) from None
            wait(f"{folder} is in use by {who}: waiting for it to finish ({what})")
            fcntl.flock(f, fcntl.LOCK_EX)  # the kernel drops it when the holder exits, killed or not
        f.seek(0)
        f.truncate()
        f.write(
            json.dumps({"pid": os.getpid(), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "started": time.time()})
        )
        f.flush()
        yield
