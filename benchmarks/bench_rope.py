"""Benchmark fuselet's rope against the unfused expression it replaces, in the same run: torch
eager, torch.compile and jax.jit, forward and forward + backward, float32 and bfloat16.

x is [B, S, N, D] ("bshd") = [4, 2048, 32, 128] (--quick: [4, 256, 32, 128]), cos / sin
[S, D] in x's dtype, half-split pairs (transformers' rotate_half). Prints one table per
framework: median time per call, fuselet's bandwidth (x read + y written; the backward adds
dy read + dx written; the tables are negligible) and the ratio best peer / fuselet (> 1:
fuselet is faster). Medians of --repeats timed batches; the machines this runs on are noisy.

The rows "mrope" are multimodal rope (Qwen2-VL): three position tables cos / sin [3, S, D/2]
(one angle per pair) and the sections (16, 24, 24) of D = 128: fuselet reads them as they are
(pair_table, sections); the peers recompose them into one [S, D] table as transformers does
(split, one section from each table, concatenated twice) and apply rotate_half.

    python benchmarks/bench_rope.py [--framework torch|jax|all] [--device cpu|cuda] [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import common
from bench_norm import median_seconds

SHAPE = (4, 2048, 32, 128)
SECTIONS = (16, 24, 24)  # Qwen2-VL's mrope_section of D = 128
QUICK_SHAPE = (4, 256, 32, 128)


def _ratio(row) -> float:
    """best peer / fuselet of one row (shape, dtype, pass, bytes, fuselet, *peers)."""
    return min(row[5:]) / row[4]


@common.recorded
def table(title: str, rows: list[tuple], peers: tuple[str, ...], runs=None) -> None:
    print(f"\n{title}")
    head = (
        f"{'shape':>20}{'dtype':>10}{'pass':>15}{'fuselet':>12}{'GB/s':>8}"
        + "".join(f"{p:>12}" for p in peers)
        + f"{'peer/fuselet':>14}"
    )
    print(head)
    print("-" * len(head))
    ratios = []
    for i, (shape, dtype, kind, nbytes, ours, *theirs) in enumerate(rows):
        ratio, spread = common.ratio(rows, runs, i, _ratio)
        ratios.append(ratio)
        print(
            f"{str(shape):>20}{dtype:>10}{kind:>15}{ours * 1e3:>10.2f}ms{nbytes / ours / 1e9:>8.1f}"
            + "".join(f"{t * 1e3:>10.2f}ms" for t in theirs)
            + f"{ratio:>13.2f}x"
            + spread
        )
    print(f"geometric-mean ratio peer/fuselet: {statistics.geometric_mean(ratios):.2f}x over {len(rows)} cases")


def bytes_moved(shape, itemsize: int, kind: str) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * itemsize * (2 if kind == "fwd" else 4)


def bench_torch(device: str, shape, dtypes, repeats: int) -> None:
    import fuselet.torch as ft
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    b, s, n, d = shape
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        cos, sin = (torch.randn(s, d, device=device, dtype=dtype) for _ in range(2))

        def unfused(x=x, cos=cos, sin=sin):
            x1, x2 = x.chunk(2, -1)
            return x * cos[:, None] + torch.cat((-x2, x1), -1) * sin[:, None]

        torch._dynamo.reset()
        fns = (lambda x=x, cos=cos, sin=sin: ft.rope(x, cos, sin), unfused, torch.compile(unfused))
        with torch.no_grad():
            t = [median_seconds(f, sync, repeats) for f in fns]
        rows.append((shape, dtype_name, "fwd", bytes_moved(shape, x.element_size(), "fwd"), *t))
        dy = torch.randn_like(x)

        def fwd_bwd(f, x=x, dy=dy):
            return lambda: torch.autograd.grad(f(), (x,), dy)

        t = [median_seconds(fwd_bwd(f), sync, repeats) for f in fns]
        rows.append((shape, dtype_name, "fwd+bwd", bytes_moved(shape, x.element_size(), "fwd+bwd"), *t))

        sections = tuple(v * d // 128 for v in SECTIONS)
        cos3, sin3 = (torch.randn(3, s, d // 2, device=device, dtype=dtype) for _ in range(2))

        def recompose(t, sections=sections):
            t = torch.cat([m[i % 3] for i, m in enumerate(t.split(sections, -1))], -1)
            return torch.cat((t, t), -1)

        def unfused_mrope(x=x, cos3=cos3, sin3=sin3):
            c, s_ = recompose(cos3), recompose(sin3)
            x1, x2 = x.chunk(2, -1)
            return x * c[:, None] + torch.cat((-x2, x1), -1) * s_[:, None]

        torch._dynamo.reset()
        fns = (
            lambda x=x, c=cos3, s_=sin3: ft.rope(x, c, s_, pair_table=True, sections=sections),
            unfused_mrope,
            torch.compile(unfused_mrope),
        )
        with torch.no_grad():
            t = [median_seconds(f, sync, repeats) for f in fns]
        rows.append((shape, dtype_name, "fwd mrope", bytes_moved(shape, x.element_size(), "fwd"), *t))
        t = [median_seconds(fwd_bwd(f), sync, repeats) for f in fns]
        rows.append((shape, dtype_name, "fwd+bwd mrope", bytes_moved(shape, x.element_size(), "fwd+bwd"), *t))
    table(
        f"PyTorch {torch.__version__} on {device} ({torch.get_num_threads()} threads): fuselet vs the unfused "
        f"rotate_half expression, eager and torch.compile",
        rows,
        ("eager", "compile"),
    )


def bench_jax(device: str, shape, dtypes, repeats: int) -> None:
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    b, s, n, d = shape
    rows = []
    for dtype_name in dtypes:
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        x = jax.device_put(jax.random.normal(keys[0], shape, dtype_name), dev)
        cos, sin = (jax.device_put(jax.random.normal(k, (s, d), dtype_name), dev) for k in keys[1:])

        def unfused(x, cos, sin):
            x1, x2 = jnp.split(x, 2, axis=-1)
            return x * cos[:, None] + jnp.concatenate((-x2, x1), -1) * sin[:, None]

        fns = (lambda x, cos, sin: fj.rope(x, cos, sin), unfused)
        args = (x, cos, sin)
        itemsize = jnp.dtype(dtype_name).itemsize
        jitted = [jax.jit(f) for f in fns]
        t = [median_seconds(lambda f=f: jax.block_until_ready(f(*args)), lambda: None, repeats) for f in jitted]
        rows.append((shape, dtype_name, "fwd", bytes_moved(shape, itemsize, "fwd"), *t))

        def grad(f):
            return jax.jit(jax.grad(lambda x, c, s: jnp.sum(f(x, c, s).astype(jnp.float32))))

        grads = [grad(f) for f in fns]
        t = [median_seconds(lambda g=g: jax.block_until_ready(g(*args)), lambda: None, repeats) for g in grads]
        rows.append((shape, dtype_name, "fwd+bwd", bytes_moved(shape, itemsize, "fwd+bwd"), *t))

        sections = tuple(v * d // 128 for v in SECTIONS)
        keys = jax.random.split(jax.random.PRNGKey(1), 2)
        cos3, sin3 = (jax.device_put(jax.random.normal(k, (3, s, d // 2), dtype_name), dev) for k in keys)
        bounds = [sum(sections[:i]) for i in range(1, len(sections))]

        def recompose(t):
            t = jnp.concatenate([m[i % 3] for i, m in enumerate(jnp.split(t, bounds, -1))], -1)
            return jnp.concatenate((t, t), -1)

        def unfused_mrope(x, cos3, sin3):
            return unfused(x, recompose(cos3), recompose(sin3))

        fns = (lambda x, c, s_: fj.rope(x, c, s_, pair_table=True, sections=sections), unfused_mrope)
        args = (x, cos3, sin3)
        jitted = [jax.jit(f) for f in fns]
        t = [median_seconds(lambda f=f: jax.block_until_ready(f(*args)), lambda: None, repeats) for f in jitted]
        rows.append((shape, dtype_name, "fwd mrope", bytes_moved(shape, itemsize, "fwd"), *t))
        grads = [grad(f) for f in fns]
        t = [median_seconds(lambda g=g: jax.block_until_ready(g(*args)), lambda: None, repeats) for g in grads]
        rows.append((shape, dtype_name, "fwd+bwd mrope", bytes_moved(shape, itemsize, "fwd+bwd"), *t))
    table(f"JAX {jax.__version__} on {dev.platform}: fuselet vs jax.jit of the unfused expression", rows, ("jax.jit",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per case (median is reported)")
    parser.add_argument("--quick", action="store_true", help=f"x {list(QUICK_SHAPE)} instead of {list(SHAPE)}")
    common.add_process_args(parser)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: expected an integer >= 1, got {args.repeats}")
    tables = common.in_processes(args, __file__, sys.argv[1:])
    if tables is not None:
        for title, rows, extra, runs in tables:
            table(title, rows, *extra, runs=runs)
        return
    shape = QUICK_SHAPE if args.quick else SHAPE
    dtypes = ["float32", "bfloat16"]
    if args.framework in ("torch", "all"):
        bench_torch(args.device, shape, dtypes, args.repeats)
    if args.framework in ("jax", "all"):
        bench_jax(args.device, shape, dtypes, args.repeats)


if __name__ == "__main__":
    main()
