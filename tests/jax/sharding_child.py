"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax
is imported): fuselet.jax norms under jax.jit with sharded inputs and under shard_map.

Prints one JSON object: for each case, the collectives of the compiled HLO of the forward
and of jax.grad, whether the output sharding equals x's, and the largest difference from
the unsharded result. tests/jax/test_sharding.py runs it and checks the numbers.
"""

from __future__ import annotations

import functools
import json
import os
import re

assert "xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", ""), "set XLA_FLAGS first"

import fuselet.jax as fj  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(hlo: str) -> dict:
    return {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in COLLECTIVES}


def norm_fn(norm):
    if norm == "rms_norm":
        return lambda x, w, b: fj.rms_norm(x, w)
    return lambda x, w, b: fj.layer_norm(x, w, b)


def grad_fn(f):
    return jax.grad(lambda x, w, b, dy: jnp.sum(f(x, w, b).astype(jnp.float32) * dy), argnums=(0, 1, 2))


def max_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64))))
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def inputs(shape, dtype, param_dtype):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    dy = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    w = jnp.asarray(1 + 0.5 * rng.standard_normal(shape[-1]), param_dtype)
    b = jnp.asarray(0.5 * rng.standard_normal(shape[-1]), param_dtype)
    return x, w, b, dy


def measure(f, g, fargs, dy, x_sharding, expected) -> dict:
    """Compiles and runs jit(f)(*fargs) and jit(g)(*fargs, dy); `expected`: (y, grads) unsharded."""
    jf, jg = jax.jit(f), jax.jit(g)
    y, grads = jf(*fargs), jg(*fargs, dy)
    return {
        "fwd": collectives(jf.lower(*fargs).compile().as_text()),
        "grad": collectives(jg.lower(*fargs, dy).compile().as_text()),
        "y_sharding_is_x": y.sharding.is_equivalent_to(x_sharding, y.ndim),
        "dx_sharding_is_x": grads[0].sharding.is_equivalent_to(x_sharding, y.ndim),
        "max_diff": max(max_diff(y, expected[0]), max_diff(grads, expected[1])),
    }


def jit_case(norm, mesh, spec, shape, dtype="float32", param_dtype="float32") -> dict:
    x, w, b, dy = inputs(shape, dtype, param_dtype)
    f, g = norm_fn(norm), grad_fn(norm_fn(norm))
    expected = f(x, w, b), g(x, w, b, dy)  # unsharded, one device
    sharded, replicated = NamedSharding(mesh, spec), NamedSharding(mesh, P())
    args = (jax.device_put(x, sharded), jax.device_put(w, replicated), jax.device_put(b, replicated))
    return measure(f, g, args, jax.device_put(dy, sharded), sharded, expected)


def shard_map_case(norm, mesh, shape) -> dict:
    x, w, b, dy = inputs(shape, "float32", "float32")
    f = norm_fn(norm)
    sm = jax.shard_map(f, mesh=mesh, in_specs=(P("data", None), P(), P()), out_specs=P("data", None))
    sharded = NamedSharding(mesh, P("data", None))
    expected = f(x, w, b), grad_fn(f)(x, w, b, dy)
    args = (jax.device_put(x, sharded), w, b)
    return measure(sm, grad_fn(sm), args, jax.device_put(dy, sharded), sharded, expected)


def eager_case(norm, mesh, shape) -> dict:
    """An eager call (no jit) with x row-sharded and uncommitted parameters (plain jnp arrays)."""
    x, w, b, _ = inputs(shape, "float32", "float32")
    y = norm_fn(norm)(jax.device_put(x, NamedSharding(mesh, P("data", None))), w, b)
    return {
        "y_sharding_is_x": y.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), y.ndim),
        "max_diff": max_diff(y, norm_fn(norm)(x, w, b)),
    }


def add_rms_fn(x, r, w):
    y, h = fj.add_rms_norm(x, r, w)
    return y + h


def add_rms_case(mesh, spec, shape, shard_map=False) -> dict:
    """fj.add_rms_norm with x and residual sharded alike (jit, or shard_map over the rows)."""
    x, w, _, dy = inputs(shape, "float32", "float32")
    r = x[::-1] * 0.5
    g = jax.grad(lambda x, r, w, dy: jnp.sum(add_rms_fn(x, r, w) * dy), argnums=(0, 1, 2))
    expected = add_rms_fn(x, r, w), g(x, r, w, dy)
    sharded = NamedSharding(mesh, spec)
    f = add_rms_fn
    if shard_map:
        f = jax.shard_map(add_rms_fn, mesh=mesh, in_specs=(spec, spec, P()), out_specs=spec)
        g = jax.grad(lambda x, r, w, dy: jnp.sum(f(x, r, w) * dy), argnums=(0, 1, 2))
    args = (jax.device_put(x, sharded), jax.device_put(r, sharded), jax.device_put(w, NamedSharding(mesh, P())))
    return measure(f, g, args, jax.device_put(dy, sharded), sharded, expected)


def glu_case(mesh, spec, shape, shard_map=False) -> dict:
    """fj.swiglu with x sharded by `spec` (jit, or shard_map)."""
    x, _, _, _ = inputs(shape, "float32", "float32")
    dy = jnp.asarray(np.random.default_rng(1).standard_normal((*shape[:-1], shape[-1] // 2)), jnp.float32)
    f = fj.swiglu
    if shard_map:
        f = jax.shard_map(fj.swiglu, mesh=mesh, in_specs=(spec,), out_specs=spec)
    g = jax.grad(lambda x, dy: jnp.sum(f(x) * dy), argnums=(0,))
    expected = fj.swiglu(x), jax.grad(lambda x, dy: jnp.sum(fj.swiglu(x) * dy), argnums=(0,))(x, dy)
    sharded = NamedSharding(mesh, spec)
    return measure(f, g, (jax.device_put(x, sharded),), jax.device_put(dy, sharded), sharded, expected)


def softmax_case(mesh, spec, shape, causal) -> dict:
    """fj.softmax with x [B, H, Q, K] sharded by `spec` under jit."""
    x, _, _, dy = inputs(shape, "float32", "float32")
    f = functools.partial(fj.softmax, scale=0.5, causal=causal)
    g = jax.grad(lambda x, dy: jnp.sum(f(x) * dy), argnums=(0,))
    expected = f(x), g(x, dy)
    sharded = NamedSharding(mesh, spec)
    return measure(f, g, (jax.device_put(x, sharded),), jax.device_put(dy, sharded), sharded, expected)


def cross_entropy_case(mesh, spec, shape) -> dict:
    """fj.cross_entropy with logits [..., V] row-sharded by `spec` (target like its rows) under jit:
    the collectives of the per-token loss, of the reduced (mean) loss and of its gradient."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape) * 2, jnp.float32)
    t = jnp.asarray(rng.integers(0, shape[-1], shape[:-1]), jnp.int32).at[..., ::3].set(-100)
    per_token = functools.partial(fj.cross_entropy, reduction="none", z_loss=1e-3)
    reduced = functools.partial(fj.cross_entropy, z_loss=1e-3, return_z_loss=True)
    grad = jax.grad(lambda x, t: fj.cross_entropy(x, t, label_smoothing=0.1))
    expected = per_token(x, t), reduced(x, t), grad(x, t)
    xs, ts = NamedSharding(mesh, spec), NamedSharding(mesh, P(*spec[:-1]))
    args = jax.device_put(x, xs), jax.device_put(t, ts)
    fns = {"fwd": jax.jit(per_token), "reduced": jax.jit(reduced), "grad": jax.jit(grad)}
    out = {name: collectives(f.lower(*args).compile().as_text()) for name, f in fns.items()}
    results = {name: f(*args) for name, f in fns.items()}
    out["loss_sharding_is_target"] = results["fwd"].sharding.is_equivalent_to(ts, len(shape) - 1)
    out["dx_sharding_is_x"] = results["grad"].sharding.is_equivalent_to(xs, len(shape))
    out["max_diff"] = max(max_diff(results[k], e) for k, e in zip(("fwd", "reduced", "grad"), expected))
    return out


