"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax
is imported): fuselet.jax's vocab-parallel fused_linear_logprobs and fused_linear_grpo_loss with
its entropies, the head sharded on V over "model" of meshes (data, model) of 8 CPU devices.

Prints one JSON object: for each case, the largest relative difference of every output
(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1 as 0 / 1) and every gradient from the
one-device call (max |got - expected| / max |expected|, per array), the collectives of the
compiled HLO and the head gradient's sharding. tests/jax/test_vocab_parallel_logprobs.py checks
the numbers.
"""

from __future__ import annotations

import json
import os
import re

assert "xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", ""), "set XLA_FLAGS first"

import fuselet.jax as fj  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import shard_map  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from tests.jax.vocab_parallel_child import CHUNK, grpo_arrays, measured, mesh_of, rel_diff  # noqa: E402

OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
OPTIONS = {
    "plain": {},
    "scaled": {"temperature": 0.7, "logit_scale": 1.3, "softcap": 3.0, "ignore_index": 7},
    "entropy_only": {"outputs": ("entropy",)},
}


def all_gathers(hlo: str) -> list:
    """The shapes of the all-gathers' results, e.g. [[8, 4]]."""
    shapes = []
    for line in hlo.splitlines():
        m = re.search(r"= (\(?[^=]*?\)?) all-gather(?:-start)?\(", line)
        if m:
            shapes.extend([int(d) for d in dims.split(",") if d] for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1)))
    return shapes


def problem(v, n=32, h=16, seed=0, ignore_index=-100, integers=False):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, v, n)
    t[::6] = ignore_index
    t[1] = 7
    if integers:  # small integers: every device's matmul gives the one device's logits exactly
        hidden, weight = rng.integers(-2, 3, (n, h)).astype(np.float32), rng.integers(-2, 3, (v, h)).astype(np.float32)
        weight[[v - 3, 9]] = weight[3]  # classes 3, 9 and v - 3 tie for the largest logit (100 + ...)
        weight[:, 0] = 0.0
        weight[[3, 9, v - 3], 0] = 100.0
        hidden[2:, 0] = 1.0
        t[2:14] = [3, v - 3, 9, v - 3, 7, 3, v - 3, 0, v - 1, 3, 9, 3]
        bias = np.zeros(v, np.float32)
    else:
        hidden, weight, bias = rng.standard_normal((n, h)), rng.standard_normal((v, h)) * 0.4, rng.standard_normal(v) * 0.1
    return (
        jnp.asarray(hidden, jnp.float32),
        jnp.asarray(weight, jnp.float32),
        jnp.asarray(bias, jnp.float32),
        jnp.asarray(t, jnp.int32),
    )


def logprobs_case(mesh, v, opts, bias=True, constrain=False, n=32, integers=False) -> dict:
    """jit(value_and_grad) of sum(g1 log_probs + g2 entropy), the statistics as aux, with hidden and
    target sharded on "data", weight and bias on "model" (V divisible: device_put; else sharding
    constraints inside jit, XLA padding the last blocks), against the one-device call."""
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    h, w, b, t = problem(v, n=n, ignore_index=opts.get("ignore_index", -100), integers=integers)
    rng = np.random.default_rng(1)
    g1, g2 = (jnp.asarray(rng.standard_normal(n), jnp.float32) for _ in range(2))
    kw = {"outputs": OUTPUTS, **opts}

    def f(h, w, b, t):
        out = fj.fused_linear_logprobs(h, w, t, bias=b if bias else None, chunk_size=CHUNK, **kw)
        loss = jnp.sum(out.log_probs * g1) + (0.0 if out.entropy is None else jnp.sum(out.entropy * g2))
        return loss, tuple(jnp.asarray(x, jnp.float32) for x in out if x is not None)

    vg = jax.value_and_grad(f, argnums=(0, 1, 2) if bias else (0, 1), has_aux=True)
    expected = jax.jit(vg)(h, w, b, t)
    shardings = (s("data", None), s("model", None), s("model"), s("data"))
    if constrain:
        fn = jax.jit(lambda *a: vg(*(jax.lax.with_sharding_constraint(x, sh) for x, sh in zip(a, shardings))))
        args = (h, w, b, t)
    else:
        fn = jax.jit(vg)
        args = tuple(jax.device_put(x, sh) for x, sh in zip((h, w, b, t), shardings))
    return measured(fn, args, expected) | {
        "top1_count": int(np.sum(np.asarray(expected[0][1][-1]))) if "is_top1" in kw["outputs"] else None,
    }


