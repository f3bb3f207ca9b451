"""What the benchmarks that run every case in child processes share: the child's command line,
its JSON answer, peak memory of the CPU process, and the median (min-max) a table prints.

A number from one process means little on machines whose fresh memory mappings cost up to 4x
from one process to the next: the benchmarks run each case in several children and report the
median over them with the spread.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import datetime
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

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


def plot_peak_and_time(results: dict, title: str, path) -> None:
    """Two bar panels, one bar per method: the median peak memory (MiB) and step time (s, the
    min-max spread as error bars) of results {method: {"peak_bytes": [...], "seconds": [...]}},
    fuselet's methods green, the peers gray; written to the PNG `path`."""
    plt = pyplot()
    if plt is None:
        print(f"matplotlib is not installed: no plot ({path} not written)")
        return
    names = list(results)[::-1]
    colors = ["tab:green" if n.startswith("fuselet") else "tab:gray" for n in names]
    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(10, 0.45 * len(names) + 1.6), sharey=True)
    peaks = [statistics.median(results[n]["peak_bytes"]) / 2**20 for n in names]
    bars = mem_ax.barh(names, peaks, color=colors)
    mem_ax.bar_label(bars, fmt="%.0f", padding=3)
    mem_ax.set_xlabel("peak memory, MiB")
    mem_ax.set_xlim(0, max(peaks) * 1.3)
    seconds = [results[n]["seconds"] for n in names]
    med = [statistics.median(s) for s in seconds]
    err = [[m - min(s) for m, s in zip(med, seconds)], [max(s) - m for m, s in zip(med, seconds)]]
    bars = time_ax.barh(names, med, xerr=err, color=colors, capsize=3)
    time_ax.bar_label(bars, fmt="%.2f", padding=6)
    time_ax.set_xlabel("step time, s (median, min-max)")
    time_ax.set_xlim(0, max(max(s) for s in seconds) * 1.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


# --- tables measured in several processes ---------------------------------------------------
# A micro-benchmark's table function, decorated with @recorded, prints as before; run with
# --processes N (> 1), the benchmark runs itself N times, each child once with --record FILE,
# and prints every table once more from the children's rows: each time the median over the
# processes, each ratio with its spread (min-max over the processes).

_record: list | None = None


def add_process_args(parser, default: int = 3) -> None:
    parser.add_argument(
        "--processes",
        type=int,
        default=default,
        help=f"child processes, each timing every case (default {default}): the tables give "
        "medians over them and the spread of each ratio; 1: this process alone",
    )
    parser.add_argument("--record", help=argparse.SUPPRESS)


def write_table(text: str, output: str | None, default: Path, script: str, note: str) -> None:
    """Print the table and write it to `output` (None: `default`; "none": print only) under a line
    with the command that made it (`script` and this process's arguments), the time and `note`
    (what the numbers are)."""
    print(text)
    if output == "none":
        return
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"# python benchmarks/{script} {' '.join(sys.argv[1:])}".rstrip()
    (Path(output) if output else default).write_text(f"{command}   ({when}; {note})\n{text}\n")


def recorded(table):
    """table(title, rows, *extra, runs=None): in a --record child, also keep its arguments."""

    @functools.wraps(table)
    def wrapper(title, rows, *extra, runs=None):
        if _record is not None:
            _record.append([title, rows, list(extra)])
        return table(title, rows, *extra, runs=runs)

    return wrapper


def in_processes(args, script: str, argv: list[str]) -> list[tuple] | None:
    """In a --record child: arrange for its tables to be saved at exit, and return None (run).
    With --processes 1: None (run here). Otherwise run `script argv` in --processes children and
    return their tables, [(title, median rows, extra, runs)], runs holding each child's rows."""
    global _record
    if args.processes < 1:
        raise SystemExit(f"--processes: expected an integer >= 1, got {args.processes}")
    if args.record:
        _record = []
        atexit.register(lambda: Path(args.record).write_text(json.dumps(_record)))
        return None
    if args.processes == 1:
        return None
    children = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            path = Path(tmp) / f"{i}.json"
            out = subprocess.run(
                [sys.executable, script, *argv, "--processes", "1", "--record", str(path)], capture_output=True, text=True
            )
            if out.returncode != 0 or not path.exists():
                raise RuntimeError(f"{script}: child {i} failed (rc {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
            children.append(json.loads(path.read_text()))
            print(f"process {i + 1} of {args.processes} done", flush=True)
    tables = []
    for t, first in enumerate(children[0]):
        runs = [_untuple(child[t][1]) for child in children]
        rows = [_median(list(group)) for group in zip(*runs)]
        title = first[0] + f"; medians over {args.processes} processes, ratios with their spread (min-max)"
        tables.append((title, rows, _untuple(first[2]), runs))
    return tables


def ratio(rows, runs, i: int, of) -> tuple[float, str]:
    """(value, spread) of the ratio of(row) of row i: over several processes' runs, the median of
    each process's ratio and ' (lo-hi)'; else of(rows[i]) and ''."""
    if not runs or len(runs) < 2:
        return of(rows[i]), ""
    values = [of(run[i]) for run in runs]
    return statistics.median(values), f" ({min(values):.2f}-{max(values):.2f})"


def _untuple(value):
    """JSON's lists back to the tuples the tables were given."""
    if isinstance(value, list):
        return tuple(_untuple(v) for v in value)
    if isinstance(value, dict):
        return {k: _untuple(v) for k, v in value.items()}
    return value


def _median(values: list):
    """The median of each float of equally shaped rows (tuples, dicts); other fields from the first."""
    first = values[0]
    if isinstance(first, float):
        return statistics.median(values)
    if isinstance(first, tuple):
        return tuple(_median([v[i] for v in values]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _median([v[k] for v in values]) for k in first}
    return first


@functools.cache
def liger(device: str):
    """Liger-Kernel's functional ops (liger_kernel.transformers.functional: Triton kernels, the
    GPU peer users compare with) where they can run: on a CUDA device with liger_kernel
    installed. Else None."""
    if device != "cuda":
        return None
    try:
        from liger_kernel.transformers import functional
    except ImportError as e:
        print(f"Liger-Kernel is not importable here ({e}): its column is left out")
        return None
    return functional
