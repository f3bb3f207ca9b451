"""One training step of a transformer, stock against fuselet: time and peak memory.

torch: transformers' LlamaForCausalLM and GemmaForCausalLM built from a config (no download),
stock against the same model after `fuselet.torch.transformers.fuse(model)` (RMSNorms, gated
MLPs, rotary embedding and the causal-LM loss, whose logits are never made), each in eager and
under torch.compile, in three precisions: float32; autocast (float32 weights, bfloat16
matmuls); bfloat16 weights. A step is forward + loss + backward + AdamW.

JAX: a flax (linen) Llama-style model (embedding, pre-norm blocks of attention with RoPE and a
SwiGLU MLP, final norm, untied head) trained with optax.adamw under jax.jit, written once with
jax.numpy and once with fuselet.jax's rms_norm, add_rms_norm, rope, swiglu and
fused_linear_cross_entropy; float32 and bfloat16 weights.

Every (case, repeat) runs in a child process of its own: it builds the model (same seed for
stock and fuselet), runs two warm-up steps (compiles, allocates the optimizer state), times
--steps steps (median), then measures the memory of one more step:
  - torch on the CPU: how far the step lifts the peak resident set above what the process
    holds before it (glibc told to map every allocation of 128 KiB or more on its own first);
  - torch on a GPU: torch.cuda.max_memory_allocated over the step above the memory allocated
    before it;
  - JAX: XLA's temporaries of the compiled step (memory_analysis: its buffers beyond the
    parameters, optimizer state and batch it takes and gives back).
The table gives medians over --processes children with their spread (min-max), the ratios
fuselet / stock, and a PNG draws both.

    python benchmarks/bench_step.py [--device cpu|cuda] [--frameworks torch,jax]
        [--models llama,gemma] [--modes eager,compile] [--precisions float32,autocast,bfloat16]
        [--processes 3] [--steps 3] [--plot PATH|none]
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
# (batch, sequence, hidden, intermediate, layers, heads, kv heads, vocab) per device: the CPU's
# fits a 2-core machine in about a second a step; both have a vocabulary where the logits weigh.
SIZES = {"cpu": (2, 512, 512, 1408, 2, 8, 4, 32768), "cuda": (4, 2048, 2048, 5632, 8, 16, 8, 131072)}
IMPLS = {"torch": ("stock", "fuselet"), "jax": ("jax.numpy", "fuselet.jax")}


def size(args) -> dict:
    b, s, h, f, n, heads, kv, v = SIZES[args.device]
    return dict(
        batch=b,
        seq=s,
        hidden=args.hidden or h,
        intermediate=f,
        layers=args.layers or n,
        heads=heads,
        kv_heads=kv,
        vocab=args.vocab or v,
    )


# --- torch: transformers models -------------------------------------------------------------


def torch_model(model: str, impl: str, precision: str, device: str, sz: dict):
    import torch
    import transformers

    common_config = dict(
        hidden_size=sz["hidden"],
        intermediate_size=sz["intermediate"],
        num_hidden_layers=sz["layers"],
        num_attention_heads=sz["heads"],
        num_key_value_heads=sz["kv_heads"],
        vocab_size=sz["vocab"],
        max_position_embeddings=sz["seq"],
    )
    if model == "llama":
        config, cls = transformers.LlamaConfig(**common_config), transformers.LlamaForCausalLM
    else:
        config = transformers.GemmaConfig(**common_config, head_dim=sz["hidden"] // sz["heads"], hidden_act="gelu_pytorch_tanh")
        cls = transformers.GemmaForCausalLM
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        net = cls(config)
    if precision == "bfloat16":
        net = net.to(torch.bfloat16)
    if impl == "fuselet":
        import fuselet.torch as ft

        net = ft.transformers.fuse(net)
    return net


def torch_case(args, sz: dict):
    import torch

    device = args.device
    net = torch_model(args.model, args.impl, args.precision, device, sz)
    forward = torch.compile(net) if args.mode == "compile" else net
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, sz["vocab"], (sz["batch"], sz["seq"]), generator=g).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.precision == "autocast")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with autocast:
            loss = forward(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return float(loss)

    def memory() -> dict:
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            step()
            return {"step_bytes": torch.cuda.max_memory_allocated() - before, "process_bytes": torch.cuda.max_memory_allocated()}
        common.isolate_allocations()
        return {"step_bytes": common.peak_rss(step), "process_bytes": common.rss_kib("VmHWM") * 1024}

    return step, memory


# --- JAX: a flax Llama-style model ----------------------------------------------------------


def flax_llama(impl: str, sz: dict, dtype: str):
    """A flax.linen Llama-style causal LM: (params, loss_fn(params, tokens)). impl "jax.numpy"
    writes every op with jax.numpy, "fuselet.jax" calls fuselet's; the parameters are the same."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    fused = impl == "fuselet.jax"
    if fused:
        import fuselet.jax as fj
    dt = jnp.dtype(dtype)
    h, f, heads, kv, v = sz["hidden"], sz["intermediate"], sz["heads"], sz["kv_heads"], sz["vocab"]
    d, eps = h // heads, 1e-6

    def rms_norm(x, w):
        if fused:
            return fj.rms_norm(x, w, eps)
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * w).astype(x.dtype)

    def add_rms_norm(x, residual, w):
        """(rms_norm(x + residual), x + residual)"""
        if fused:
            return fj.add_rms_norm(x, residual, w, eps)
        s = x + residual
        return rms_norm(s, w), s

    def rope(x, cos, sin):  # x [B, S, N, D], cos / sin [S, D]
        if fused:
            return fj.rope(x, cos, sin)
        x1, x2 = jnp.split(x, 2, -1)
        rot = jnp.concatenate([-x2, x1], -1)
        return (x * cos[:, None] + rot * sin[:, None]).astype(x.dtype)

    def swiglu(y):  # y = [gate, up]
        if fused:
            return fj.swiglu(y)
        gate, up = jnp.split(y, 2, -1)
        return jax.nn.silu(gate) * up

    def loss(hidden, head, targets):  # hidden [T, H], head [V, H]
        if fused:
            return fj.fused_linear_cross_entropy(hidden, head, targets)
        logits = (hidden @ head.T).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def dense(features, name):
        return nn.Dense(features, use_bias=False, dtype=dt, param_dtype=dt, name=name)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, residual, cos, sin):
            ones = nn.initializers.ones
            w1 = self.param("attn_norm", ones, (h,), jnp.float32)
            w2 = self.param("mlp_norm", ones, (h,), jnp.float32)
            normed, x = add_rms_norm(x, residual, w1) if residual is not None else (rms_norm(x, w1), x)
            b, s, _ = normed.shape
            q = rope(dense(heads * d, "q")(normed).reshape(b, s, heads, d), cos, sin)
            k = rope(dense(kv * d, "k")(normed).reshape(b, s, kv, d), cos, sin)
            vv = dense(kv * d, "v")(normed).reshape(b, s, kv, d)
            attn = jax.nn.dot_product_attention(q, k, vv, is_causal=True).reshape(b, s, heads * d)
            normed, x = add_rms_norm(dense(h, "o")(attn), x, w2)
            return dense(h, "down")(swiglu(dense(2 * f, "gate_up")(normed))), x

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            embed = self.param("embed", nn.initializers.normal(0.02), (v, h), dt)
            head = self.param("head", nn.initializers.normal(0.02), (v, h), dt)
            s = tokens.shape[1]
            inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
            freqs = jnp.arange(s, dtype=jnp.float32)[:, None] * inv[None]
            angles = jnp.concatenate([freqs, freqs], -1)
            cos, sin = jnp.cos(angles), jnp.sin(angles)
            x, residual = embed[tokens], None
            for i in range(sz["layers"]):
                x, residual = Block(name=f"block{i}")(x, residual, cos, sin)
            normed, _ = add_rms_norm(x, residual, self.param("norm", nn.initializers.ones, (h,), jnp.float32))
            return loss(normed[:, :-1].reshape(-1, h), head, tokens[:, 1:].reshape(-1))

    model = Model()
    tokens = jax.random.randint(jax.random.PRNGKey(1), (sz["batch"], sz["seq"]), 0, v)
    params = model.init(jax.random.PRNGKey(0), tokens)
    return params, model.apply, tokens


