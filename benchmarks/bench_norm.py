"""Benchmark fuselet's RMSNorm / LayerNorm against the frameworks' own ops, same run.

Prints one table per framework and device: median time per call (forward, and forward +
backward) and the ratio peer / fuselet (> 1: fuselet is faster). Medians of --repeats
timed batches; the machines this runs on are noisy, so read the ratios, not the times.

    python benchmarks/bench_norm.py [--framework torch|jax|all] [--device cpu|cuda] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import time

SHAPES_CPU = [(4096, 512), (2048, 1024), (512, 4096), (256, 8192)]
SHAPES_GPU = [(8192, 1024), (16384, 4096), (4096, 8192), (65536, 2048)]


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


def table(title: str, rows: list[tuple]) -> None:
    print(f"\n{title}")
    head = f"{'op':<11}{'shape':>14}{'dtype':>10}{'pass':>9}{'fuselet':>12}{'peer':>12}{'peer/fuselet':>14}"
    print(head)
    print("-" * len(head))
    for op, shape, dtype, kind, ours, peer in rows:
        print(f"{op:<11}{str(shape):>14}{dtype:>10}{kind:>9}{ours * 1e6:>10.1f}us{peer * 1e6:>10.1f}us"
              f"{peer / ours:>13.2f}x")
    ratios = [peer / ours for *_, ours, peer in rows]
    print(f"geometric-mean ratio peer/fuselet: {statistics.geometric_mean(ratios):.2f}x over {len(rows)} cases")


def bench_torch(device: str, shapes, dtypes, repeats: int) -> None:
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for shape in shapes:
            h = shape[-1]
            x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
            w = torch.randn(h, device=device, dtype=dtype, requires_grad=True)
            b = torch.randn(h, device=device, dtype=dtype, requires_grad=True)
            dy = torch.randn(shape, device=device, dtype=dtype)
            cases = {
                "rms_norm": (lambda: ft.rms_norm(x, w, 1e-6), lambda: F.rms_norm(x, (h,), w, 1e-6)),
                "layer_norm": (lambda: ft.layer_norm(x, w, b, 1e-5), lambda: F.layer_norm(x, (h,), w, b, 1e-5)),
            }
            for op, (ours, peer) in cases.items():
                with torch.no_grad():
                    t_ours, t_peer = (median_seconds(f, sync, repeats) for f in (ours, peer))
                rows.append((op, shape, dtype_name, "fwd", t_ours, t_peer))
                fb = [lambda f=f: torch.autograd.grad(f(), (x, w), dy) for f in (ours, peer)]
                t_ours, t_peer = (median_seconds(f, sync, repeats) for f in fb)
                rows.append((op, shape, dtype_name, "fwd+bwd", t_ours, t_peer))
    peer = "torch.nn.functional.{rms_norm,layer_norm}"
    table(f"PyTorch {torch.__version__} on {device} ({torch.get_num_threads()} threads): fuselet vs {peer}", rows)


def bench_jax(device: str, shapes, dtypes, repeats: int) -> None:
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]

    def ref_rms(x, w):
        xf = x.astype(jnp.float32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * w

    def ref_layer(x, w, b):
        xf = x.astype(jnp.float32)
        mean, var = xf.mean(-1, keepdims=True), xf.var(-1, keepdims=True)
        return ((xf - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * w + b

    rows = []
    for dtype_name in dtypes:
        for shape in shapes:
            h = shape[-1]
            key = jax.random.split(jax.random.PRNGKey(0), 3)
            x = jax.device_put(jax.random.normal(key[0], shape, dtype_name), dev)
            w = jax.device_put(jax.random.normal(key[1], (h,), dtype_name), dev)
            b = jax.device_put(jax.random.normal(key[2], (h,), dtype_name), dev)
            cases = {
                "rms_norm": (lambda x, w, b: fj.rms_norm(x, w, 1e-6), lambda x, w, b: ref_rms(x, w)),
                "layer_norm": (lambda x, w, b: fj.layer_norm(x, w, b, 1e-5), ref_layer),
            }
            for op, (ours, peer) in cases.items():
                fwd = [jax.jit(f) for f in (ours, peer)]
                t = [median_seconds(lambda f=f: f(x, w, b).block_until_ready(), lambda: None, repeats) for f in fwd]
                rows.append((op, shape, dtype_name, "fwd", *t))
                grads = [jax.jit(jax.grad(lambda x, w, b, f=f: f(x, w, b).astype(jnp.float32).sum(), (0, 1)))
                         for f in (ours, peer)]
                t = [median_seconds(lambda g=g: jax.block_until_ready(g(x, w, b)), lambda: None, repeats)
                     for g in grads]
                rows.append((op, shape, dtype_name, "fwd+bwd", *t))
    table(f"JAX {jax.__version__} on {dev.platform}: fuselet vs jit-compiled jax.numpy", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per case (median is reported)")
    parser.add_argument("--quick", action="store_true", help="two shapes, float32 only")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: expected an integer >= 1, got {args.repeats}")
    shapes = SHAPES_GPU if args.device == "cuda" else SHAPES_CPU
    dtypes = ["float32", "bfloat16"]
    if args.quick:
        shapes, dtypes = shapes[1:3], ["float32"]
    if args.framework in ("torch", "all"):
        bench_torch(args.device, shapes, dtypes, args.repeats)
    if args.framework in ("jax", "all"):
        bench_jax(args.device, shapes, dtypes, args.repeats)


if __name__ == "__main__":
    main()
