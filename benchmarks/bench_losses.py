"""Benchmark the post-training losses fused with the LM head against the unfused path they
replace: peak memory and time of one training step's loss (forward + backward to hidden and
weight), at the issue's size by default: 4096 tokens (2 x 1024 chosen + 2 x 1024 rejected for the
preference losses, 4 x 1024 completions for KTO (2 desirable, 2 undesirable), GRPO and
distillation, and for fused_linear_logprobs and GRPO with the entropy options), H 1024, V 32768,
bfloat16.

The unfused path is what a trainer without fuselet runs (TRL's): the logits hidden @ weight.T in
the inputs' dtype, log_softmax in float32, the target's log-probabilities gathered, then the
loss; DPO's and KTO's reference model the same way under no_grad (its logits count in the peak
too). Peers in the same run: that path in torch eager and under torch.compile, and under jax.jit;
fuselet's fused_linear_preference_loss (loss="dpo", with a reference model),
fused_linear_kto_loss (with a reference model and a KL estimate), fused_linear_grpo_loss
(old and reference log-probabilities given; grpo_entropy adds top_entropy_quantile 0.2 and
entropy_coef 0.01, which take the per-token entropies), fused_linear_logprobs (the per-token
log-probabilities and entropies TRL's trainers take, reduced to -mean(log p) - 0.01 mean(entropy)
for the backward) and fused_linear_jsd (a teacher of the same size, its logits under no_grad in
the unfused path: they count in the peak) through both layers; "jsd_per_token" the same
distillation through fused_linear_jsd_per_token (each token's divergence and the student's
entropy, as TRL's DistillationTrainer takes them; the loss their mean). Each (method, repeat) runs in a
child process of its own that builds the inputs and runs one warm-up step, then measures the
peak (torch on the CPU: the resident set's peak, glibc mapping each allocation of 128 KiB or
more on its own; JAX: XLA's buffer assignment of the compiled step) or the median time of
--steps steps. Tables give medians over --processes children with the spread (min-max). The
JAX step takes every array as an argument of its jit: closed over, they were constants, and XLA
computed the reference / teacher model's logits while compiling, out of the step's time and peak.

    python benchmarks/bench_losses.py [--loss dpo|cpo|simpo|orpo|kto|grpo|grpo_entropy|logprobs|jsd|jsd_per_token]
        [--dtype bfloat16] [--tokens N --hidden H --vocab V]
        [--processes 3] [--steps 3] [--methods fuselet.torch,torch eager,...] [--plot PATH|none]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import common

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("fuselet.torch", "torch eager", "torch.compile", "liger", "fuselet.jax", "jax.jit")
UNFUSED = {"fuselet.torch": ("torch eager", "torch.compile", "liger"), "fuselet.jax": ("jax.jit",)}
LOSSES = ("dpo", "cpo", "simpo", "orpo", "kto", "grpo", "grpo_entropy", "logprobs", "jsd", "jsd_per_token")
# 2 chosen + 2 rejected (dpo, cpo, simpo, orpo), 2 desirable + 2 undesirable (kto), 4 completions (grpo), 4 sequences
# (logprobs, jsd)
SEQUENCES = 4
# Liger-Kernel's chunked losses (liger_kernel.chunked_loss: plain torch, torch.compile per chunk) under the options that
# give fuselet's math; Liger has no fused linear loss but these, so other losses (grpo_entropy, logprobs,
# jsd_per_token) leave its column out.
LIGER = {
    "dpo": ("LigerFusedLinearDPOLoss", dict(beta=0.1, use_ref_model=True, average_log_prob=False, compute_nll_loss=False)),
    "cpo": ("LigerFusedLinearCPOLoss", dict(beta=0.1, alpha=1.0, average_log_prob=False, compute_nll_loss=True)),
    "simpo": ("LigerFusedLinearSimPOLoss", dict(beta=0.1, gamma=0.5, compute_nll_loss=False)),
    "orpo": ("LigerFusedLinearORPOLoss", dict(beta=0.1, compute_nll_loss=True)),
    "kto": ("LigerFusedLinearKTOLoss", dict(beta=0.1, use_ref_model=True, average_log_prob=False)),
    "grpo": (
        "LigerFusedLinearGRPOLoss",
        dict(beta=0.04, use_ref_model=True, loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2),
    ),
    "jsd": ("LigerFusedLinearJSDLoss", dict(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5)),
}


def liger_loss(loss):
    """Liger-Kernel's module for `loss` with fuselet's math, or None where Liger has none or liger_kernel is not
    importable."""
    if loss not in LIGER:
        print(f"Liger-Kernel has no {loss} loss: its column is left out")
        return None
    try:
        from liger_kernel import chunked_loss
    except ImportError as e:
        print(f"Liger-Kernel is not importable here ({e}): its column is left out")
        return None
    if loss not in LIGER:
        print(f"Liger-Kernel has no loss of {loss}: its column is left out")
        return None
    name, kwargs = LIGER[loss]
    return getattr(chunked_loss, name)(**kwargs)


def _torch_inputs(dtype, n, h, v):
    """The torch case's tensors (seeded): the policy's hidden and head (trained), the reference / teacher model's,
    the targets and the losses' per-sequence inputs."""
    import torch

    torch.manual_seed(0)
    dt, t = getattr(torch, dtype), n // SEQUENCES
    return dict(
        hidden=(torch.randn(SEQUENCES, t, h) * 0.5).to(dt),
        weight=(torch.randn(v, h) * h**-0.5).to(dt),
        ref_hidden=(torch.randn(SEQUENCES, t, h) * 0.5).to(dt),
        ref_weight=(torch.randn(v, h) * h**-0.5).to(dt),
        target=torch.randint(0, v, (SEQUENCES, t)),
        advantages=torch.randn(SEQUENCES),
        old=-torch.rand(SEQUENCES, t) * 10,
        ref=-torch.rand(SEQUENCES, t) * 10,
        labels=torch.tensor([True, False] * (SEQUENCES // 2)),
        kl=torch.tensor(0.5),
    )


def _unfused(loss, x, logps, logits, logp_entropy):
    """The unfused loss (TRL's math) of the case's tensors x as fn(hidden, weight): logps(hid, w) the targets'
    log-probabilities [SEQUENCES, T], logits(hid, w) the logits in the compute dtype (jsd), logp_entropy(hid, w) the
    log-probabilities and the entropies [SEQUENCES, T] (grpo_entropy, logprobs). Run by torch eager and torch.compile
    over the inputs' dtype, and in float64 as the reference."""
    import torch
    import torch.nn.functional as F

    target, labels, kl, old, ref, advantages = (x[k] for k in ("target", "labels", "kl", "old", "ref", "advantages"))
    ref_hidden, ref_weight, b = x["ref_hidden"], x["ref_weight"], SEQUENCES // 2

    def dpo(hidden, weight):
        with torch.no_grad():
            rc, rr = logps(ref_hidden, ref_weight).sum(-1).chunk(2)
        c, r = logps(hidden, weight).sum(-1).chunk(2)
        return -F.logsigmoid(0.1 * ((c - rc) - (r - rr))).mean()

    def cpo(hidden, weight):
        lp = logps(hidden, weight)
        c, r = lp.sum(-1).chunk(2)
        return -F.logsigmoid(0.1 * (c - r)).mean() - lp[:b].mean()

    def simpo(hidden, weight):
        c, r = logps(hidden, weight).mean(-1).chunk(2)
        return -F.logsigmoid(0.1 * (c - r) - 0.5).mean()

    def orpo(hidden, weight):
        lp = logps(hidden, weight)
        c, r = lp.mean(-1).chunk(2)
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        return -lp[:b].mean() - 0.1 * F.logsigmoid(log_odds).mean()

    def kto(hidden, weight):
        with torch.no_grad():
            ref_seq = logps(ref_hidden, ref_weight).sum(-1)
        r = logps(hidden, weight).sum(-1) - ref_seq
        return torch.where(labels, 1 - torch.sigmoid(0.1 * (r - kl)), 1 - torch.sigmoid(0.1 * (kl - r))).mean()

    def grpo(hidden, weight):
        lp = logps(hidden, weight)
        ratio = torch.exp(lp - old.to(lp.dtype))
        a = advantages.to(lp.dtype)[:, None]
        d = ref.to(lp.dtype) - lp
        per_token = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a) + 0.04 * (torch.exp(d) - d - 1)
        return per_token.mean(-1).mean()

    def grpo_entropy(hidden, weight):  # TRL's high-entropy mask (top 20%) and entropy bonus (0.01)
        lp, entropy = logp_entropy(hidden, weight)
        keep = (entropy.detach() >= torch.quantile(entropy.detach().flatten(), 0.8)).to(lp.dtype)
        ratio = torch.exp(lp - old.to(lp.dtype))
        a = advantages.to(lp.dtype)[:, None]
        d = ref.to(lp.dtype) - lp
        per_token = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a) * keep + 0.04 * (torch.exp(d) - d - 1)
        return per_token.mean(-1).mean() - 0.01 * (entropy * keep).sum() / keep.sum().clamp(min=1)

    def logprobs(hidden, weight):
        lp, entropy = logp_entropy(hidden, weight)
        return -lp.mean() - 0.01 * entropy.mean()

    def jsd(hidden, weight, beta=0.5):  # TRL's generalized JSD over both models' logits
        with torch.no_grad():
            t = logits(ref_hidden, ref_weight).log_softmax(-1)
        s = logits(hidden, weight).log_softmax(-1)
        mix = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
        per = beta * F.kl_div(mix, t, reduction="none", log_target=True)
        return (per + (1 - beta) * F.kl_div(mix, s, reduction="none", log_target=True)).sum(-1).mean()

    losses = {"dpo": dpo, "cpo": cpo, "simpo": simpo, "orpo": orpo, "kto": kto, "grpo": grpo, "jsd": jsd}
    return dict(losses, grpo_entropy=grpo_entropy, logprobs=logprobs, jsd_per_token=jsd)[loss]