def logprobs_cases() -> dict:
    out = {}
    for shape in ((1, 2), (1, 4), (2, 4), (8, 1)):
        for name in OPTIONS if shape == (2, 4) else ("scaled",):
            out[f"logprobs/{shape[0]}x{shape[1]}/{name}"] = logprobs_case(mesh_of(shape), 64, OPTIONS[name])
    mesh = mesh_of((2, 4))
    out["logprobs/2x4/no_bias"] = logprobs_case(mesh, 64, OPTIONS["scaled"], bias=False)
    out["logprobs/2x4/top1_ties"] = logprobs_case(mesh, 64, {}, integers=True)
    out["logprobs/2x4/v1001"] = logprobs_case(mesh, 1001, OPTIONS["scaled"], constrain=True)
    out["logprobs/2x4/tokens_uneven"] = logprobs_case(mesh, 64, OPTIONS["scaled"], constrain=True, n=30)
    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    out["logprobs/explicit/scaled"] = logprobs_case(explicit, 64, OPTIONS["scaled"])
    return out


def axis_name_cases() -> dict:
    """The axis_name= form inside the caller's shard_map over (data 2, model 4), the tokens over
    "data": sum(g1 log_probs + g2 entropy) psum'ed over "data" and every output, against the
    one-device call; V 64, and V 1001 in blocks padded with NaN (vocab_size=1001)."""
    mesh = mesh_of((2, 4))
    out = {}
    kw = {"outputs": OUTPUTS, **OPTIONS["scaled"]}
    for v, vocab_size in ((64, None), (1001, 1001)):
        h, w, b, t = problem(v, ignore_index=7)
        rng = np.random.default_rng(1)
        g1, g2 = (jnp.asarray(rng.standard_normal(32), jnp.float32) for _ in range(2))
        pad = 4 * -(-v // 4) - v
        wp, bp = jnp.pad(w, ((0, pad), (0, 0)), constant_values=jnp.nan), jnp.pad(b, (0, pad), constant_values=jnp.nan)

        def loss_of(out, g1, g2):
            stats = tuple(jnp.asarray(x, jnp.float32) for x in out)
            return jnp.sum(out.log_probs * g1) + jnp.sum(out.entropy * g2), stats

        def local(h, w, b, t, g1, g2, vocab_size=vocab_size):
            got = fj.fused_linear_logprobs(h, w, t, bias=b, chunk_size=CHUNK, axis_name="model", vocab_size=vocab_size, **kw)
            loss, stats = loss_of(got, g1, g2)
            return jax.lax.psum(loss, "data"), stats

        specs = (P("data", None), P("model", None), P("model"), P("data"), P("data"), P("data"))
        sm = shard_map(local, mesh=mesh, in_specs=specs, out_specs=(P(), (P("data"),) * (1 + len(OUTPUTS))))
        got = jax.jit(jax.value_and_grad(sm, argnums=(0, 1, 2), has_aux=True))(h, wp, bp, t, g1, g2)
        got = (got[0], (got[1][0], got[1][1][:v], got[1][2][:v]))

        def ref(h, w, b, t, g1, g2):
            return loss_of(fj.fused_linear_logprobs(h, w, t, bias=b, chunk_size=CHUNK, **kw), g1, g2)

        expected = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2), has_aux=True))(h, w, b, t, g1, g2)
        out[f"axis_name/v{v}"] = {"rel_diff": rel_diff(got, expected)}
    return out


GRPO_OPTIONS = {
    "entropy_coef": {"entropy_coef": 0.05, "beta": 0.1},
    "top_entropy_quantile": {"top_entropy_quantile": 0.4, "temperature": 0.8},
    "both": {"entropy_coef": 0.1, "top_entropy_quantile": 0.6, "temperature": 1.2, "beta": 0.1},
}


def grpo_case(opts) -> dict:
    """fused_linear_grpo_loss with its entropies over a head sharded on "model", sequences on
    "data", mesh 2 x 4: the loss, hidden's and the head's gradients, and the per-token outputs."""
    mesh = mesh_of((2, 4))
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    arrays = grpo_arrays(np.random.default_rng(4), 0.7, 0.5, bias=True)
    specs = {n: s("model", None) if n == "weight" else s("model") if n == "bias" else s("data") for n in arrays}
    names = tuple(arrays)

    def f(*a):
        loss, per_token = fj.fused_linear_grpo_loss(**dict(zip(names, a)), chunk_size=CHUNK, return_per_token=True, **opts)
        return loss, tuple(per_token)

    vg = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)
    expected = jax.jit(vg)(*arrays.values())
    args = [jax.device_put(arrays[n], specs[n]) for n in names]
    return measured(jax.jit(vg), args, expected, all_gathers=all_gathers)


def main():
    out = logprobs_cases()
    out.update(axis_name_cases())
    for name, opts in GRPO_OPTIONS.items():
        out[f"grpo/{name}"] = grpo_case(opts)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
