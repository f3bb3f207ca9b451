"""Benchmark fuselet's RMSNorm / LayerNorm against the frameworks' own ops, same run.

Prints one table per device: median time per call (forward, and forward + backward) of
fuselet (through its torch and its jax layer) and of the peers: torch eager
(torch.nn.functional.rms_norm / layer_norm), torch.compile of the same, and jax.jit of the
jax.numpy expression; the ratio best peer / fuselet (> 1: fuselet is faster than every peer);
and fuselet's bandwidth as a fraction of the device's: the bytes the op reads and writes
(forward: x and y; forward + backward: x, y, dy, x and dx) per second, over the same for
x.clone() (x read, a new tensor written), timed in the same run on the same x (before and
after the case; the faster of the two). It also draws
the table (bandwidth fraction against the hidden size, per op, dtype and pass, the clone as
the device's line) to a PNG when matplotlib is installed. Medians of --repeats timed batches;
the machines this runs on are noisy, so read the ratios, not the times.

    python benchmarks/bench_norm.py [--framework torch|jax|all] [--device cpu|cuda] [--quick]
                                    [--plot PATH|none]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import common

SHAPES_CPU = [(4096, 512), (4096, 1024), (4096, 2048), (4096, 4096), (2048, 8192)]
SHAPES_GPU = [(8192, 1024), (16384, 4096), (4096, 8192), (65536, 2048)]
OPS = ("rms_norm", "layer_norm")
PASSES = ("fwd", "fwd+bwd")
# Tensors of the shape of x each pass reads or writes (clone: 2).
TRAFFIC = {"fwd": 2, "fwd+bwd": 5}
OURS = ("fuselet.torch", "fuselet.jax")
PEERS = ("torch eager", "torch.compile", "liger", "jax.jit")
RESULTS = Path(__file__).resolve().parent / "results"


def median_seconds(fn, sync, repeats: int, min_time: float = 0.02) -> float:
    fn()
    sync()
    # Calibrate the number of calls per batch so that a batch takes >= min_time.
    n, t = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        t = time.perf_counter() - start
        if t >= min_time or n >= 1 << 14:
            break
        n *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def bench_torch(device: str, op: str, shape, dtype_name: str, repeats: int) -> dict:
    """{name: {pass: seconds}} for fuselet.torch, torch eager, torch.compile and (on GPUs where it is
    installed) Liger-Kernel, and the clone."""
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = getattr(torch, dtype_name)
    h = shape[-1]
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(h, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(h, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, device=device, dtype=dtype)
    if op == "rms_norm":
        ours, eager = (lambda: ft.rms_norm(x, w, 1e-6)), (lambda: F.rms_norm(x, (h,), w, 1e-6))
    else:
        ours, eager = (lambda: ft.layer_norm(x, w, b, 1e-5)), (lambda: F.layer_norm(x, (h,), w, b, 1e-5))
    torch._dynamo.reset()
    compiled = torch.compile(eager, dynamic=False)
    out = {}

    def clone() -> float:
        with torch.no_grad():
            return median_seconds(lambda: x.clone(), sync, repeats)

    before = clone()
    fns = [("fuselet.torch", ours), ("torch eager", eager), ("torch.compile", compiled)]
    lg = common.liger(device)
    if lg is not None:  # in_place=False: its backward would overwrite dy, which every call reuses
        fns.append(
            (
                "liger",
                (lambda: lg.liger_rms_norm(x, w, 1e-6, in_place=False))
                if op == "rms_norm"
                else (lambda: lg.liger_layer_norm(x, w, b, 1e-5)),
            )
        )
    for name, f in fns:
        with torch.no_grad():
            fwd = median_seconds(f, sync, repeats)
        fwd_bwd = median_seconds(lambda f=f: torch.autograd.grad(f(), (x, w), dy), sync, repeats)
        out[name] = {"fwd": fwd, "fwd+bwd": fwd_bwd}
    out["clone"] = {"fwd": min(before, clone())}  # the faster of two: the stricter yardstick
    return out


def bench_jax(device: str, op: str, shape, dtype_name: str, repeats: int) -> dict:
    """{name: {pass: seconds}} for fuselet.jax and jax.jit of jax.numpy, and the clone."""
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]

    def ref_rms(x, w, b):
        xf = x.astype(jnp.float32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * w

    def ref_layer(x, w, b):
        xf = x.astype(jnp.float32)
        mean, var = xf.mean(-1, keepdims=True), xf.var(-1, keepdims=True)
        return ((xf - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * w + b

    h = shape[-1]
    key = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.device_put(jax.random.normal(key[0], shape, dtype_name), dev)
    w = jax.device_put(jax.random.normal(key[1], (h,), dtype_name), dev)
    b = jax.device_put(jax.random.normal(key[2], (h,), dtype_name), dev)
    dy = jax.device_put(jax.random.normal(key[3], shape, dtype_name), dev)
    if op == "rms_norm":
        ours, peer = (lambda x, w, b: fj.rms_norm(x, w, 1e-6)), ref_rms
    else:
        ours, peer = (lambda x, w, b: fj.layer_norm(x, w, b, 1e-5)), ref_layer
    copy = jax.jit(jnp.copy)
    out = {"clone": {"fwd": median_seconds(lambda: copy(x).block_until_ready(), lambda: None, repeats)}}  # if no torch
    for name, f in (("fuselet.jax", ours), ("jax.jit", peer)):
        fwd = jax.jit(f)

        def vjp(x, w, b, f=f):
            y, pull = jax.vjp(lambda x, w: f(x, w, b), x, w)
            return pull(dy)

        fwd_bwd = jax.jit(vjp)
        out[name] = {
            "fwd": median_seconds(lambda f=fwd: f(x, w, b).block_until_ready(), lambda: None, repeats),
            "fwd+bwd": median_seconds(lambda g=fwd_bwd: jax.block_until_ready(g(x, w, b)), lambda: None, repeats),
        }
    return out


def measure(frameworks, device: str, shapes, dtypes, repeats: int) -> list[dict]:
    """One dict per (op, shape, dtype, pass): the seconds of each implementation that ran,
    and the clone's (torch's x.clone() where torch runs, else jax.jit(jnp.copy))."""
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            for op in OPS:
                times = {}
                for fw in frameworks:
                    bench = bench_torch if fw == "torch" else bench_jax
                    for name, t in bench(device, op, shape, dtype, repeats).items():
                        times.setdefault(name, t)
                clone = times.pop("clone")["fwd"]
                for kind in PASSES:
                    rows.append(
                        {
                            "op": op,
                            "shape": shape,
                            "dtype": dtype,
                            "pass": kind,
                            "clone": clone,
                            "times": {k: v[kind] for k, v in times.items()},
                        }
                    )
    return rows


def bandwidth_fraction(row: dict, name: str) -> float:
    """(bytes the pass moves / its time) / (bytes x.clone() moves / its time)."""
    return TRAFFIC[row["pass"]] / 2 * row["clone"] / row["times"][name]


@common.recorded
def table(title: str, rows: list[dict], runs=None) -> None:
    ours = [n for n in OURS if n in rows[0]["times"]]
    peers = [n for n in PEERS if n in rows[0]["times"]]
    print(f"\n{title}")
    head = (
        f"{'op':<11}{'shape':>14}{'dtype':>10}{'pass':>9}"
        + "".join(f"{n:>15}" for n in ours + peers)
        + "".join(f"{'best/' + n.split('.')[1]:>13}" for n in ours)
        + "".join(f"{'bw ' + n.split('.')[1]:>10}" for n in ours)
    )
    print(head)
    print("-" * len(head))
    ratios = {n: [] for n in ours}
    for i, r in enumerate(rows):
        t = r["times"]
        line = f"{r['op']:<11}{str(r['shape']):>14}{r['dtype']:>10}{r['pass']:>9}"
        line += "".join(f"{t[n] * 1e6:>13.1f}us" for n in ours + peers)
        for n in ours:
            value, spread = common.ratio(rows, runs, i, lambda row, n=n: min(row["times"][p] for p in peers) / row["times"][n])
            ratios[n].append(value)
            line += f"{value:>12.2f}x{spread}"
        line += "".join(f"{bandwidth_fraction(r, n):>10.2f}" for n in ours)
        print(line)
    for n in ours:
        rs = ratios[n]
        print(
            f"{n}: geometric-mean ratio best peer/fuselet {statistics.geometric_mean(rs):.2f}x over {len(rs)} "
            f"cases; >= 1.0 in {sum(x >= 1.0 for x in rs)} of {len(rs)}; lowest {min(rs):.2f}x"
        )
    print(
        "best/torch, best/jax: the fastest of " + ", ".join(peers) + " over fuselet's time through that layer; "
        "bw: fuselet's bytes per second over x.clone()'s"
    )


def plot(rows: list[dict], title: str, path: Path) -> None:
    """Bandwidth fraction against the hidden size: one panel per op, pass and dtype."""
    plt = common.pyplot()
    if plt is None:
        print(f"matplotlib is not installed: no plot ({path} not written)")
        return

    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    panels = [(op, kind) for op in OPS for kind in PASSES]
    names = [n for n in OURS + PEERS if n in rows[0]["times"]]
    fig, axes = plt.subplots(len(panels), len(dtypes), figsize=(5 * len(dtypes), 3.2 * len(panels)), squeeze=False, sharex=True)
    for i, (op, kind) in enumerate(panels):
        for j, dtype in enumerate(dtypes):
            ax = axes[i][j]
            sel = sorted((r for r in rows if (r["op"], r["pass"], r["dtype"]) == (op, kind, dtype)), key=lambda r: r["shape"][-1])
            hidden = [r["shape"][-1] for r in sel]
            for n in names:
                style = "-o" if n in OURS else "--x"
                ax.plot(hidden, [bandwidth_fraction(r, n) for r in sel], style, label=n)
            ax.axhline(1.0, color="black", linewidth=1, label="x.clone() (device limit)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(hidden, [str(h) for h in hidden])
            ax.minorticks_off()
            ax.set_title(f"{op} {kind} {dtype}", fontsize=10)
            ax.set_ylabel("fraction of clone bandwidth")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if i == len(panels) - 1:
                ax.set_xlabel("hidden size (shape in the table)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title.replace(": ", ":\n"), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    print(f"plot: {path}")


def runnable(frameworks, device: str) -> list[str]:
    """The frameworks of `frameworks` installed here and able to use `device`."""
    found = []
    for fw in frameworks:
        try:
            if fw == "torch":
                import torch

                ok = device == "cpu" or torch.cuda.is_available()
            else:
                import jax

                ok = device == "cpu" or bool(jax.devices("gpu"))
        except (ImportError, RuntimeError):
            ok = False
        if ok:
            found.append(fw)
        else:
            print(f"{fw}: not installed or without a {device} device here; its columns are left out")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per case (median is reported)")
    parser.add_argument("--quick", action="store_true", help="two shapes, float32 only")
    parser.add_argument(
        "--plot", default=None, help="PNG to draw (default benchmarks/results/bench_norm-DEVICE.png; 'none': no plot)"
    )
    common.add_process_args(parser)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: expected an integer >= 1, got {args.repeats}")
    plot_path = (
        None
        if args.plot == "none" or args.record
        else Path(args.plot)
        if args.plot
        else RESULTS / f"bench_norm-{args.device}.png"
    )
    tables = common.in_processes(args, __file__, sys.argv[1:])
    if tables is not None:
        for title, rows, _, runs in tables:
            table(title, rows, runs=runs)
            if plot_path:
                plot(rows, title, plot_path)
        return
    shapes = SHAPES_GPU if args.device == "cuda" else SHAPES_CPU
    dtypes = ["float32", "bfloat16"]
    if args.quick:
        shapes, dtypes = shapes[1:3], ["float32"]
    frameworks = runnable(["torch", "jax"] if args.framework == "all" else [args.framework], args.device)
    if not frameworks:
        parser.error(f"--framework {args.framework}: nothing to run on {args.device}")
    rows = measure(frameworks, args.device, shapes, dtypes, args.repeats)
    versions = []
    if "torch" in frameworks:
        import torch

        versions.append(f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)")
    if "jax" in frameworks:
        import jax

        versions.append(f"JAX {jax.__version__}")
    title = f"{', '.join(versions)} on {args.device}: fuselet vs " + ", ".join(n for n in PEERS if n in rows[0]["times"])
    table(title, rows)
    if plot_path:
        plot(rows, title, plot_path)


if __name__ == "__main__":
    main()
