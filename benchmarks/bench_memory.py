"""What each fuselet op keeps for the backward, against the unfused expression it replaces:
the bytes autograd holds between forward and backward, per element of x (per token for the
losses), through the torch and the jax layer, float32 and bfloat16.

torch: every tensor packed by torch.autograd.graph.saved_tensors_hooks during the forward.
jax: the arrays among jax.tree_util.tree_leaves(vjp_fn) of jax.vjp over the differentiable
inputs (x, weight, bias, residual, hidden; cos / sin / target are closed over), the unfused
expression jitted as a user would run it. A saved tensor is counted once per storage (torch:
untyped_storage().data_ptr(), its nbytes; jax: unsafe_buffer_pointer(), nbytes), and split
into "inputs" (the storage of an input: x, a view of x, weight, target, ...; kept alive by the
graph but not allocated by the op) and "new" (everything else: the activation memory the op
adds, the op's own output included when it is kept). Ratios are fuselet / unfused; < 1:
fuselet keeps less. Weights require grad. Sizes are counted, not timed: every run gives the
same table, on any machine with these framework versions (the unfused peers' saves are
torch's and XLA's, CPU here; torch on CUDA may dispatch some peers to other kernels).

    python benchmarks/bench_memory.py [--framework torch|jax|all] [--device cpu|cuda] [--markdown]
                                      [--output PATH|none]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

DTYPES = ("float32", "bfloat16")
ROWS, H = 256, 1024  # norms and GLUs: x [ROWS, H] ([ROWS, 2H] for the GLUs)
SOFTMAX = (4, 8, 128, 128)  # [B, N, Q, K]
ROPE = (2, 128, 8, 64)  # [B, S, N, D] ("bshd"); cos / sin [S, D] in x's dtype
TOKENS, VOCAB = 512, 8192  # cross_entropy: logits [TOKENS, VOCAB]
FLCE = (1024, 256, 4096)  # fused_linear_cross_entropy: hidden [N, H], weight [V, H]
FLCE_SHAPE = f"N{FLCE[0]} H{FLCE[1]} V{FLCE[2]}"
SCALE = 0.125
RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = (
    "layer",
    "op",
    "dtype",
    "shape",
    "per",
    "fuselet inputs",
    "fuselet new",
    "unfused inputs",
    "unfused new",
    "new ratio",
    "total ratio",
)


@dataclass(frozen=True)
class Saved:
    """One saved storage: `owner` is the name of the input it belongs to, or "new"; `output`:
    it is (the storage of) one of the op's outputs."""

    owner: str
    shape: tuple
    dtype: str
    nbytes: int
    output: bool = False


@dataclass
class Case:
    layer: str
    op: str
    dtype: str
    shape: str
    per: str  # "elem" (of x) or "token"
    count: int  # elements of x, or tokens
    fuselet: list
    unfused: list


def gpt_oss_gate(x, clip, sigmoid, alpha: float = 1.702, limit: float = 7.0):
    """GPT-OSS's experts' gate as transformers writes it (GptOssExperts._apply_gate), the unfused
    peer of clamped_swiglu: x [..., 2F] interleaved; clip / sigmoid: torch.clip and torch.sigmoid,
    or jnp.clip and jax.nn.sigmoid."""
    g, u = clip(x[..., ::2], max=limit), clip(x[..., 1::2], min=-limit, max=limit)
    return g * sigmoid(alpha * g) * (u + 1)


def split(saved: list) -> tuple[int, int]:
    """(bytes of saved inputs, bytes of saved new tensors)."""
    inputs = sum(s.nbytes for s in saved if s.owner != "new")
    return inputs, sum(s.nbytes for s in saved) - inputs


# --- counting ----------------------------------------------------------------------------


