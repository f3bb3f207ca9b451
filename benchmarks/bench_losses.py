"""Benchmark the post-training losses fused with the LM head against the unfused path they
replace: peak memory and time of one training step's loss (forward + backward to hidden and
weight), at the issue's size by default: 4096 tokens (2 x 1024 chosen + 2 x 1024 rejected for the
preference losses, 4 x 1024 completions for KTO (2 desirable, 2 undesirable), GRPO and
distillation), H 1024, V 32768, bfloat16.

The unfused path is what a trainer without fuselet runs (TRL's): the logits hidden @ weight.T in
the inputs' dtype, log_softmax in float32, the target's log-probabilities gathered, then the
loss; DPO's and KTO's reference model the same way under no_grad (its logits count in the peak
too). Peers in the same run: that path in torch eager and under torch.compile, and under jax.jit;
fuselet's fused_linear_preference_loss (loss="dpo", with a reference model),
fused_linear_kto_loss (with a reference model and a KL estimate), fused_linear_grpo_loss
(old and reference log-probabilities given) and fused_linear_jsd (a teacher of the same size, its
logits under no_grad in the unfused path: they count in the peak) through both layers. Each (method, repeat) runs in a
child process of its own that builds the inputs and runs one warm-up step, then measures the
peak (torch on the CPU: the resident set's peak, glibc mapping each allocation of 128 KiB or
more on its own; JAX: XLA's buffer assignment of the compiled step) or the median time of
--steps steps. Tables give medians over --processes children with the spread (min-max).

    python benchmarks/bench_losses.py [--loss dpo|kto|grpo|jsd] [--dtype bfloat16] [--tokens N --hidden H --vocab V]
        [--processes 3] [--steps 3] [--methods fuselet.torch,torch eager,...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import common

METHODS = ("fuselet.torch", "torch eager", "torch.compile", "fuselet.jax", "jax.jit")
UNFUSED = {"fuselet.torch": ("torch eager", "torch.compile"), "fuselet.jax": ("jax.jit",)}
SEQUENCES = 4  # 2 chosen + 2 rejected (dpo), 2 desirable + 2 undesirable (kto), 4 completions (grpo), 4 sequences (jsd)


def _torch_step(loss, method, dtype, n, h, v):
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dt, t = getattr(torch, dtype), n // SEQUENCES
    hidden = (torch.randn(SEQUENCES, t, h) * 0.5).to(dt).requires_grad_(True)
    weight = (torch.randn(v, h) * h**-0.5).to(dt).requires_grad_(True)
    ref_hidden, ref_weight = (torch.randn(SEQUENCES, t, h) * 0.5).to(dt), (torch.randn(v, h) * h**-0.5).to(dt)
    target = torch.randint(0, v, (SEQUENCES, t))
    advantages, old, ref = torch.randn(SEQUENCES), -torch.rand(SEQUENCES, t) * 10, -torch.rand(SEQUENCES, t) * 10
    labels, kl = torch.tensor([True, False] * (SEQUENCES // 2)), torch.tensor(0.5)

    def logps(hid, w):
        return (hid @ w.t()).float().log_softmax(-1).gather(-1, target[..., None])[..., 0]

    def unfused_dpo(hidden, weight):
        with torch.no_grad():
            rc, rr = logps(ref_hidden, ref_weight).sum(-1).chunk(2)
        c, r = logps(hidden, weight).sum(-1).chunk(2)
        return -F.logsigmoid(0.1 * ((c - rc) - (r - rr))).mean()

    def unfused_kto(hidden, weight):
        with torch.no_grad():
            ref_seq = logps(ref_hidden, ref_weight).sum(-1)
        r = logps(hidden, weight).sum(-1) - ref_seq
        return torch.where(labels, 1 - torch.sigmoid(0.1 * (r - kl)), 1 - torch.sigmoid(0.1 * (kl - r))).mean()

    def unfused_grpo(hidden, weight):
        lp = logps(hidden, weight)
        ratio = torch.exp(lp - old)
        a = advantages[:, None]
        per_token = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a) + 0.04 * (torch.exp(ref - lp) - (ref - lp) - 1)
        return per_token.mean(-1).mean()

    def unfused_jsd(hidden, weight, beta=0.5):  # TRL's generalized JSD over both models' logits
        with torch.no_grad():
            t = (ref_hidden @ ref_weight.t()).float().log_softmax(-1)
        s = (hidden @ weight.t()).float().log_softmax(-1)
        mix = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
        per = beta * F.kl_div(mix, t, reduction="none", log_target=True)
        return (per + (1 - beta) * F.kl_div(mix, s, reduction="none", log_target=True)).sum(-1).mean()

    fused = {
        "dpo": lambda a, b: ft.fused_linear_preference_loss(a, b, target, ref_hidden=ref_hidden, ref_weight=ref_weight),
        "kto": lambda a, b: ft.fused_linear_kto_loss(a, b, target, labels, ref_hidden=ref_hidden, ref_weight=ref_weight, kl=kl),
        "grpo": lambda a, b: ft.fused_linear_grpo_loss(a, b, target, advantages, old_logps=old, ref_logps=ref),
        "jsd": lambda a, b: ft.fused_linear_jsd(a, b, ref_hidden, ref_weight),
    }[loss]
    unfused = {"dpo": unfused_dpo, "kto": unfused_kto, "grpo": unfused_grpo, "jsd": unfused_jsd}[loss]
    loss_fn = {"fuselet.torch": fused, "torch eager": unfused, "torch.compile": torch.compile(unfused)}[method]

    def step():
        out = loss_fn(hidden, weight)
        out.backward()
        hidden.grad = weight.grad = None
        return float(out)

    return step, common.peak_rss


def _jax_step(loss, method, dtype, n, h, v):
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.PRNGKey(0), 8)
    t = n // SEQUENCES
    hidden = (jax.random.normal(k[0], (SEQUENCES, t, h)) * 0.5).astype(dtype)
    weight = (jax.random.normal(k[1], (v, h)) * h**-0.5).astype(dtype)
    ref_hidden = (jax.random.normal(k[2], (SEQUENCES, t, h)) * 0.5).astype(dtype)
    ref_weight = (jax.random.normal(k[3], (v, h)) * h**-0.5).astype(dtype)
    target = jax.random.randint(k[4], (SEQUENCES, t), 0, v)
    advantages = jax.random.normal(k[5], (SEQUENCES,))
    old, ref = -jax.random.uniform(k[6], (SEQUENCES, t)) * 10, -jax.random.uniform(k[7], (SEQUENCES, t)) * 10
    labels, kl = jnp.asarray([True, False] * (SEQUENCES // 2)), jnp.float32(0.5)

    def logps(hid, w):
        logp = jax.nn.log_softmax((hid @ w.T).astype(jnp.float32), axis=-1)
        return jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]

    def unfused_dpo(hidden, weight):
        rs = jax.lax.stop_gradient(logps(ref_hidden, ref_weight)).sum(-1)
        s = logps(hidden, weight).sum(-1)
        return -jax.nn.log_sigmoid(0.1 * ((s[:2] - rs[:2]) - (s[2:] - rs[2:]))).mean()

    def unfused_kto(hidden, weight):
        r = logps(hidden, weight).sum(-1) - jax.lax.stop_gradient(logps(ref_hidden, ref_weight)).sum(-1)
        return jnp.where(labels, 1 - jax.nn.sigmoid(0.1 * (r - kl)), 1 - jax.nn.sigmoid(0.1 * (kl - r))).mean()

    def unfused_grpo(hidden, weight):
        lp = logps(hidden, weight)
        ratio = jnp.exp(lp - old)
        a = advantages[:, None]
        per_token = -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a) + 0.04 * (jnp.exp(ref - lp) - (ref - lp) - 1)
        return per_token.mean(-1).mean()

    def unfused_jsd(hidden, weight, beta=0.5):
        t = jax.lax.stop_gradient(jax.nn.log_softmax((ref_hidden @ ref_weight.T).astype(jnp.float32), axis=-1))
        s = jax.nn.log_softmax((hidden @ weight.T).astype(jnp.float32), axis=-1)
        mix = jnp.logaddexp(s + math.log(1 - beta), t + math.log(beta))
        return jnp.mean(jnp.sum(beta * jnp.exp(t) * (t - mix) + (1 - beta) * jnp.exp(s) * (s - mix), -1))

    fused = {
        "dpo": lambda a, b: fj.fused_linear_preference_loss(a, b, target, ref_hidden=ref_hidden, ref_weight=ref_weight),
        "kto": lambda a, b: fj.fused_linear_kto_loss(a, b, target, labels, ref_hidden=ref_hidden, ref_weight=ref_weight, kl=kl),
        "grpo": lambda a, b: fj.fused_linear_grpo_loss(a, b, target, advantages, old_logps=old, ref_logps=ref),
        "jsd": lambda a, b: fj.fused_linear_jsd(a, b, ref_hidden, ref_weight),
    }[loss]
    unfused = {"dpo": unfused_dpo, "kto": unfused_kto, "grpo": unfused_grpo, "jsd": unfused_jsd}[loss]
    loss_fn = fused if method == "fuselet.jax" else unfused
    grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))

    def step():
        value, grads = grad(hidden, weight)
        jax.block_until_ready(grads)
        return float(value)

    def peak(fn):
        stats = grad.lower(hidden, weight).compile().memory_analysis()
        return stats.temp_size_in_bytes + stats.output_size_in_bytes

    return step, peak


def child(args) -> None:
    make = _jax_step if "jax" in args.method else _torch_step
    step, peak = make(args.loss, args.method, args.dtype, args.tokens, args.hidden, args.vocab)
    value = step()  # warm-up: compiles, spins up thread pools
    if args.child == "memory":
        return print(json.dumps({"peak_bytes": peak(step), "loss": value}))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "loss": value}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", choices=("dpo", "kto", "grpo", "jsd"), default="dpo")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--child", choices=("memory", "time"), help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tokens % SEQUENCES:
        p.error(f"--tokens: expected a multiple of {SEQUENCES} (the sequences), got {args.tokens}")
    if args.child:
        return child(args)
    sizes = ["--loss", args.loss, "--dtype", args.dtype, "--tokens", str(args.tokens), "--hidden", str(args.hidden)]
    sizes += ["--vocab", str(args.vocab), "--steps", str(args.steps)]
    results = {}
    for m in [m for m in args.methods.split(",") if m]:
        runs = {}
        for what in ("memory", "time"):
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072") if what == "memory" else None
            argv = ["--child", what, "--method", m, *sizes]
            runs[what] = [common.run_child(__file__, argv, env=env) for _ in range(args.processes)]
        results[m] = {
            "peak_bytes": [r["peak_bytes"] for r in runs["memory"]],
            "seconds": [r["seconds"] for r in runs["time"]],
            "loss": [r["loss"] for r in runs["memory"] + runs["time"]],
        }
    op = {
        "dpo": "fused_linear_preference_loss(loss='dpo', reference model)",
        "kto": "fused_linear_kto_loss(reference model, KL estimate)",
        "grpo": "fused_linear_grpo_loss",
        "jsd": "fused_linear_jsd(beta=0.5, a teacher of the same size)",
    }[args.loss]
    print(
        f"{op}: {args.tokens} tokens, H {args.hidden}, V {args.vocab}, {args.dtype} on the CPU; "
        f"medians over {args.processes} processes (min-max)"
    )
    head = f"{'method':<15}{'peak MiB':>26}{'step ms':>28}{'loss':>10}"
    print(head + "\n" + "-" * len(head))
    for m, r in results.items():
        print(
            f"{m:<15}{common.spread(r['peak_bytes'], 2**-20):>26}{common.spread(r['seconds'], 1e3):>28}"
            f"{statistics.median(r['loss']):>10.4f}"
        )
    for ours, peers in UNFUSED.items():
        for peer in (p for p in peers if ours in results and p in results):
            mem = statistics.median(results[ours]["peak_bytes"]) / statistics.median(results[peer]["peak_bytes"])
            t = statistics.median(results[ours]["seconds"]) / statistics.median(results[peer]["seconds"])
            print(f"{ours} / {peer}: peak memory {mem:.1%} (target <= 25%), time {t:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    main()