def jax_case(args, sz: dict):
    import jax
    import optax

    if args.device == "cuda":
        jax.config.update("jax_default_device", jax.devices("gpu")[0])
    params, apply, tokens = flax_llama(args.impl, sz, "bfloat16" if args.precision == "bfloat16" else "float32")
    opt = optax.adamw(1e-4)
    state = [params, opt.init(params)]

    def train(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(apply)(params, tokens)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # compiled once: the steps run it and its memory_analysis describes it
    compiled = jax.jit(train, donate_argnums=(0, 1)).lower(state[0], state[1], tokens).compile()

    def step():
        state[0], state[1], loss = compiled(state[0], state[1], tokens)
        return float(loss)

    def memory() -> dict:
        stats = compiled.memory_analysis()
        return {"step_bytes": stats.temp_size_in_bytes, "process_bytes": stats.argument_size_in_bytes + stats.temp_size_in_bytes}

    return step, memory


# --- the parent: cases, children, table, picture --------------------------------------------


def child(args) -> None:
    sz = size(args)
    step, memory = (jax_case if args.framework == "jax" else torch_case)(args, sz)
    loss = [step(), step()]  # warm-up: compiles, allocates the optimizer state
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss.append(step())
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "loss": loss[0], **memory()}))


def cases(args) -> list[dict]:
    out = []
    for fw in args.frameworks:
        models = args.models if fw == "torch" else ["llama"]
        modes = args.modes if fw == "torch" else ["jit"]
        precisions = [p for p in args.precisions if fw == "torch" or p != "autocast"]
        for model in models:
            for precision in precisions:
                for mode in modes:
                    for impl in IMPLS[fw]:
                        out.append(dict(framework=fw, model=model, precision=precision, mode=mode, impl=impl))
    return out


