"""Named points where the tests kill fuselet-build, to prove a run killed there leaves its
channel consistent: FUSELET_BUILD_KILL_AT=<name> makes the process SIGKILL itself at that
point (no clean-up code runs, as with a power cut or the OOM killer). Unset, nothing happens.

  publish  the package is recorded in the manifest, not yet moved into the channel
  index    the new index is written, its shards moved in, repodata.json not yet replaced
"""

from __future__ import annotations

import os
import signal

ENV = "FUSELET_BUILD_KILL_AT"


def failpoint(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
