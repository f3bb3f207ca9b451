"""Benchmark fuselet's cross-entropy against the unfused expression it replaces, in the same
run: F.cross_entropy(logits.float(), target) in torch eager and torch.compile, and jax.jit of
the jax.numpy expression (logsumexp - the target's logit, masked mean; no optax).

Prints one table per framework: median time per call of the mean loss (forward, and forward +
backward of the logits) and the ratio best peer / fuselet (> 1: fuselet is faster), plus the
peak memory of the CUDA allocator on GPUs. Every 8th token is ignored (ignore_index -100).

    python benchmarks/bench_cross_entropy.py [--framework torch|jax|all] [--device cpu|cuda]
                                             [--tokens 8192] [--vocab 32768] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys

import common
from bench_norm import median_seconds
from bench_ops import bandwidth, table


def bench_torch(device: str, tokens: int, vocab: int, dtypes, repeats: int) -> None:
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    def eager(x, t):
        return F.cross_entropy(x.float(), t)

    compiled = torch.compile(eager)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, peaks = [], []
    for dtype_name in dtypes:
        x = torch.randn(tokens, vocab, device=device, dtype=getattr(torch, dtype_name))
        t = torch.randint(0, vocab, (tokens,), device=device)
        t[::8] = -100
        fns = {"fuselet": ft.cross_entropy, "eager": eager, "compile": compiled}
        fwd = [median_seconds(lambda f=f: f(x, t), sync, repeats) for f in fns.values()]
        clone = median_seconds(lambda: x.clone(), sync, repeats)
        rows.append(("cross_entropy", (tokens, vocab), dtype_name, "fwd", bandwidth("cross_entropy", "fwd", fwd[0], clone), *fwd))
        xg = x.clone().requires_grad_(True)

        def step(f):
            f(xg, t).backward()
            xg.grad = None

        both = []
        for name, f in fns.items():
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            both.append(median_seconds(lambda f=f: step(f), sync, repeats))
            if device == "cuda":
                peaks.append((name, dtype_name, torch.cuda.max_memory_allocated() / 2**20))
        rows.append(
            (
                "cross_entropy",
                (tokens, vocab),
                dtype_name,
                "fwd+bwd",
                bandwidth("cross_entropy", "fwd+bwd", both[0], clone),
                *both,
            )
        )
    table(
        f"PyTorch {torch.__version__} on {device} ({torch.get_num_threads()} threads): fuselet vs "
        f"F.cross_entropy(logits.float(), target), eager and torch.compile",
        rows,
        ("eager", "compile"),
    )
    for name, dtype_name, mib in peaks:
        print(f"peak CUDA memory, fwd+bwd, {name:<8} {dtype_name:<9} {mib:9.0f} MiB")


def bench_jax(device: str, tokens: int, vocab: int, dtypes, repeats: int) -> None:
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp
    import numpy as np

    def unfused(x, t):
        x = x.astype(jnp.float32)
        valid = t != -100
        st = jnp.take_along_axis(x, jnp.where(valid, t, 0)[:, None], axis=-1)[:, 0]
        loss = jnp.where(valid, jax.nn.logsumexp(x, axis=-1) - st, 0.0)
        return jnp.sum(loss) / jnp.maximum(jnp.sum(valid), 1)

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    rows = []
    rng = np.random.default_rng(0)
    for dtype_name in dtypes:
        x = jax.device_put(jnp.asarray(rng.standard_normal((tokens, vocab), np.float32), dtype_name), dev)
        t = np.asarray(rng.integers(0, vocab, tokens), np.int32)
        t[::8] = -100
        t = jax.device_put(jnp.asarray(t), dev)
        fns = [jax.jit(fj.cross_entropy), jax.jit(unfused)]
        fwd = [median_seconds(lambda f=f: jax.block_until_ready(f(x, t)), lambda: None, repeats) for f in fns]
        copy = jax.jit(jnp.copy)
        clone = median_seconds(lambda: jax.block_until_ready(copy(x)), lambda: None, repeats)
        rows.append(("cross_entropy", (tokens, vocab), dtype_name, "fwd", bandwidth("cross_entropy", "fwd", fwd[0], clone), *fwd))
        grads = [jax.jit(jax.grad(f)) for f in (fj.cross_entropy, unfused)]
        both = [median_seconds(lambda g=g: jax.block_until_ready(g(x, t)), lambda: None, repeats) for g in grads]
        rows.append(
            (
                "cross_entropy",
                (tokens, vocab),
                dtype_name,
                "fwd+bwd",
                bandwidth("cross_entropy", "fwd+bwd", both[0], clone),
                *both,
            )
        )
    table(f"JAX {jax.__version__} on {dev.platform}: fuselet vs jax.jit of the jax.numpy expression", rows, ("jax.jit",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per case (median is reported)")
    common.add_process_args(parser)
    args = parser.parse_args()
    for name in ("tokens", "vocab", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    tables = common.in_processes(args, __file__, sys.argv[1:])
    if tables is not None:
        for title, rows, extra, runs in tables:
            table(title, rows, *extra, runs=runs)
        return
    dtypes = ["float32", "bfloat16"]
    if args.framework in ("torch", "all"):
        bench_torch(args.device, args.tokens, args.vocab, dtypes, args.repeats)
    if args.framework in ("jax", "all"):
        bench_jax(args.device, args.tokens, args.vocab, dtypes, args.repeats)


if __name__ == "__main__":
    main()
