"""Benchmark fuselet's fused linear cross-entropy against the unfused loss it replaces:
peak memory and time of one training step's loss (forward + backward to hidden, weight).

Peers, in the same run: torch `F.cross_entropy(hidden @ weight.T, target)` in eager and under
torch.compile, and jax.jit of the same loss through `jax.nn.log_softmax(hidden @ weight.T)`, all
in the inputs' dtype (no float32 copy of the logits); fuselet's
`fused_linear_cross_entropy` through both layers. Every (method, repeat) runs in a child process
of its own, which builds the inputs and runs one warm-up step (compiles, spins up thread
pools), then measures either
  - memory: how far one step lifts the peak above what the process held before it. torch on
    the CPU: the peak resident set (VmHWM, reset through /proc/self/clear_refs), with glibc told
    to map every allocation of 128 KiB or more on its own (MALLOC_MMAP_THRESHOLD_), so that freed
    memory leaves the resident set and one step's peak is its own; torch on a GPU:
    torch.cuda.max_memory_allocated. JAX (whose allocator keeps buffers between calls): XLA's
    buffer assignment of the compiled step, its temporaries plus its outputs (memory_analysis);
  - or time: the median of --steps steps, under the default allocator (a fresh mapping per
    allocation, as the memory children have, costs a lot on some machines).
The table gives the median over --processes children and the spread (min-max), the ratios
fuselet / unfused for memory and time, and the memory comparison is drawn as a PNG.

    python benchmarks/bench_fused_linear_cross_entropy.py [--device cpu|cuda] [--dtype bfloat16]
        [--tokens N --hidden H --vocab V] [--processes 3] [--steps 3] [--plot PATH|none]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import common

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("fuselet.torch", "torch eager", "torch.compile", "fuselet.jax", "jax.jit")
UNFUSED = {"fuselet.torch": ("torch eager", "torch.compile"), "fuselet.jax": ("jax.jit",)}
SIZES = {"cpu": (4096, 1024, 32768), "cuda": (16384, 4096, 131072)}


def _torch_step(method, device, dtype, n, h, v):
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    hidden = (torch.randn(n, h, device=device) * 0.5).to(dt).requires_grad_(True)
    weight = (torch.randn(v, h, device=device) * h**-0.5).to(dt).requires_grad_(True)
    target = torch.randint(0, v, (n,), device=device)

    def unfused(hidden, weight, target):
        return F.cross_entropy(hidden @ weight.t(), target)

    loss_fn = {
        "fuselet.torch": lambda a, b, c: ft.fused_linear_cross_entropy(a, b, c),
        "torch eager": unfused,
        "torch.compile": torch.compile(unfused),
    }[method]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        loss = loss_fn(hidden, weight, target)
        loss.backward()
        hidden.grad = weight.grad = None
        sync()
        return float(loss)

    def peak(fn):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fn()
            return torch.cuda.max_memory_allocated() - before
        return common.peak_rss(fn)

    return step, peak


def _jax_step(method, device, dtype, n, h, v):
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    hidden = jax.device_put((jax.random.normal(k[0], (n, h)) * 0.5).astype(dtype), dev)
    weight = jax.device_put((jax.random.normal(k[1], (v, h)) * h**-0.5).astype(dtype), dev)
    target = jax.device_put(jax.random.randint(k[2], (n,), 0, v), dev)

    def unfused(hidden, weight, target):
        logp = jax.nn.log_softmax(hidden @ weight.T, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, target[:, None], axis=-1))

    loss_fn = fj.fused_linear_cross_entropy if method == "fuselet.jax" else unfused
    grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))

    def step():
        loss, grads = grad(hidden, weight, target)
        jax.block_until_ready(grads)
        return float(loss)

    def peak(fn):
        stats = grad.lower(hidden, weight, target).compile().memory_analysis()
        return stats.temp_size_in_bytes + stats.output_size_in_bytes

    return step, peak


def child(args) -> None:
    make = _jax_step if "jax" in args.method else _torch_step
    step, peak = make(args.method, args.device, args.dtype, args.tokens, args.hidden, args.vocab)
    loss = step()  # warm-up: compiles, spins up thread pools
    if args.child == "memory":
        return print(json.dumps({"peak_bytes": peak(step), "loss": loss}))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "loss": loss}))


def run_child(args, method: str, what: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072") if what == "memory" else None
    return common.run_child(
        __file__,
        [
            "--child",
            what,
            "--method",
            method,
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--tokens",
            str(args.tokens),
            "--hidden",
            str(args.hidden),
            "--vocab",
            str(args.vocab),
            "--steps",
            str(args.steps),
        ],
        env=env,
    )


def plot(results: dict, title: str, path: Path) -> None:
    plt = common.pyplot()
    if plt is None:
        print(f"matplotlib is not installed: no plot ({path} not written)")
        return

    names = list(results)
    peaks = [statistics.median(r["peak_bytes"]) / 2**20 for r in results.values()]
    colors = ["tab:green" if n.startswith("fuselet") else "tab:gray" for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.barh(names[::-1], peaks[::-1], color=colors[::-1])
    ax.bar_label(bars, fmt="%.0f MiB", padding=3)
    ax.set_xlabel("peak memory of one loss step (forward + backward), MiB")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, max(peaks) * 1.25)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    p.add_argument("--tokens", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--plot", help="PNG (default benchmarks/results/bench_fused_linear_cross_entropy-DEVICE.png)")
    p.add_argument("--child", choices=("memory", "time"), help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    args = p.parse_args()
    n, h, v = SIZES[args.device]
    args.tokens, args.hidden, args.vocab = args.tokens or n, args.hidden or h, args.vocab or v
    if args.child:
        return child(args)
    methods = [m for m in args.methods.split(",") if m]
    results = {}
    for m in methods:
        runs = {what: [run_child(args, m, what) for _ in range(args.processes)] for what in ("memory", "time")}
        results[m] = {
            "peak_bytes": [r["peak_bytes"] for r in runs["memory"]],
            "seconds": [r["seconds"] for r in runs["time"]],
            "loss": [r["loss"] for r in runs["memory"] + runs["time"]],
        }
    title = (
        f"loss of {args.tokens} tokens, H {args.hidden}, V {args.vocab}, {args.dtype} on {args.device}: "
        f"medians over {args.processes} processes (min-max)"
    )
    print(title)
    head = f"{'method':<15}{'peak MiB':>24}{'step ms':>26}{'loss':>10}"
    print(head)
    print("-" * len(head))
    for m, r in results.items():
        print(
            f"{m:<15}{common.spread(r['peak_bytes'], 2**-20):>24}{common.spread(r['seconds'], 1e3):>26}"
            f"{statistics.median(r['loss']):>10.4f}"
        )
    for ours, peers in UNFUSED.items():
        for peer in peers:
            if ours in results and peer in results:
                mem = statistics.median(results[ours]["peak_bytes"]) / statistics.median(results[peer]["peak_bytes"])
                t = statistics.median(results[ours]["seconds"]) / statistics.median(results[peer]["seconds"])
                print(f"{ours} / {peer}: peak memory {mem:.1%} (target <= 25%), time {t:.2f}x (target <= 1.1x)")
    if args.plot != "none":
        plot(results, title, Path(args.plot) if args.plot else RESULTS / f"bench_fused_linear_cross_entropy-{args.device}.png")


if __name__ == "__main__":
    main()