def torch_saved(fn, inputs: dict) -> list:
    """The storages autograd saves while fn(**inputs) runs, each once, in the order first saved."""
    import torch

    owners = {t.untyped_storage().data_ptr(): name for name, t in inputs.items()}
    kept, hold = {}, []  # hold: no saved storage is freed (and its address reused) before the count ends

    def pack(t):
        hold.append(t)
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in kept:
            kept[ptr] = Saved(owners.get(ptr, "new"), tuple(t.shape), str(t.dtype).removeprefix("torch."), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(**inputs)
    outputs = {t.untyped_storage().data_ptr() for t in (out if isinstance(out, tuple) else (out,))}
    # an input saved through a view counts as the whole input
    return [
        Saved(s.owner, s.shape, s.dtype, s.nbytes, ptr in outputs)
        if s.owner == "new"
        else Saved(s.owner, tuple(inputs[s.owner].shape), s.dtype, inputs[s.owner].untyped_storage().nbytes())
        for ptr, s in kept.items()
    ]


def jax_saved(fn, inputs: dict, diff: tuple) -> list:
    """The residual arrays of jax.vjp of fn over the inputs named in diff (the others closed over)."""
    import jax

    owners = {a.unsafe_buffer_pointer(): name for name, a in inputs.items()}
    fixed = {n: a for n, a in inputs.items() if n not in diff}

    def f(*args):
        return fn(**dict(zip(diff, args)), **fixed)

    out, vjp_fn = jax.vjp(f, *(inputs[n] for n in diff))
    outputs = {a.unsafe_buffer_pointer() for a in jax.tree_util.tree_leaves(out)}
    kept = {}
    for leaf in jax.tree_util.tree_leaves(vjp_fn):
        if isinstance(leaf, jax.Array) and leaf.unsafe_buffer_pointer() not in kept:
            ptr = leaf.unsafe_buffer_pointer()
            kept[ptr] = Saved(owners.get(ptr, "new"), tuple(leaf.shape), str(leaf.dtype), int(leaf.nbytes), ptr in outputs)
    return list(kept.values())


# --- the cases ---------------------------------------------------------------------------


def _shape(*dims) -> str:
    return "x".join(map(str, dims))


def torch_cases(dtype_name: str, device: str = "cpu") -> list:
    import fuselet.torch as ft
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)

    def t(*s, grad=True):
        return torch.randn(*s, generator=gen, dtype=dtype).to(device).requires_grad_(grad)

    def ids(n, v):
        return torch.randint(0, v, (n,), generator=gen).to(device)

    def rotate_half(q):  # transformers' apply_rotary_pos_emb, tables unsqueezed over the heads
        q1, q2 = q.chunk(2, -1)
        return torch.cat((-q2, q1), -1)

    def add_rms_unfused(x, residual, weight):
        out = x + residual
        return F.rms_norm(out, (H,), weight, 1e-6), out

    def gated_unfused(x, z, weight):  # Qwen3-Next's RMSNormGated, as transformers writes it
        return (F.rms_norm(x, (H,), weight, 1e-6) * F.silu(z.float())).to(x.dtype)

    def glu(act):
        def f(x):
            g, u = x.chunk(2, -1)
            return act(g) * u

        return f

    def clamped_unfused(x):
        return gpt_oss_gate(x, torch.clip, torch.sigmoid)

    def causal_unfused(x):
        q, k = x.shape[-2:]
        mask = torch.ones(q, k, dtype=torch.bool, device=x.device).tril(k - q)
        return torch.softmax((x * SCALE).masked_fill(~mask, -math.inf), -1)

    def jsd_unfused(input, target, beta=0.5):  # TRL's generalized JSD: a logsumexp mixture
        x, t = input.float(), target.float()
        mix = torch.logsumexp(torch.stack([x + math.log(1 - beta), t + math.log(beta)]), dim=0)
        per = beta * F.kl_div(mix, t, reduction="none", log_target=True)
        per = per + (1 - beta) * F.kl_div(mix, x, reduction="none", log_target=True)
        return per.sum(-1).mean()

    n, h, v = FLCE
    b, s, heads, d = ROPE
    specs = [
        (
            "rms_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), weight=t(H)),
            lambda x, weight: ft.rms_norm(x, weight, 1e-6),
            lambda x, weight: F.rms_norm(x, (H,), weight, 1e-6),
        ),
        (
            "layer_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), weight=t(H), bias=t(H)),
            lambda x, weight, bias: ft.layer_norm(x, weight, bias),
            lambda x, weight, bias: F.layer_norm(x, (H,), weight, bias),
        ),
        (
            "add_rms_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), residual=t(ROWS, H), weight=t(H)),
            lambda x, residual, weight: ft.add_rms_norm(x, residual, weight),
            add_rms_unfused,
        ),
        (
            "gated_rms_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), z=t(ROWS, H), weight=t(H)),
            lambda x, z, weight: ft.gated_rms_norm(x, z, weight),
            gated_unfused,
        ),
        ("swiglu", _shape(ROWS, 2 * H), "elem", lambda: dict(x=t(ROWS, 2 * H)), ft.swiglu, glu(F.silu)),
        (
            "geglu tanh",
            _shape(ROWS, 2 * H),
            "elem",
            lambda: dict(x=t(ROWS, 2 * H)),
            lambda x: ft.geglu(x, "tanh"),
            glu(lambda g: F.gelu(g, approximate="tanh")),
        ),
        (
            "clamped_swiglu",
            _shape(ROWS, 2 * H),
            "elem",
            lambda: dict(x=t(ROWS, 2 * H)),
            lambda x: ft.clamped_swiglu(x, interleaved=True),
            clamped_unfused,
        ),
        ("softmax", _shape(*SOFTMAX), "elem", lambda: dict(x=t(*SOFTMAX)), ft.softmax, lambda x: torch.softmax(x, -1)),
        (
            "softmax causal",
            _shape(*SOFTMAX),
            "elem",
            lambda: dict(x=t(*SOFTMAX)),
            lambda x: ft.softmax(x, SCALE, causal=True),
            causal_unfused,
        ),
        (
            "rope",
            _shape(*ROPE),
            "elem",
            lambda: dict(x=t(*ROPE), cos=t(s, d, grad=False), sin=t(s, d, grad=False)),
            ft.rope,
            lambda x, cos, sin: x * cos[:, None] + rotate_half(x) * sin[:, None],
        ),
        (
            "cross_entropy",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(logits=t(TOKENS, VOCAB), target=ids(TOKENS, VOCAB)),
            ft.cross_entropy,
            lambda logits, target: F.cross_entropy(logits, target),
        ),
        (
            "kl_div",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(input=t(TOKENS, VOCAB), target=t(TOKENS, VOCAB, grad=False)),
            lambda input, target: ft.kl_div(input, target, log_target=True),
            lambda input, target: F.kl_div(input.float(), target.float(), reduction="batchmean", log_target=True),
        ),
        (
            "jsd",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(input=t(TOKENS, VOCAB), target=t(TOKENS, VOCAB, grad=False)),
            lambda input, target: ft.jsd(input, target, beta=0.5),
            jsd_unfused,
        ),
        (
            "tvd",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(input=t(TOKENS, VOCAB), target=t(TOKENS, VOCAB, grad=False)),
            ft.tvd,
            lambda input, target: (0.5 * (target.float().exp() - input.float().exp()).abs().sum(-1)).mean(),
        ),
    ]
    for reduction in ("mean", "none"):
        specs.append(
            (
                f"fused_linear_cross_entropy {reduction}",
                FLCE_SHAPE,
                "token",
                lambda: dict(hidden=t(n, h), weight=t(v, h), target=ids(n, v)),
                lambda hidden, weight, target, r=reduction: ft.fused_linear_cross_entropy(hidden, weight, target, reduction=r),
                lambda hidden, weight, target, r=reduction: F.cross_entropy(hidden @ weight.T, target, reduction=r),
            )
        )

    def logprobs_unfused(hidden, weight, target):
        logp = torch.log_softmax((hidden @ weight.T).float(), -1)
        return logp.gather(-1, target[:, None])[:, 0], -(logp.exp() * logp).sum(-1)

    specs.append(
        (
            "fused_linear_logprobs entropy",
            FLCE_SHAPE,
            "token",
            lambda: dict(hidden=t(n, h), weight=t(v, h), target=ids(n, v)),
            lambda hidden, weight, target: tuple(ft.fused_linear_logprobs(hidden, weight, target, outputs=("entropy",))[:2]),
            logprobs_unfused,
        )
    )
    cases = []
    for op, shape, per, make, fused, unfused in specs:
        inputs = make()
        count = next(iter(inputs.values())).shape[0] if per == "token" else next(iter(inputs.values())).numel()
        cases.append(Case("torch", op, dtype_name, shape, per, count, torch_saved(fused, inputs), torch_saved(unfused, inputs)))
    return cases


