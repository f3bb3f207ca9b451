"""Benchmark fuselet's residual add + RMSNorm, SwiGLU / GeGLU, softmax and the divergences (kl_div,
jsd, tvd: log-probabilities in, one loss out) against the unfused expressions they replace, in the
same run: torch eager, torch.compile and jax.jit.

Prints one table per framework and device: median time per call (forward, and forward +
backward), fuselet's bandwidth as a fraction of x.clone()'s (bw: bytes read and written per
second, TRAFFIC below; the clone timed in the same run on the same x) and the ratio best peer /
fuselet (> 1: fuselet is faster). In the torch table the
peer is the faster of eager and torch.compile (both times are shown); in the JAX table it is
jax.jit of the jax.numpy expression. Medians of --repeats timed batches; the machines this
runs on are noisy, so read the ratios, not the times.

    python benchmarks/bench_ops.py [--family add_norm|glu|softmax|divergence|all] [--framework torch|jax|all]
                                   [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

import common
from bench_memory import gpt_oss_gate
from bench_norm import median_seconds

SHAPES_CPU = [(1024, 1024), (4096, 4096)]
SHAPES_GPU = [(8192, 4096), (16384, 8192)]
FAMILIES = {
    "add_norm": ("add_rms_norm", "gated_rms_norm"),
    "glu": ("swiglu", "geglu", "clamped_swiglu"),
    "softmax": ("softmax", "softmax_causal"),
    "divergence": ("kl_div", "jsd", "tvd"),
}
# Bytes each pass reads and writes, in tensors of the size of x (fwd, fwd+bwd); x.clone() moves 2.
# add_rms_norm: x, residual -> y, residual_out; then dy, d(residual_out), residual_out -> dx (= dresidual).
# gated_rms_norm: x, z -> y; then dy, x, z -> dx, dz.
# GLUs: x -> y (half of x); then x, dy -> dx. softmax: x -> y; then y, dy -> dx. cross_entropy: the logits
# -> a loss per row; then the logits -> dlogits. Divergences: input, target -> a loss per row; then input,
# target -> dinput.
TRAFFIC = {
    "add_rms_norm": (4, 8),
    "gated_rms_norm": (3, 8),
    "swiglu": (1.5, 4),
    "geglu": (1.5, 4),
    "clamped_swiglu": (1.5, 4),
    "softmax": (2, 5),
    "softmax_causal": (2, 5),
    "cross_entropy": (1, 3),
    "kl_div": (2, 5),
    "jsd": (2, 5),
    "tvd": (2, 5),
}


def _ratio(row) -> float:
    """best peer / fuselet of one row (op, shape, dtype, pass, bw, fuselet, *peers; None: not run)."""
    return min(t for t in row[6:] if t is not None) / row[5]


def bandwidth(op: str, kind: str, seconds: float, clone: float) -> float:
    """fuselet's bytes per second over x.clone()'s (timed in the same run on the same x)."""
    return TRAFFIC[op][kind != "fwd"] / 2 * clone / seconds


@common.recorded
def table(title: str, rows: list[tuple], peers: tuple[str, ...], runs=None) -> list[float]:
    print(f"\n{title}")
    head = (
        f"{'op':<15}{'shape':>14}{'dtype':>10}{'pass':>9}{'fuselet':>12}{'bw':>6}"
        + "".join(f"{p:>12}" for p in peers)
        + f"{'peer/fuselet':>14}"
    )
    print(head)
    print("-" * len(head))
    ratios = []
    for i, (op, shape, dtype, kind, bw, ours, *theirs) in enumerate(rows):
        ratio, spread = common.ratio(rows, runs, i, _ratio)
        ratios.append(ratio)
        print(
            f"{op:<15}{str(shape):>14}{dtype:>10}{kind:>9}{ours * 1e6:>10.1f}us{bw:>6.2f}"
            + "".join(f"{t * 1e6:>10.1f}us" if t is not None else f"{'-':>12}" for t in theirs)
            + f"{ratio:>13.2f}x"
            + spread
        )
    met = sum(r >= 1.0 for r in ratios)
    print(
        f"geometric-mean ratio peer/fuselet: {statistics.geometric_mean(ratios):.2f}x over {len(rows)} cases; "
        f"ratio >= 1.0 in {met} of {len(rows)}"
    )
    return ratios


def torch_cases(ops, shape, dtype, device):
    """op -> (inputs needing grad, fuselet fn, unfused fn, output shape) for one shape and dtype."""
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    rows, h = shape
    out = {}

    def t(*s, grad=True):
        return torch.randn(*s, device=device, dtype=dtype, requires_grad=grad)

    if "add_rms_norm" in ops:
        x, r, w = t(rows, h), t(rows, h), t(h)

        def unfused(x=x, r=r, w=w):
            res = x + r
            return F.rms_norm(res, (h,), w, 1e-6), res

        out["add_rms_norm"] = ((x, r, w), lambda x=x, r=r, w=w: ft.add_rms_norm(x, r, w, 1e-6), unfused)
    if "gated_rms_norm" in ops:  # Qwen3-Next's gated norm over groups of 128 (its head dim)
        x, z, w = t(rows, h), t(rows, h), t(h)

        def unfused_gated(x=x, z=z, w=w):
            g = x.float().unflatten(-1, (-1, 128))
            n = (g * torch.rsqrt(g.square().mean(-1, keepdim=True) + 1e-6)).flatten(-2)
            return (w * n.to(x.dtype) * F.silu(z.float())).to(x.dtype)

        out["gated_rms_norm"] = ((x, z, w), lambda x=x, z=z, w=w: ft.gated_rms_norm(x, z, w, 1e-6, 128), unfused_gated)
    for op, fused, act in (("swiglu", ft.swiglu, F.silu), ("geglu", ft.geglu, F.gelu)):
        if op in ops:
            x = t(rows, h)

            def unfused(x=x, act=act):
                g, u = x.chunk(2, -1)
                return act(g) * u

            out[op] = ((x,), lambda x=x, fused=fused: fused(x), unfused)
    if "clamped_swiglu" in ops:  # GPT-OSS's experts' gate, interleaved
        x = t(rows, h)
        out["clamped_swiglu"] = (
            (x,),
            lambda x=x: ft.clamped_swiglu(x, interleaved=True),
            lambda x=x: gpt_oss_gate(x, torch.clip, torch.sigmoid),
        )
    if "softmax" in ops:
        x = t(rows, h)
        out["softmax"] = ((x,), lambda x=x: ft.softmax(x, 0.125), lambda x=x: torch.softmax(x * 0.125, -1))
    if "softmax_causal" in ops:
        x = t(1, rows, h)
        mask = torch.ones(rows, h, dtype=torch.bool, device=device).tril(h - rows)
        out["softmax_causal"] = (
            (x,),
            lambda x=x: ft.softmax(x, 0.125, causal=True),
            lambda x=x: torch.softmax((x * 0.125).masked_fill(~mask, -math.inf), -1),
        )
    for op in ("kl_div", "jsd", "tvd"):
        if op in ops:  # student log-probabilities (requiring grad) against a teacher's
            x, target = t(rows, h).log_softmax(-1).detach().requires_grad_(True), t(rows, h, grad=False).log_softmax(-1)
            unfused = _torch_divergence(op)
            out[op] = (
                (x,),
                lambda x=x, op=op, target=target: DIVERGENCES[op](ft, x, target),
                lambda x=x, unfused=unfused, target=target: unfused(x, target),
            )
    return out


# op -> fuselet's call in either layer (m: fuselet.torch or fuselet.jax): the divergences as users
# call them (kl_div with log-probability targets, jsd at beta 0.5). The unfused expressions
# (_torch_divergence, _jax_divergence): torch's kl_div, TRL's generalized JSD (a logsumexp
# mixture), the total variation written out.
DIVERGENCES = {
    "kl_div": lambda m, x, t: m.kl_div(x, t, log_target=True),
    "jsd": lambda m, x, t: m.jsd(x, t, beta=0.5),
    "tvd": lambda m, x, t: m.tvd(x, t),
}


def _torch_divergence(op):
    import torch
    import torch.nn.functional as F

    def kl(x, t):
        return F.kl_div(x.float(), t.float(), reduction="batchmean", log_target=True)

    def jsd(x, t, beta=0.5):
        xf, tf = x.float(), t.float()
        mix = torch.logsumexp(torch.stack([xf + math.log(1 - beta), tf + math.log(beta)]), dim=0)
        per = beta * F.kl_div(mix, tf, reduction="none", log_target=True)
        return (per + (1 - beta) * F.kl_div(mix, xf, reduction="none", log_target=True)).sum(-1).mean()

    def tvd(x, t):
        return (0.5 * (t.float().exp() - x.float().exp()).abs().sum(-1)).mean()

    return {"kl_div": kl, "jsd": jsd, "tvd": tvd}[op]


def _jax_divergence(op):
    import jax.numpy as jnp

    def kl(x, t):
        xf, tf = x.astype(jnp.float32), t.astype(jnp.float32)
        return jnp.sum(jnp.exp(tf) * (tf - xf)) / x.shape[0]

    def jsd(x, t, beta=0.5):
        xf, tf = x.astype(jnp.float32), t.astype(jnp.float32)
        mix = jnp.logaddexp(xf + math.log(1 - beta), tf + math.log(beta))
        return jnp.mean(jnp.sum(beta * jnp.exp(tf) * (tf - mix) + (1 - beta) * jnp.exp(xf) * (xf - mix), -1))

    def tvd(x, t):
        return jnp.mean(0.5 * jnp.sum(jnp.abs(jnp.exp(t.astype(jnp.float32)) - jnp.exp(x.astype(jnp.float32))), -1))

    return {"kl_div": kl, "jsd": jsd, "tvd": tvd}[op]


def bench_torch(ops, device: str, shapes, dtypes, repeats: int) -> list[float]:
    import torch

    torch._dynamo.config.cache_size_limit = 256
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    lg = common.liger(device)
    for dtype_name in dtypes:
        for shape in shapes:
            for op, (inputs, ours, unfused) in torch_cases(ops, shape, getattr(torch, dtype_name), device).items():
                torch._dynamo.reset()
                compiled = torch.compile(unfused)
                fns = (ours, unfused, compiled)
                with torch.no_grad():
                    t = [median_seconds(f, sync, repeats) for f in fns]
                    clone = median_seconds(lambda x=inputs[0]: x.clone(), sync, repeats)
                rows.append((op, shape, dtype_name, "fwd", bandwidth(op, "fwd", t[0], clone), *t))

                def fwd_bwd(f, inputs=inputs):
                    def run():
                        out = f()
                        outs = out if isinstance(out, tuple) else (out,)
                        torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs])

                    return run

                t = [median_seconds(fwd_bwd(f), sync, repeats) for f in fns]
                rows.append((op, shape, dtype_name, "fwd+bwd", bandwidth(op, "fwd+bwd", t[0], clone), *t))
                if lg is not None and op == "swiglu":  # Liger's takes gate and up as two contiguous tensors
                    gate, up = (p.detach().contiguous().requires_grad_(True) for p in inputs[0].chunk(2, -1))
                    liger_fn = lambda g=gate, u=up: lg.liger_swiglu(g, u)
                    with torch.no_grad():
                        rows[-2] += (median_seconds(liger_fn, sync, repeats),)
                    rows[-1] += (median_seconds(fwd_bwd(liger_fn, (gate, up)), sync, repeats),)
                elif lg is not None:  # no Liger op (its GeGLU is the tanh approximation: another function)
                    rows[-2], rows[-1] = rows[-2] + (None,), rows[-1] + (None,)
    peers = ("eager", "compile") + (("liger",) if lg is not None else ())
    return table(
        f"PyTorch {torch.__version__} on {device} ({torch.get_num_threads()} threads): fuselet vs the unfused "
        f"expression, eager and torch.compile" + (", and Liger-Kernel" if lg is not None else ""),
        rows,
        peers,
    )


def jax_cases(ops, shape, dtype, dev):
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    rows, h = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    out = {}

    def t(i, *s):
        return jax.device_put(jax.random.normal(keys[i], s, dtype), dev)

    if "add_rms_norm" in ops:

        def unfused_add(x, r, w):
            res = x + r
            rf = res.astype(jnp.float32)
            return (rf * jax.lax.rsqrt(jnp.mean(rf * rf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * w, res

        out["add_rms_norm"] = (
            (t(0, rows, h), t(1, rows, h), t(2, h)),
            lambda x, r, w: fj.add_rms_norm(x, r, w, 1e-6),
            unfused_add,
        )

    if "gated_rms_norm" in ops:

        def unfused_gated(x, z, w):
            g = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 128)
            n = (g * jax.lax.rsqrt(jnp.mean(g * g, -1, keepdims=True) + 1e-6)).reshape(x.shape)
            return (w * n.astype(x.dtype) * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)

        out["gated_rms_norm"] = (
            (t(0, rows, h), t(1, rows, h), t(2, h)),
            lambda x, z, w: fj.gated_rms_norm(x, z, w, 1e-6, 128),
            unfused_gated,
        )

    def glu(act):
        def f(x):
            g, u = jnp.split(x, 2, axis=-1)
            return act(g) * u

        return f

    if "swiglu" in ops:
        out["swiglu"] = ((t(0, rows, h),), fj.swiglu, glu(jax.nn.silu))
    if "geglu" in ops:
        out["geglu"] = ((t(0, rows, h),), fj.geglu, glu(lambda g: jax.nn.gelu(g, approximate=False)))
    if "clamped_swiglu" in ops:
        out["clamped_swiglu"] = (
            (t(0, rows, h),),
            lambda x: fj.clamped_swiglu(x, interleaved=True),
            lambda x: gpt_oss_gate(x, jnp.clip, jax.nn.sigmoid),
        )
    if "softmax" in ops:
        out["softmax"] = ((t(0, rows, h),), lambda x: fj.softmax(x, 0.125), lambda x: jax.nn.softmax(x * 0.125, axis=-1))
    if "softmax_causal" in ops:
        mask = jnp.tril(jnp.ones((rows, h), bool), h - rows)
        out["softmax_causal"] = (
            (t(0, 1, rows, h),),
            lambda x: fj.softmax(x, 0.125, causal=True),
            lambda x: jax.nn.softmax(jnp.where(mask, x * 0.125, -jnp.inf), axis=-1),
        )
    for op in ("kl_div", "jsd", "tvd"):
        if op in ops:  # the teacher closed over: the gradient is the student's
            x, target = jax.nn.log_softmax(t(0, rows, h), -1), jax.nn.log_softmax(t(1, rows, h), -1)
            unfused = _jax_divergence(op)
            out[op] = (
                (x,),
                lambda x, op=op, target=target: DIVERGENCES[op](fj, x, target),
                lambda x, unfused=unfused, target=target: unfused(x, target),
            )
    return out


def bench_jax(ops, device: str, shapes, dtypes, repeats: int) -> list[float]:
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    rows = []
    for dtype_name in dtypes:
        for shape in shapes:
            for op, (args, ours, unfused) in jax_cases(ops, shape, dtype_name, dev).items():
                fwd = [jax.jit(f) for f in (ours, unfused)]
                t = [median_seconds(lambda f=f: jax.block_until_ready(f(*args)), lambda: None, repeats) for f in fwd]
                copy = jax.jit(jnp.copy)
                clone = median_seconds(lambda: jax.block_until_ready(copy(args[0])), lambda: None, repeats)
                rows.append((op, shape, dtype_name, "fwd", bandwidth(op, "fwd", t[0], clone), *t))

                def loss(f):
                    def g(*a):
                        out = f(*a)
                        return sum(jnp.sum(o.astype(jnp.float32)) for o in (out if isinstance(out, tuple) else (out,)))

                    return g

                grads = [jax.jit(jax.grad(loss(f), tuple(range(len(args))))) for f in (ours, unfused)]
                t = [median_seconds(lambda g=g: jax.block_until_ready(g(*args)), lambda: None, repeats) for g in grads]
                rows.append((op, shape, dtype_name, "fwd+bwd", bandwidth(op, "fwd+bwd", t[0], clone), *t))
    return table(
        f"JAX {jax.__version__} on {dev.platform}: fuselet vs jax.jit of the unfused jax.numpy expression", rows, ("jax.jit",)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    parser.add_argument("--framework", choices=["torch", "jax", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per case (median is reported)")
    parser.add_argument("--quick", action="store_true", help="the smaller shape, float32 only")
    common.add_process_args(parser)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: expected an integer >= 1, got {args.repeats}")
    tables = common.in_processes(args, __file__, sys.argv[1:])
    if tables is not None:
        for title, rows, extra, runs in tables:
            table(title, rows, *extra, runs=runs)
        return
    ops = [op for fam, names in FAMILIES.items() if args.family in (fam, "all") for op in names]
    shapes = SHAPES_GPU if args.device == "cuda" else SHAPES_CPU
    dtypes = ["float32", "bfloat16"]
    if args.quick:
        shapes, dtypes = shapes[:1], ["float32"]
    if args.framework in ("torch", "all"):
        bench_torch(ops, args.device, shapes, dtypes, args.repeats)
    if args.framework in ("jax", "all"):
        bench_jax(ops, args.device, shapes, dtypes, args.repeats)


if __name__ == "__main__":
    main()