def reference_loss(loss, x) -> float:
    """The case's loss in float64 (x: its tensors, in any dtype): the logits in float64 one sequence at a time."""
    import torch

    x = {k: (t.double() if t.is_floating_point() else t) for k, t in x.items()}

    def logits(hid, w):
        return hid.double() @ w.double().t()

    def logps(hid, w):
        rows = [logits(hid[i], w).log_softmax(-1).gather(-1, x["target"][i, :, None])[:, 0] for i in range(len(hid))]
        return torch.stack(rows)

    def logp_entropy(hid, w):  # one sequence's logits at a time
        rows = []
        for i in range(len(hid)):
            logp = logits(hid[i], w).log_softmax(-1)
            rows.append((logp.gather(-1, x["target"][i, :, None])[:, 0], -(logp.exp() * logp).sum(-1)))
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    if loss in ("jsd", "jsd_per_token"):  # per token: the mean over the sequences of their means
        per = []
        for i in range(SEQUENCES):
            one = dict(x, ref_hidden=x["ref_hidden"][i : i + 1])
            per.append(_unfused(loss, one, logps, logits, logp_entropy)(x["hidden"][i : i + 1], x["weight"]))
        return float(torch.stack(per).mean())
    with torch.no_grad():
        return float(_unfused(loss, x, logps, logits, logp_entropy)(x["hidden"], x["weight"]))