def jax_cases(dtype_name: str, device: str = "cpu") -> list:
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.PRNGKey(0), 64))

    def t(*s):
        return jax.random.normal(next(keys), s, dtype_name)

    def rms(x, weight):  # bench_norm's reference
        xf = x.astype(jnp.float32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * weight

    def layer(x, weight, bias):
        xf = x.astype(jnp.float32)
        mu = jnp.mean(xf, -1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mu), -1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * weight + bias

    def add_rms_unfused(x, residual, weight):
        out = x + residual
        return rms(out, weight), out

    def gated_unfused(x, z, weight):
        return (rms(x, weight) * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)

    def glu(act):
        def f(x):
            g, u = jnp.split(x, 2, axis=-1)
            return act(g) * u

        return f

    def clamped_unfused(x):
        return gpt_oss_gate(x, jnp.clip, jax.nn.sigmoid)

    def causal_unfused(x):
        q, k = x.shape[-2:]
        mask = jnp.tril(jnp.ones((q, k), bool), k - q)
        return jax.nn.softmax(jnp.where(mask, x * SCALE, -jnp.inf), axis=-1)

    def rope_unfused(x, cos, sin):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return x * cos[:, None] + jnp.concatenate((-x2, x1), -1) * sin[:, None]

    def kl_unfused(input, target):  # torch's kl_div(log_target=True, "batchmean")
        x, t = input.astype(jnp.float32), target.astype(jnp.float32)
        return jnp.sum(jnp.exp(t) * (t - x)) / x.shape[0]

    def jsd_unfused(input, target, beta=0.5):
        x, t = input.astype(jnp.float32), target.astype(jnp.float32)
        mix = jnp.logaddexp(x + math.log(1 - beta), t + math.log(beta))
        per = beta * jnp.exp(t) * (t - mix) + (1 - beta) * jnp.exp(x) * (x - mix)
        return jnp.mean(jnp.sum(per, -1))

    def ce(logits, target, reduction="mean"):
        logp = jax.nn.log_softmax(logits, axis=-1)
        loss = -jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0]
        return jnp.mean(loss) if reduction == "mean" else loss

    n, h, v = FLCE
    b, s, heads, d = ROPE
    specs = [
        (
            "rms_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), weight=t(H)),
            ("x", "weight"),
            lambda x, weight: fj.rms_norm(x, weight, 1e-6),
            rms,
        ),
        (
            "layer_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), weight=t(H), bias=t(H)),
            ("x", "weight", "bias"),
            fj.layer_norm,
            layer,
        ),
        (
            "add_rms_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), residual=t(ROWS, H), weight=t(H)),
            ("x", "residual", "weight"),
            fj.add_rms_norm,
            add_rms_unfused,
        ),
        (
            "gated_rms_norm",
            _shape(ROWS, H),
            "elem",
            lambda: dict(x=t(ROWS, H), z=t(ROWS, H), weight=t(H)),
            ("x", "z", "weight"),
            fj.gated_rms_norm,
            gated_unfused,
        ),
        ("swiglu", _shape(ROWS, 2 * H), "elem", lambda: dict(x=t(ROWS, 2 * H)), ("x",), fj.swiglu, glu(jax.nn.silu)),
        (
            "geglu tanh",
            _shape(ROWS, 2 * H),
            "elem",
            lambda: dict(x=t(ROWS, 2 * H)),
            ("x",),
            lambda x: fj.geglu(x, "tanh"),
            glu(lambda g: jax.nn.gelu(g, approximate=True)),
        ),
        (
            "clamped_swiglu",
            _shape(ROWS, 2 * H),
            "elem",
            lambda: dict(x=t(ROWS, 2 * H)),
            ("x",),
            lambda x: fj.clamped_swiglu(x, interleaved=True),
            clamped_unfused,
        ),
        (
            "softmax",
            _shape(*SOFTMAX),
            "elem",
            lambda: dict(x=t(*SOFTMAX)),
            ("x",),
            fj.softmax,
            lambda x: jax.nn.softmax(x, axis=-1),
        ),
        (
            "softmax causal",
            _shape(*SOFTMAX),
            "elem",
            lambda: dict(x=t(*SOFTMAX)),
            ("x",),
            lambda x: fj.softmax(x, SCALE, causal=True),
            causal_unfused,
        ),
        ("rope", _shape(*ROPE), "elem", lambda: dict(x=t(*ROPE), cos=t(s, d), sin=t(s, d)), ("x",), fj.rope, rope_unfused),
        (
            "cross_entropy",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(logits=t(TOKENS, VOCAB), target=jax.random.randint(next(keys), (TOKENS,), 0, VOCAB)),
            ("logits",),
            fj.cross_entropy,
            ce,
        ),
        (
            "kl_div",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(input=t(TOKENS, VOCAB), target=t(TOKENS, VOCAB)),
            ("input",),
            lambda input, target: fj.kl_div(input, target, log_target=True),
            kl_unfused,
        ),
        (
            "jsd",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(input=t(TOKENS, VOCAB), target=t(TOKENS, VOCAB)),
            ("input",),
            lambda input, target: fj.jsd(input, target, beta=0.5),
            jsd_unfused,
        ),
        (
            "tvd",
            _shape(TOKENS, VOCAB),
            "token",
            lambda: dict(input=t(TOKENS, VOCAB), target=t(TOKENS, VOCAB)),
            ("input",),
            fj.tvd,
            lambda input, target: jnp.mean(
                0.5 * jnp.sum(jnp.abs(jnp.exp(target.astype(jnp.float32)) - jnp.exp(input.astype(jnp.float32))), -1)
            ),
        ),
    ]
    for reduction in ("mean", "none"):
        specs.append(
            (
                f"fused_linear_cross_entropy {reduction}",
                FLCE_SHAPE,
                "token",
                lambda: dict(hidden=t(n, h), weight=t(v, h), target=jax.random.randint(next(keys), (n,), 0, v)),
                ("hidden", "weight"),
                lambda hidden, weight, target, r=reduction: fj.fused_linear_cross_entropy(hidden, weight, target, reduction=r),
                lambda hidden, weight, target, r=reduction: ce(hidden @ weight.T, target, r),
            )
        )

    def logprobs_unfused(hidden, weight, target):
        logp = jax.nn.log_softmax((hidden @ weight.T).astype(jnp.float32), axis=-1)
        return jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0], -jnp.sum(jnp.exp(logp) * logp, -1)

    specs.append(
        (
            "fused_linear_logprobs entropy",
            FLCE_SHAPE,
            "token",
            lambda: dict(hidden=t(n, h), weight=t(v, h), target=jax.random.randint(next(keys), (n,), 0, v)),
            ("hidden", "weight"),
            lambda hidden, weight, target: tuple(fj.fused_linear_logprobs(hidden, weight, target, outputs=("entropy",))[:2]),
            logprobs_unfused,
        )
    )
    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    cases = []
    for op, shape, per, make, diff, fused, unfused in specs:
        inputs = {name: jax.device_put(a, dev) for name, a in make().items()}
        first = next(iter(inputs.values()))
        count = first.shape[0] if per == "token" else first.size
        cases.append(
            Case(
                "jax",
                op,
                dtype_name,
                shape,
                per,
                count,
                jax_saved(fused, inputs, diff),
                jax_saved(jax.jit(unfused), inputs, diff),
            )
        )
    return cases


