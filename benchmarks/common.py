"""What the benchmarks that run every case in child processes share: the child's command line,
its JSON answer, peak memory of the CPU process, and the median (min-max) a table prints.

A number from one process means little on machines whose fresh memory mappings cost up to 4x
from one process to the next: the benchmarks run each case in several children and report the
median over them with the spread.
"""
from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def rss_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now, VmHWM: its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def isolate_allocations(threshold: int = 128 * 1024) -> None:
    """Tell glibc to map every allocation of `threshold` bytes or more on its own and to give
    back what it keeps free, so that freed memory leaves the resident set and the peak of what
    follows is its own (the process may have run with the default allocator until now)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, threshold)
    libc.malloc_trim(0)


def peak_rss(fn) -> int:
    """Bytes by which fn() lifts the peak resident set above what the process holds before it
    (VmHWM, reset through /proc/self/clear_refs)."""
    before = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    fn()
    return (rss_kib("VmHWM") - before) * 1024


def run_child(script: str, args: list[str], env: dict | None = None, timeout: float = 1800) -> dict:
    """Run `python script args...` and return the JSON object its last line of stdout prints."""
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: the child failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values, scale: float = 1.0, digits: int = 1) -> str:
    """'median (min-max)' of values times scale."""
    med, lo, hi = statistics.median(values) * scale, min(values) * scale, max(values) * scale
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