def _torch_step(loss, method, dtype, n, h, v):
    import fuselet.torch as ft
    import torch

    x = _torch_inputs(dtype, n, h, v)
    hidden, weight = x["hidden"].requires_grad_(True), x["weight"].requires_grad_(True)
    ref_hidden, ref_weight, target, labels = x["ref_hidden"], x["ref_weight"], x["target"], x["labels"]

    def logits(hid, w):
        return (hid @ w.t()).float()

    def logps(hid, w):
        return logits(hid, w).log_softmax(-1).gather(-1, target[..., None])[..., 0]

    def logp_entropy(hid, w):
        logp = logits(hid, w).log_softmax(-1)
        return logp.gather(-1, target[..., None])[..., 0], -(logp.exp() * logp).sum(-1)

    def fused(a, b):
        if loss in ("dpo", "cpo", "simpo", "orpo"):
            reference = dict(ref_hidden=ref_hidden, ref_weight=ref_weight) if loss == "dpo" else {}
            return ft.fused_linear_preference_loss(a, b, target, loss=loss, **reference)
        if loss == "kto":
            return ft.fused_linear_kto_loss(a, b, target, labels, ref_hidden=ref_hidden, ref_weight=ref_weight, kl=x["kl"])
        if loss.startswith("grpo"):
            entropy = dict(top_entropy_quantile=0.2, entropy_coef=0.01) if loss == "grpo_entropy" else {}
            return ft.fused_linear_grpo_loss(a, b, target, x["advantages"], old_logps=x["old"], ref_logps=x["ref"], **entropy)
        if loss == "logprobs":
            out = ft.fused_linear_logprobs(a, b, target, outputs=("log_probs", "entropy"))
            return -out.log_probs.mean() - 0.01 * out.entropy.mean()
        if loss == "jsd_per_token":
            return ft.fused_linear_jsd_per_token(a, b, ref_hidden, ref_weight, with_entropy=True).divergence.mean()
        return ft.fused_linear_jsd(a, b, ref_hidden, ref_weight)

    def liger(a, b):
        if loss in ("dpo", "cpo", "simpo", "orpo"):
            reference = dict(ref_input=ref_hidden, ref_weight=ref_weight) if loss == "dpo" else {}
            out = liger_fn(b, a, target, **reference)
        elif loss == "kto":
            out = liger_fn(a, b, target, preference_labels=labels, ref_input=ref_hidden, ref_weight=ref_weight, kl=x["kl"])
        elif loss == "grpo":
            mask = torch.ones_like(target)
            out = liger_fn(a, b, target, mask, x["advantages"], ref_per_token_logps=x["ref"], old_per_token_logps=x["old"])
        else:
            out = liger_fn(a.flatten(0, 1), b, ref_hidden.flatten(0, 1), ref_weight, target.flatten())
        return out[0] if isinstance(out, tuple) else out

    unfused = _unfused(loss, x, logps, logits, logp_entropy)
    liger_fn = liger_loss(loss) if method == "liger" else None
    if method == "liger" and liger_fn is None:
        raise SystemExit(3)
    loss_fn = {"fuselet.torch": fused, "torch eager": unfused, "torch.compile": torch.compile(unfused), "liger": liger}[method]

    def step():
        out = loss_fn(hidden, weight)
        out.backward()
        hidden.grad = weight.grad = None
        return float(out)

    return step, common.peak_rss, lambda: reference_loss(loss, x)