def measure(layer: str, dtypes=DTYPES, device: str = "cpu") -> list:
    """Every case of one layer ("torch" or "jax"), dtype by dtype, the inputs on `device` (cpu, cuda)."""
    make = torch_cases if layer == "torch" else jax_cases
    return [case for dtype in dtypes for case in make(dtype, device)]


# --- the table ---------------------------------------------------------------------------


def _num(v: float) -> str:
    return f"{v:.3f}".rstrip("0").rstrip(".")


def _ratio(ours: int, theirs: int) -> str:
    if ours == theirs:
        return "1.00" if ours else "-"
    return "inf" if theirs == 0 else f"{ours / theirs:.2f}"


def cells(case: Case) -> list:
    """One row of the table, COLUMNS' cells as strings (bytes per element of x / per token)."""
    fi, fn = split(case.fuselet)
    ui, un = split(case.unfused)
    return [
        case.layer,
        case.op,
        case.dtype,
        case.shape,
        case.per,
        *(_num(b / case.count) for b in (fi, fn, ui, un)),
        _ratio(fn, un),
        _ratio(fi + fn, ui + un),
    ]


def text_table(cases: list) -> str:
    rows = [list(COLUMNS[1:])] + [cells(c)[1:] for c in cases]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def markdown_table(cases: list) -> str:
    """The table of docs/ops.md: one row per case, both layers."""
    head = "| " + " | ".join(COLUMNS) + " |"
    rule = "|" + "|".join("---" if i < 5 else "---:" for i in range(len(COLUMNS))) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(cells(c)) + " |" for c in cases)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["torch", "jax", "all"], default="all")
    parser.add_argument("--markdown", action="store_true", help="print the table of docs/ops.md instead of the text tables")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--output", help="where the text tables are written too (default: results/bench_memory-DEVICE.txt; 'none': nowhere)"
    )
    args = parser.parse_args()
    layers = ["torch", "jax"] if args.framework == "all" else [args.framework]
    results = {layer: measure(layer, device=args.device) for layer in layers}
    if args.markdown:
        print(markdown_table([c for cs in results.values() for c in cs]))
        return
    import importlib

    command = (
        "python benchmarks/bench_memory.py"
        + ("" if args.framework == "all" else f" --framework {args.framework}")
        + ("" if args.device == "cpu" else f" --device {args.device}")
    )
    parts = [
        f"# {command}" + "   (sizes counted, not timed: the same on every run with these framework versions)",
        "# bytes kept for the backward per element of x (per token for the losses); inputs: the storages of the "
        "op's inputs; new: the others; ratios fuselet / unfused",
    ]
    for layer, cases in results.items():
        mod = importlib.import_module(layer)
        parts += [
            "",
            f"{'PyTorch' if layer == 'torch' else 'JAX'} {mod.__version__}: fuselet.{layer} vs the unfused expression",
            text_table(cases),
        ]
    text = "\n".join(parts) + "\n"
    print(text, end="")
    if args.output != "none":
        Path(args.output or RESULTS / f"bench_memory-{args.device}.txt").write_text(text)


if __name__ == "__main__":
    main()