def label(c: dict) -> str:
    return f"{c['framework']} {c['model']} {c['precision']} {c['mode']}"


def plot(results: list[dict], title: str, path: Path) -> None:
    plt = common.pyplot()
    if plt is None:
        print(f"matplotlib is not installed: no plot ({path} not written)")
        return
    groups = list(dict.fromkeys(label(r) for r in results))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(groups) + 1.8), sharey=True)
    for ax, key, scale, unit in (
        (axes[0], "seconds", 1e3, "step time, ms"),
        (axes[1], "step_bytes", 2**-20, "peak memory of a step, MiB"),
    ):
        for offset, fuselet in ((0.2, False), (-0.2, True)):
            rows = [r for r in results if r["impl"].startswith("fuselet") == fuselet]
            ys = [groups.index(label(r)) + offset for r in rows]
            xs = [statistics.median(r[key]) * scale for r in rows]
            bars = ax.barh(
                ys, xs, height=0.4, color="tab:green" if fuselet else "tab:gray", label="fuselet" if fuselet else "stock"
            )
            ax.bar_label(bars, fmt="%.0f", padding=2, fontsize=7)
        ax.set_xlabel(unit)
        ax.set_xlim(0, max(statistics.median(r[key]) * scale for r in results) * 1.2)
    axes[0].set_yticks(range(len(groups)), groups, fontsize=8)
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