def main():
    mesh = jax.make_mesh((8,), ("data",))
    mesh2 = jax.make_mesh((2, 4), ("a", "b"))
    out = {}
    for norm in ("rms_norm", "layer_norm"):
        out[f"{norm}/rows"] = jit_case(norm, mesh, P("data", None), (16, 64))
        out[f"{norm}/rows_2d_mesh"] = jit_case(norm, mesh2, P("a", "b", None), (4, 8, 64))
        out[f"{norm}/rows_bf16_x_f32_params"] = jit_case(norm, mesh, P("data", None), (16, 64), "bfloat16")
        out[f"{norm}/hidden"] = jit_case(norm, mesh, P(None, "data"), (16, 64))
        out[f"{norm}/rows_and_hidden"] = jit_case(norm, mesh2, P("a", "b"), (16, 64))
        out[f"{norm}/shard_map"] = shard_map_case(norm, mesh, (16, 64))
        out[f"{norm}/eager_uncommitted_params"] = eager_case(norm, mesh, (16, 64))
    out["add_rms_norm/rows"] = add_rms_case(mesh, P("data", None), (16, 64))
    out["add_rms_norm/rows_2d_mesh"] = add_rms_case(mesh2, P("a", "b", None), (4, 8, 64))
    out["add_rms_norm/shard_map"] = add_rms_case(mesh, P("data", None), (16, 64), shard_map=True)
    out["swiglu/rows"] = glu_case(mesh, P("data", None), (16, 64))
    out["swiglu/rows_2d_mesh"] = glu_case(mesh2, P("a", "b", None), (4, 8, 64))
    out["swiglu/shard_map"] = glu_case(mesh, P("data", None), (16, 64), shard_map=True)
    out["swiglu/hidden"] = glu_case(mesh, P(None, "data"), (16, 64))
    for causal in (False, True):
        name = "causal" if causal else "plain"
        out[f"softmax/{name}/rows"] = softmax_case(mesh2, P("a", "b", None, None), (2, 4, 6, 8), causal)
        out[f"softmax/{name}/queries"] = softmax_case(mesh, P(None, None, "data", None), (1, 2, 16, 8), causal)
    out["cross_entropy/rows"] = cross_entropy_case(mesh, P("data", None), (16, 64))
    out["cross_entropy/rows_2d_mesh"] = cross_entropy_case(mesh2, P("a", "b", None), (4, 8, 64))
    out["cross_entropy/vocab"] = cross_entropy_case(mesh, P(None, "data"), (16, 64))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