def _jax_step(loss, method, dtype, n, h, v):
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp
    import numpy as np

    k = jax.random.split(jax.random.PRNGKey(0), 8)
    t = n // SEQUENCES
    hidden = (jax.random.normal(k[0], (SEQUENCES, t, h)) * 0.5).astype(dtype)
    weight = (jax.random.normal(k[1], (v, h)) * h**-0.5).astype(dtype)
    ref_hidden = (jax.random.normal(k[2], (SEQUENCES, t, h)) * 0.5).astype(dtype)
    ref_weight = (jax.random.normal(k[3], (v, h)) * h**-0.5).astype(dtype)
    others = dict(  # jit arguments (see the module's docstring)
        target=jax.random.randint(k[4], (SEQUENCES, t), 0, v),
        advantages=jax.random.normal(k[5], (SEQUENCES,)),
        old=-jax.random.uniform(k[6], (SEQUENCES, t)) * 10,
        ref=-jax.random.uniform(k[7], (SEQUENCES, t)) * 10,
        labels=jnp.asarray([True, False] * (SEQUENCES // 2)),
        kl=jnp.float32(0.5),
        ref_hidden=ref_hidden,
        ref_weight=ref_weight,
    )

    def loss_fn(hidden, weight, x):
        """The method's loss of (hidden, weight) over the case's other arrays x."""
        ref_hidden, ref_weight, target, labels, kl = (x[k] for k in ("ref_hidden", "ref_weight", "target", "labels", "kl"))
        advantages, old, ref = x["advantages"], x["old"], x["ref"]
        b2 = SEQUENCES // 2

        def logps(hid, w):
            logp = jax.nn.log_softmax((hid @ w.T).astype(jnp.float32), axis=-1)
            return jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]

        def logp_entropy(hid, w):
            logp = jax.nn.log_softmax((hid @ w.T).astype(jnp.float32), axis=-1)
            return jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0], -(jnp.exp(logp) * logp).sum(-1)

        def unfused_dpo(hidden, weight):
            rs = jax.lax.stop_gradient(logps(ref_hidden, ref_weight)).sum(-1)
            s = logps(hidden, weight).sum(-1)
            return -jax.nn.log_sigmoid(0.1 * ((s[:b2] - rs[:b2]) - (s[b2:] - rs[b2:]))).mean()

        def unfused_cpo(hidden, weight):
            lp = logps(hidden, weight)
            s = lp.sum(-1)
            return -jax.nn.log_sigmoid(0.1 * (s[:b2] - s[b2:])).mean() - lp[:b2].mean()

        def unfused_simpo(hidden, weight):
            s = logps(hidden, weight).mean(-1)
            return -jax.nn.log_sigmoid(0.1 * (s[:b2] - s[b2:]) - 0.5).mean()

        def unfused_orpo(hidden, weight):
            lp = logps(hidden, weight)
            c, r = lp.mean(-1)[:b2], lp.mean(-1)[b2:]
            log_odds = (c - r) - (jnp.log1p(-jnp.exp(c)) - jnp.log1p(-jnp.exp(r)))
            return -lp[:b2].mean() - 0.1 * jax.nn.log_sigmoid(log_odds).mean()

        def unfused_kto(hidden, weight):
            r = logps(hidden, weight).sum(-1) - jax.lax.stop_gradient(logps(ref_hidden, ref_weight)).sum(-1)
            return jnp.where(labels, 1 - jax.nn.sigmoid(0.1 * (r - kl)), 1 - jax.nn.sigmoid(0.1 * (kl - r))).mean()

        def unfused_grpo(hidden, weight):
            lp = logps(hidden, weight)
            ratio = jnp.exp(lp - old)
            a = advantages[:, None]
            per_token = -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a) + 0.04 * (jnp.exp(ref - lp) - (ref - lp) - 1)
            return per_token.mean(-1).mean()

        def unfused_grpo_entropy(hidden, weight):
            lp, entropy = logp_entropy(hidden, weight)
            fixed = jax.lax.stop_gradient(entropy)
            keep = (fixed >= jnp.quantile(fixed.reshape(-1), 0.8)).astype(lp.dtype)
            ratio = jnp.exp(lp - old)
            a = advantages[:, None]
            per_token = -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a) * keep
            per_token = per_token + 0.04 * (jnp.exp(ref - lp) - (ref - lp) - 1)
            return per_token.mean(-1).mean() - 0.01 * (entropy * keep).sum() / jnp.maximum(keep.sum(), 1)

        def unfused_logprobs(hidden, weight):
            lp, entropy = logp_entropy(hidden, weight)
            return -lp.mean() - 0.01 * entropy.mean()

        def unfused_jsd(hidden, weight, beta=0.5):
            t = jax.lax.stop_gradient(jax.nn.log_softmax((ref_hidden @ ref_weight.T).astype(jnp.float32), axis=-1))
            s = jax.nn.log_softmax((hidden @ weight.T).astype(jnp.float32), axis=-1)
            mix = jnp.logaddexp(s + math.log(1 - beta), t + math.log(beta))
            return jnp.mean(jnp.sum(beta * jnp.exp(t) * (t - mix) + (1 - beta) * jnp.exp(s) * (s - mix), -1))

        def fused(a, b):
            if loss in ("dpo", "cpo", "simpo", "orpo"):
                reference = dict(ref_hidden=ref_hidden, ref_weight=ref_weight) if loss == "dpo" else {}
                return fj.fused_linear_preference_loss(a, b, target, loss=loss, **reference)
            if loss == "kto":
                return fj.fused_linear_kto_loss(a, b, target, labels, ref_hidden=ref_hidden, ref_weight=ref_weight, kl=kl)
            if loss.startswith("grpo"):
                entropy = dict(top_entropy_quantile=0.2, entropy_coef=0.01) if loss == "grpo_entropy" else {}
                return fj.fused_linear_grpo_loss(a, b, target, advantages, old_logps=old, ref_logps=ref, **entropy)
            if loss == "logprobs":
                out = fj.fused_linear_logprobs(a, b, target, outputs=("log_probs", "entropy"))
                return -out.log_probs.mean() - 0.01 * out.entropy.mean()
            if loss == "jsd_per_token":
                return fj.fused_linear_jsd_per_token(a, b, ref_hidden, ref_weight, with_entropy=True).divergence.mean()
            return fj.fused_linear_jsd(a, b, ref_hidden, ref_weight)

        unfused = {
            "dpo": unfused_dpo,
            "cpo": unfused_cpo,
            "simpo": unfused_simpo,
            "orpo": unfused_orpo,
            "kto": unfused_kto,
            "grpo": unfused_grpo,
            "grpo_entropy": unfused_grpo_entropy,
            "logprobs": unfused_logprobs,
            "jsd": unfused_jsd,
            "jsd_per_token": unfused_jsd,
        }[loss]
        return (fused if method == "fuselet.jax" else unfused)(hidden, weight)

    grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))

    def step():
        value, grads = grad(hidden, weight, others)
        jax.block_until_ready(grads)
        return float(value)

    def peak(fn):
        stats = grad.lower(hidden, weight, others).compile().memory_analysis()
        return stats.temp_size_in_bytes + stats.output_size_in_bytes

    def reference():  # the same arrays in float64, through torch's reference
        import torch

        arrays = dict(others, hidden=hidden, weight=weight)
        as_np = {key: np.asarray(a) for key, a in arrays.items()}  # float64 without jax's x64 mode
        x = {key: torch.from_numpy(a.astype(np.float64) if a.dtype.kind in "fV" else a.copy()) for key, a in as_np.items()}
        x["target"] = x["target"].long()
        return reference_loss(loss, x)

    return step, peak, reference