def report(results: list[dict], args) -> None:
    head = f"{'framework':<10}{'model':<7}{'precision':<10}{'mode':<9}{'impl':<13}{'step ms':>24}{'step peak MiB':>22}{'loss':>9}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['framework']:<10}{r['model']:<7}{r['precision']:<10}{r['mode']:<9}{r['impl']:<13}"
            f"{common.spread(r['seconds'], 1e3):>24}{common.spread(r['step_bytes'], 2**-20, 0):>22}"
            f"{statistics.median(r['loss']):>9.4f}"
        )
    print(
        "\nfuselet / stock, medians (time: < 1 is faster; memory: < 1 is smaller); best = the faster of "
        "eager and compile on each side"
    )
    groups = {}
    for r in results:
        groups.setdefault((r["framework"], r["model"], r["precision"]), []).append(r)
    for (fw, model, precision), rows in groups.items():
        med = {(r["mode"], r["impl"].startswith("fuselet")): r for r in rows}
        parts = []
        for mode in dict.fromkeys(m for m, _ in med):
            if (mode, True) in med and (mode, False) in med:
                ours, theirs = med[(mode, True)], med[(mode, False)]
                t = statistics.median(ours["seconds"]) / statistics.median(theirs["seconds"])
                m = statistics.median(ours["step_bytes"]) / statistics.median(theirs["step_bytes"])
                parts.append(f"{mode}: time {t:.2f}x, memory {m:.2f}x")
        best = {
            side: min(
                (r for r in rows if r["impl"].startswith("fuselet") == side),
                key=lambda r: statistics.median(r["seconds"]),
                default=None,
            )
            for side in (True, False)
        }
        if best[True] and best[False] and len(rows) > 2:
            ours, theirs = best[True], best[False]
            within = min(ours["seconds"]) <= max(theirs["seconds"])
            parts.append(
                f"best: {ours['mode']} {statistics.median(ours['seconds']) * 1e3:.0f} ms vs "
                f"{theirs['mode']} {statistics.median(theirs['seconds']) * 1e3:.0f} ms = "
                f"{statistics.median(ours['seconds']) / statistics.median(theirs['seconds']):.2f}x"
                f"{' (spreads overlap)' if within else ''}"
            )
        print(f"  {fw} {model} {precision}: " + "; ".join(parts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--frameworks", default="torch,jax")
    p.add_argument("--models", default="llama,gemma")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--precisions", default="float32,autocast,bfloat16")
    p.add_argument("--hidden", type=int, help="hidden size (default: the device's)")
    p.add_argument("--layers", type=int, help="layers (default: the device's)")
    p.add_argument("--vocab", type=int, help="vocabulary (default: the device's)")
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--plot", help="PNG (default benchmarks/results/bench_step-DEVICE.png)")
    for hidden in ("child", "framework", "model", "precision", "mode", "impl"):
        p.add_argument(f"--{hidden}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    for name in ("frameworks", "models", "modes", "precisions"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    sz = size(args)
    todo = cases(args)
    print(f"{len(todo)} cases x {args.processes} processes; sizes: " + ", ".join(f"{k} {v}" for k, v in sz.items()))
    results = []
    for c in todo:
        flags = [f"--{k}={v}" for k, v in c.items()] + [f"--device={args.device}", f"--steps={args.steps}", "--child=1"]
        flags += [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "vocab") if getattr(args, k)]
        runs = []
        for _ in range(args.processes):
            runs.append(common.run_child(__file__, flags, env=dict(os.environ, PYTHONWARNINGS="ignore")))
        results.append({**c, **{k: [r[k] for r in runs] for k in runs[0]}})
        r = results[-1]
        print(
            f"  {label(c)} {c['impl']}: {common.spread(r['seconds'], 1e3)} ms, {common.spread(r['step_bytes'], 2**-20, 0)} MiB",
            flush=True,
        )
    title = (
        f"training step on {args.device}: "
        + ", ".join(f"{k} {v}" for k, v in sz.items())
        + f"; medians over {args.processes} processes"
    )
    print(f"\n{title}")
    report(results, args)
    if args.plot != "none":
        plot(results, title, Path(args.plot) if args.plot else RESULTS / f"bench_step-{args.device}.png")


if __name__ == "__main__":
    main()
