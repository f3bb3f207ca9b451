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


def gated_fn(x, z, w):
    return fj.gated_rms_norm(x, z, w, group_size=16)


def pair_case(fn, mesh, spec, shape, shard_map=False) -> dict:
    """fn(x, r, w) (fj.add_rms_norm: r the residual; fj.gated_rms_norm: r the gate) with x and r
    sharded alike (jit, or shard_map over the rows)."""
    x, w, _, dy = inputs(shape, "float32", "float32")
    r = x[::-1] * 0.5
    g = jax.grad(lambda x, r, w, dy: jnp.sum(fn(x, r, w) * dy), argnums=(0, 1, 2))
    expected = fn(x, r, w), g(x, r, w, dy)
    sharded = NamedSharding(mesh, spec)
    f = fn
    if shard_map:
        f = jax.shard_map(fn, mesh=mesh, in_specs=(spec, spec, P()), out_specs=spec)
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


def _sequences(seed=0, b=8, t=4, h=8, v=24):
    """hidden [b, t, h] (rows: sequences) through a [v, h] head and bias, target with a prompt
    and padding, a reference model's hidden and head, per-sequence and per-token extras."""
    rng = np.random.default_rng(seed)
    target = rng.integers(0, v, (b, t))
    target[:, 0] = -100
    target[1, -1] = -100
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    return {
        "hidden": f32(rng.standard_normal((b, t, h)) * 0.5),
        "weight": f32(rng.standard_normal((v, h)) * 0.3),
        "bias": f32(rng.standard_normal(v) * 0.1),
        "target": jnp.asarray(target, jnp.int32),
        "ref_hidden": f32(rng.standard_normal((b, t, 6)) * 0.5),
        "ref_weight": f32(rng.standard_normal((v, 6)) * 0.3),
        "preference_labels": jnp.asarray(rng.integers(0, 2, b), bool),
        "advantages": f32(rng.standard_normal(b)),
        "old_logps": f32(-rng.random((b, t)) * 3),
        "ref_logps": f32(-rng.random((b, t)) * 3),
    }


HEADS = ("weight", "bias", "ref_weight", "student_weight", "teacher_weight")


def loss_case(mesh, fn, arrays, grads, may_refuse=False) -> dict:
    """jit(value_and_grad(fn)) over `arrays` with every array's leading (row) dim sharded on
    mesh's "data" axis but the heads' (replicated), against the unsharded call: the collectives of
    the compiled HLO, the gradients whose sharding differs from their array's, the largest
    difference. may_refuse: an error of the call is the result ({"refused": its type and start}),
    for meshes of Explicit axes, whose sharding type checks may refuse a computation."""
    names = list(arrays)
    vg = jax.value_and_grad(lambda *a: fn(**dict(zip(names, a))), argnums=tuple(names.index(n) for n in grads))
    specs = {n: NamedSharding(mesh, P() if n in HEADS else P("data")) for n in names}
    args = [jax.device_put(a, specs[n]) for n, a in arrays.items()]
    try:
        compiled = jax.jit(vg).lower(*args).compile()
    except Exception as e:
        if not may_refuse:
            raise
        return {"refused": f"{type(e).__name__}: {str(e)[:80]}"}
    got, expected = compiled(*args), jax.jit(vg)(*arrays.values())
    return {
        "grad": collectives(compiled.as_text()),
        "resharded_grads": [n for n, g in zip(grads, got[1]) if not g.sharding.is_equivalent_to(specs[n], g.ndim)],
        "max_diff": max_diff(got, expected),
    }


def losses() -> dict:
    """{name: (fn, arrays, the names of the arrays whose gradients are compared)}: the post-training
    losses, fused_linear_jsd and the divergences over rows (sequences or tokens) of 8."""
    seq = _sequences()
    policy = {n: seq[n] for n in ("hidden", "weight", "bias", "target")}
    reference = {"ref_hidden": seq["ref_hidden"], "ref_weight": seq["ref_weight"]}
    params = ("hidden", "weight", "bias")
    cases = {}
    # dpo's tokens in chunks of 5 that straddle the devices' rows (4 tokens each); kto's and
    # grpo's in one chunk (the default at this size)
    fn = functools.partial(fj.fused_linear_preference_loss, loss="dpo", label_smoothing=0.1, chunk_size=5)
    cases["preference/dpo"] = fn, {**policy, **reference}, params
    # DPO's other loss types summed: aot's sort over the pairs, ld_alpha's split of each pair
    mpo = dict(loss=["aot", "sigmoid_norm", "sft"], loss_weights=[1.0, 0.5, 0.2], ld_alpha=0.5)
    fn = functools.partial(fj.fused_linear_preference_loss, chunk_size=5, **mpo)
    cases["preference/mpo"] = fn, {**policy, **reference}, params
    fn = functools.partial(fj.fused_linear_kto_loss, kl=0.1)
    cases["kto"] = fn, {**policy, **reference, "preference_labels": seq["preference_labels"]}, params
    grpo = {n: seq[n] for n in ("advantages", "old_logps", "ref_logps")}
    cases["grpo"] = functools.partial(fj.fused_linear_grpo_loss, beta=0.1), {**policy, **grpo}, params
    rng = np.random.default_rng(1)
    labels = jnp.asarray(rng.integers(0, 24, (8, 4)), jnp.int32).at[0, :3].set(-100)
    students = {
        "student_hidden": jnp.asarray(rng.standard_normal((8, 4, 8)), jnp.float32),
        "student_weight": jnp.asarray(rng.standard_normal((24, 8)) * 0.3, jnp.float32),
        "teacher_hidden": jnp.asarray(rng.standard_normal((8, 4, 6)), jnp.float32),
        "teacher_weight": jnp.asarray(rng.standard_normal((24, 6)) * 0.3, jnp.float32),
    }
    fn = functools.partial(fj.fused_linear_jsd, beta=0.3, temperature=2.0, chunk_size=5)
    student = ("student_hidden", "student_weight")
    cases["fused_linear_jsd"] = fn, {**students, "labels": labels}, student
    logq = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((8, 4, 24)), jnp.float32))
    logp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((8, 4, 24)), jnp.float32))
    pair, both = {"input": logq, "target": logp}, ("input", "target")
    cases["kl_div/batchmean"] = functools.partial(fj.kl_div, log_target=True), pair, both
    cases["jsd"] = functools.partial(fj.jsd, beta=0.3), {**pair, "labels": labels}, both
    cases["tvd"] = fj.tvd, {**pair, "labels": labels}, both
    return cases


def loss_cases() -> dict:
    """Each of losses() on a mesh of Auto axes (computed), and of Explicit axes (jax.make_mesh's
    default: computed or refused)."""
    auto = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    explicit = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    out = {}
    for name, (fn, arrays, grads) in losses().items():
        out[f"{name}/auto"] = loss_case(auto, fn, arrays, grads)
        out[f"{name}/explicit"] = loss_case(explicit, fn, arrays, grads, may_refuse=True)
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
    for name, fn in (("add_rms_norm", add_rms_fn), ("gated_rms_norm", gated_fn)):
        out[f"{name}/rows"] = pair_case(fn, mesh, P("data", None), (16, 64))
        out[f"{name}/rows_2d_mesh"] = pair_case(fn, mesh2, P("a", "b", None), (4, 8, 64))
        out[f"{name}/shard_map"] = pair_case(fn, mesh, P("data", None), (16, 64), shard_map=True)
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
    out.update(loss_cases())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