def child(args) -> None:
    make = _jax_step if "jax" in args.method else _torch_step
    step, peak, reference = make(args.loss, args.method, args.dtype, args.tokens, args.hidden, args.vocab)
    if args.child == "reference":
        return print(json.dumps({"loss": reference()}))
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
    p.add_argument("--loss", choices=LOSSES, default="dpo")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--plot", help="PNG of peaks and times (default benchmarks/results/bench_losses-LOSS-cpu.png; none: none)")
    p.add_argument("--child", choices=("memory", "time", "reference"), help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tokens % SEQUENCES:
        p.error(f"--tokens: expected a multiple of {SEQUENCES} (the sequences), got {args.tokens}")
    if args.child:
        return child(args)
    sizes = ["--loss", args.loss, "--dtype", args.dtype, "--tokens", str(args.tokens), "--hidden", str(args.hidden)]
    sizes += ["--vocab", str(args.vocab), "--steps", str(args.steps)]
    methods = [m for m in args.methods.split(",") if m]
    if "liger" in methods and liger_loss(args.loss) is None:
        methods.remove("liger")
    results, references = {}, {}
    for m in methods:
        runs = {}
        for what in ("memory", "time"):
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072") if what == "memory" else None
            argv = ["--child", what, "--method", m, *sizes]
            runs[what] = [common.run_child(__file__, argv, env=env) for _ in range(args.processes)]
        framework = "jax" if "jax" in m else "torch"
        if framework not in references:  # the float64 loss of the framework's inputs
            references[framework] = common.run_child(__file__, ["--child", "reference", "--method", m, *sizes])["loss"]
        results[m] = {
            "peak_bytes": [r["peak_bytes"] for r in runs["memory"]],
            "seconds": [r["seconds"] for r in runs["time"]],
            "loss": [r["loss"] for r in runs["memory"] + runs["time"]],
            "reference": references[framework],
        }
    op = {
        "dpo": "fused_linear_preference_loss(loss='dpo', reference model)",
        "cpo": "fused_linear_preference_loss(loss='cpo', alpha 1: the chosen NLL)",
        "simpo": "fused_linear_preference_loss(loss='simpo', gamma 0.5)",
        "orpo": "fused_linear_preference_loss(loss='orpo')",
        "kto": "fused_linear_kto_loss(reference model, KL estimate)",
        "grpo": "fused_linear_grpo_loss",
        "grpo_entropy": "fused_linear_grpo_loss(top_entropy_quantile=0.2, entropy_coef=0.01)",
        "logprobs": "fused_linear_logprobs(outputs=('log_probs', 'entropy'))",
        "jsd": "fused_linear_jsd(beta=0.5, a teacher of the same size)",
        "jsd_per_token": "fused_linear_jsd_per_token(beta=0.5, a teacher of the same size, with_entropy).divergence.mean()",
    }[args.loss]
    print(
        f"{op}: {args.tokens} tokens, H {args.hidden}, V {args.vocab}, {args.dtype} on the CPU; "
        f"medians over {args.processes} processes (min-max); loss error: |loss - the float64 loss of the same inputs|"
    )
    head = f"{'method':<15}{'peak MiB':>26}{'step ms':>28}{'loss':>10}{'loss error':>12}"
    print(head + "\n" + "-" * len(head))
    for m, r in results.items():
        value = statistics.median(r["loss"])
        print(
            f"{m:<15}{common.spread(r['peak_bytes'], 2**-20):>26}{common.spread(r['seconds'], 1e3):>28}"
            f"{value:>10.4f}{abs(value - r['reference']):>12.1e}"
        )
    for ours, peers in UNFUSED.items():
        for peer in (p for p in peers if ours in results and p in results):
            mem = statistics.median(results[ours]["peak_bytes"]) / max(statistics.median(results[peer]["peak_bytes"]), 1)
            t = statistics.median(results[ours]["seconds"]) / statistics.median(results[peer]["seconds"])
            target = "< 100%" if peer == "liger" else "<= 25%"
            met = (mem < 1 if peer == "liger" else mem <= 0.25) and t <= 1.0
            print(
                f"{ours} / {peer}: peak memory {mem:.1%} (target {target}), time {t:.2f}x (target <= 1.0x): "
                + ("met" if met else "not met")
            )
    if args.plot != "none":
        title = f"{op}\n{args.tokens} tokens, H {args.hidden}, V {args.vocab}, {args.dtype}, CPU; {args.processes} processes"
        common.plot_peak_and_time(results, title, args.plot or RESULTS / f"bench_losses-{args.loss}-cpu.png")


if __name__ == "__main__":
    main()
