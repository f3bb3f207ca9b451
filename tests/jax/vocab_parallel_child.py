"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax
is imported): fuselet.jax's vocab-parallel losses on meshes (data, model) of 8 CPU devices.

Prints one JSON object: for each case, the largest relative difference of the loss and of every
gradient from the one-device call (max |got - expected| / max |expected|, per array), the
collectives of the compiled HLO (counts and the all-reduces' shapes) and the gradients'
shardings. tests/jax/test_vocab_parallel.py runs it and checks the numbers.
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
from jax import shard_map  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

MESHES = ((1, 2), (1, 4), (2, 4), (8, 1))
OPTIONS = {
    "plain": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 4.0},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 4.0, "ignore_index": 7},
}
CHUNK = 5  # tokens per chunk: chunks straddle the devices' tokens (4 or 16 each)


def mesh_of(shape):
    return jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def all_reduces(hlo: str) -> list:
    """The shapes of the all-reduces' operands (a tuple: each element), e.g. [[5], [3, 5]]."""
    shapes = []
    for line in hlo.splitlines():
        m = re.search(r"= (\(?[^=]*?\)?) all-reduce(?:-start)?\(", line)
        if m:
            shapes.extend([int(d) for d in dims.split(",") if d] for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1)))
    return shapes


def counts(hlo: str) -> dict:
    return {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all")}


def rel_diff(got, expected) -> float:
    """The largest max |got - expected| / max |expected| over the arrays; inf where got has a NaN
    (or an inf) that expected has not."""
    out = 0.0
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        diff = np.where(same, 0.0, np.abs(a - e))
        if not np.all(np.isfinite(diff)):
            return float("inf")
        scale = np.max(np.abs(np.where(np.isfinite(e), e, 0.0))) if e.size else 0.0
        out = max(out, float(np.max(diff, initial=0.0)) / max(float(scale), 1e-30))
    return out


def measured(fn, args, expected, **more) -> dict:
    """fn (a jit of value_and_grad whose gradients are (hidden's, the head's, ...)) compiled for
    args and run: its relative difference from expected, its program's collectives and
    all-reduce shapes, the head gradient's sharding, and more (name: a function of the program's
    text)."""
    compiled = fn.lower(*args).compile()
    got = compiled(*args)
    hlo = compiled.as_text()
    return {
        "rel_diff": rel_diff(got, expected),
        "collectives": counts(hlo),
        "all_reduces": all_reduces(hlo),
        "dweight_spec": str(got[1][1].sharding.spec),
    } | {name: of(hlo) for name, of in more.items()}


def problem(v, n=32, h=16, seed=0, ignore_index=-100):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, v, n)
    t[::6] = ignore_index
    t[1] = 7  # a token of class 7 (ignored where ignore_index is 7)
    return (
        jnp.asarray(rng.standard_normal((n, h)), jnp.float32),
        jnp.asarray(rng.standard_normal((v, h)) * 0.4, jnp.float32),
        jnp.asarray(rng.standard_normal(v) * 0.1, jnp.float32),
        jnp.asarray(t, jnp.int32),
    )


def flce_case(shape, v, reduction, opts, bias=True, constrain=False) -> dict:
    """jit(value_and_grad) of fused_linear_cross_entropy with hidden and target sharded on "data",
    weight and bias on "model" (V divisible: device_put; else a sharding constraint inside jit,
    XLA padding the last blocks), against the one-device call."""
    mesh = mesh_of(shape)
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    h, w, b, t = problem(v, ignore_index=opts.get("ignore_index", -100))
    weights = jnp.asarray(np.random.default_rng(1).random(t.shape), jnp.float32)

    def f(h, w, b, t):
        loss = fj.fused_linear_cross_entropy(h, w, t, bias=b if bias else None, reduction=reduction, chunk_size=CHUNK, **opts)
        return jnp.sum(loss * weights) if reduction == "none" else loss

    vg = jax.value_and_grad(f, argnums=(0, 1, 2) if bias else (0, 1))
    expected = jax.jit(vg)(h, w, b, t)
    shardings = (s("data", None), s("model", None), s("model"), s("data"))
    out_shardings = (s(), (s("data", None), s("model", None), s("model"))[: 3 if bias else 2])
    if constrain:  # an uneven V: sharded inside jit (jit's own shardings must divide: the results replicated)
        fn = jax.jit(lambda *a: vg(*(jax.lax.with_sharding_constraint(x, sh) for x, sh in zip(a, shardings))))
        args = (h, w, b, t)
    else:
        fn = jax.jit(vg, out_shardings=out_shardings)
        args = tuple(jax.device_put(x, sh) for x, sh in zip((h, w, b, t), shardings))
    compiled = fn.lower(*args).compile()
    got = compiled(*args)
    hlo = compiled.as_text()
    return {
        "rel_diff": rel_diff(got, expected),
        "loss": float(got[0]),
        "collectives": counts(hlo),
        "all_reduces": all_reduces(hlo),
        "dweight_spec": str(got[1][1].sharding.spec),
    }


def flce_cases() -> dict:
    out = {}
    for shape in MESHES:
        for reduction in ("mean", "sum", "none"):
            names = OPTIONS if shape == (2, 4) else ("plain", "all")
            for name in names:
                out[f"flce/{shape[0]}x{shape[1]}/{reduction}/{name}"] = flce_case(shape, 64, reduction, OPTIONS[name])
    out["flce/2x4/mean/all/no_bias"] = flce_case((2, 4), 64, "mean", OPTIONS["all"], bias=False)
    for shape in ((1, 2), (1, 4), (2, 4)):
        for reduction in ("mean", "none"):
            out[f"flce/{shape[0]}x{shape[1]}/{reduction}/all/v1001"] = flce_case(
                shape, 1001, reduction, OPTIONS["all"], constrain=True
            )
    return out


def ce_case(shape, v, reduction, opts, constrain=False) -> dict:
    """jit(value_and_grad) of cross_entropy with logits [4, 8, V] sharded ("data", None, "model")."""
    mesh = mesh_of(shape)
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((4, 8, v)) * 3, jnp.float32)
    ignore_index = opts.get("ignore_index", -100)
    t = jnp.asarray(rng.integers(0, v, (4, 8)), jnp.int32).at[:, ::3].set(ignore_index).at[0, 1].set(7)
    weights = jnp.asarray(rng.random((4, 8)), jnp.float32)

    def f(x, t):
        loss = fj.cross_entropy(x, t, reduction=reduction, **opts)
        return jnp.sum(loss * weights) if reduction == "none" else loss

    vg = jax.value_and_grad(f)
    expected = jax.jit(vg)(x, t)
    xs, ts = s("data", None, "model"), s("data", None)
    if constrain:
        fn = jax.jit(lambda x, t: vg(jax.lax.with_sharding_constraint(x, xs), t))
        args = (x, t)
    else:
        fn = jax.jit(vg, out_shardings=(s(), xs))
        args = jax.device_put(x, xs), jax.device_put(t, ts)
    compiled = fn.lower(*args).compile()
    got = compiled(*args)
    hlo = compiled.as_text()
    return {"rel_diff": rel_diff(got, expected), "collectives": counts(hlo), "all_reduces": all_reduces(hlo)}


def ce_cases() -> dict:
    out = {}
    for shape in ((1, 2), (1, 4), (2, 4)):
        for reduction in ("mean", "sum", "none"):
            for name in ("plain", "all") if shape != (2, 4) else OPTIONS:
                out[f"ce/{shape[0]}x{shape[1]}/{reduction}/{name}"] = ce_case(shape, 64, reduction, OPTIONS[name])
        out[f"ce/{shape[0]}x{shape[1]}/mean/all/v1001"] = ce_case(shape, 1001, "mean", OPTIONS["all"], constrain=True)
    return out


def axis_name_cases() -> dict:
    """The axis_name= form inside the caller's shard_map over (data 2, model 4): the summed loss
    psum'ed over "data", against the one-device call; and vocab_size= over blocks padded by the
    caller (V 1001 in 4 blocks of 251)."""
    mesh = mesh_of((2, 4))
    out = {}
    opts = OPTIONS["all"]
    for v, vocab_size in ((64, None), (1001, 1001)):
        h, w, b, t = problem(v, ignore_index=7)
        pad = 4 * -(-v // 4) - v
        wp, bp = jnp.pad(w, ((0, pad), (0, 0)), constant_values=jnp.nan), jnp.pad(b, (0, pad), constant_values=jnp.nan)

        def local(h, w, b, t, vocab_size=vocab_size):
            loss = fj.fused_linear_cross_entropy(
                h, w, t, bias=b, reduction="sum", chunk_size=CHUNK, axis_name="model", vocab_size=vocab_size, **opts
            )
            return jax.lax.psum(loss, "data")

        specs = (P("data", None), P("model", None), P("model"), P("data"))
        sm = shard_map(local, mesh=mesh, in_specs=specs, out_specs=P())
        got = jax.jit(jax.value_and_grad(sm, argnums=(0, 1, 2)))(h, wp, bp, t)
        got = (got[0], (got[1][0], got[1][1][:v], got[1][2][:v]))
        ref = jax.value_and_grad(
            lambda h, w, b, t: fj.fused_linear_cross_entropy(h, w, t, bias=b, reduction="sum", **opts), argnums=(0, 1, 2)
        )
        out[f"axis_name/flce/v{v}"] = {"rel_diff": rel_diff(got, jax.jit(ref)(h, w, b, t))}
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((16, 64)) * 3, jnp.float32)
    t = jnp.asarray(rng.integers(0, 64, 16), jnp.int32).at[::4].set(7)

    def ce_local(x, t):
        return jax.lax.psum(fj.cross_entropy(x, t, reduction="sum", axis_name="model", **opts), "data")

    sm = shard_map(ce_local, mesh=mesh, in_specs=(P("data", "model"), P("data")), out_specs=P())
    got = jax.jit(jax.value_and_grad(sm))(x, t)
    ref = jax.jit(jax.value_and_grad(lambda x, t: fj.cross_entropy(x, t, reduction="sum", **opts)))(x, t)
    out["axis_name/ce/v64"] = {"rel_diff": rel_diff(got, ref)}
    return out


def grpo_arrays(rng, hidden_scale: float, weight_scale: float, bias: bool = False, b_=8, t_=4, h_=8, v=64) -> dict:
    """A GRPO case's float32 arrays from rng (each sequence's first token ignored): hidden
    [b_, t_, h_], weight [v, h_] (and bias [v]), target, advantages, old_logps and ref_logps."""
    target = rng.integers(0, v, (b_, t_))
    target[:, 0] = -100
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    arrays = {
        "hidden": f32(rng.standard_normal((b_, t_, h_)) * hidden_scale),
        "weight": f32(rng.standard_normal((v, h_)) * weight_scale),
    }
    if bias:
        arrays["bias"] = f32(rng.standard_normal(v) * 0.1)
    return arrays | {
        "target": jnp.asarray(target, jnp.int32),
        "advantages": f32(rng.standard_normal(b_)),
        "old_logps": f32(-rng.random((b_, t_)) * 3),
        "ref_logps": f32(-rng.random((b_, t_)) * 3),
    }


def loss_cases() -> dict:
    """fused_linear_grpo_loss and DPO over a head (and reference head) sharded on "model",
    sequences on "data", mesh 2 x 4."""
    mesh = mesh_of((2, 4))
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    rng = np.random.default_rng(4)
    b_, t_, v = 8, 4, 64
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    arrays = grpo_arrays(rng, 0.5, 0.3) | {
        "ref_hidden": f32(rng.standard_normal((b_, t_, 6)) * 0.5),
        "ref_weight": f32(rng.standard_normal((v, 6)) * 0.3),
    }
    specs = {n: s("model", None) if n in ("weight", "ref_weight") else s("data") for n in arrays}
    out = {}
    arrays["preference_labels"] = jnp.asarray(rng.integers(0, 2, b_), bool)
    specs["preference_labels"] = s("data")
    grpo = ("hidden", "weight", "target", "advantages", "old_logps", "ref_logps")
    dpo = ("hidden", "weight", "target", "ref_hidden", "ref_weight")
    kto = ("hidden", "weight", "target", "preference_labels", "ref_hidden", "ref_weight")
    for name, fn, names in (
        ("grpo", functools.partial(fj.fused_linear_grpo_loss, beta=0.1, chunk_size=CHUNK), grpo),
        ("dpo", functools.partial(fj.fused_linear_preference_loss, loss="dpo", chunk_size=CHUNK), dpo),
        ("kto", functools.partial(fj.fused_linear_kto_loss, kl=0.05, chunk_size=CHUNK), kto),
    ):
        vg = jax.value_and_grad(lambda *a, fn=fn, names=names: fn(**dict(zip(names, a))), argnums=(0, 1))
        expected = jax.jit(vg)(*(arrays[n] for n in names))
        args = [jax.device_put(arrays[n], specs[n]) for n in names]
        compiled = jax.jit(vg, out_shardings=(s(), (s("data"), s("model", None)))).lower(*args).compile()
        hlo = compiled.as_text()
        out[f"losses/{name}"] = {"rel_diff": rel_diff(compiled(*args), expected), "collectives": counts(hlo)}
    return out


def mesh_cases() -> dict:
    """hidden [4, 8, H] with its tokens sharded over data and model (the head's axis too: gathered
    over it, as under sequence parallel) or over data alone, the head over model, on meshes of Auto
    and of Explicit axes (jax.make_mesh's default: the loop then runs under jax.shard_map);
    cross_entropy's logits sharded on V on an Explicit mesh."""
    out = {}
    rng = np.random.default_rng(5)
    h = jnp.asarray(rng.standard_normal((4, 8, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 16)) * 0.4, jnp.float32)
    t = jnp.asarray(rng.integers(0, 64, (4, 8)), jnp.int32).at[:, ::3].set(7)
    opts = OPTIONS["all"]
    for reduction in ("mean", "none"):

        def f(h, w, t, reduction=reduction):
            loss = fj.fused_linear_cross_entropy(h, w, t, reduction=reduction, chunk_size=CHUNK, **opts)
            return jnp.sum(loss * jnp.arange(32.0).reshape(4, 8)) if reduction == "none" else loss

        vg = jax.value_and_grad(f, argnums=(0, 1))
        expected = jax.jit(vg)(h, w, t)
        for kind in ("auto", "explicit"):
            axis_type = jax.sharding.AxisType.Auto if kind == "auto" else jax.sharding.AxisType.Explicit
            mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
            for tokens in (("data",), ("data", "model")):
                hs = NamedSharding(mesh, P(*tokens, None)) if len(tokens) == 2 else NamedSharding(mesh, P("data", None, None))
                ws, ts = NamedSharding(mesh, P("model", None)), NamedSharding(mesh, P(*tokens))
                args = jax.device_put(h, hs), jax.device_put(w, ws), jax.device_put(t, ts)
                compiled = jax.jit(vg).lower(*args).compile()
                got = compiled(*args)
                out[f"mesh/{kind}/{'x'.join(tokens)}/{reduction}"] = {
                    "rel_diff": rel_diff(got, expected),
                    "collectives": counts(compiled.as_text()),
                    "all_reduces": all_reduces(compiled.as_text()),
                    "dweight_spec": str(got[1][1].sharding.spec),
                }
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = jnp.asarray(rng.standard_normal((4, 8, 64)) * 3, jnp.float32)
    vg = jax.value_and_grad(lambda x, t: fj.cross_entropy(x, t, **opts))
    args = jax.device_put(x, NamedSharding(mesh, P("data", None, "model"))), jax.device_put(t, NamedSharding(mesh, P("data")))
    compiled = jax.jit(vg).lower(*args).compile()
    out["mesh/explicit/ce"] = {
        "rel_diff": rel_diff(compiled(*args), jax.jit(vg)(x, t)),
        "collectives": counts(compiled.as_text()),
    }
    return out


JSD_OPTIONS = {"beta0": {"beta": 0.0}, "beta03": {"beta": 0.3, "temperature": 2.0}, "beta1": {"beta": 1.0, "temperature": 0.7}}


def jsd_case(mesh, v, opts, labels=True, constrain=False, n=32, teacher=("model", None)) -> dict:
    """jit(value_and_grad) of fused_linear_jsd with both hiddens (and labels) sharded on "data",
    both heads on "model" (V divisible: device_put; else sharding constraints inside jit), against
    the one-device call: the loss, student_hidden's and student_weight's gradients."""
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    rng = np.random.default_rng(6)
    lab = jnp.asarray(rng.integers(0, v, n), jnp.int32).at[::5].set(-100)
    arrays = (
        jnp.asarray(rng.standard_normal((n, 16)), jnp.float32),
        jnp.asarray(rng.standard_normal((v, 16)) * 0.4, jnp.float32),
        jnp.asarray(rng.standard_normal((n, 12)), jnp.float32),
        jnp.asarray(rng.standard_normal((v, 12)) * 0.4, jnp.float32),
        lab,
    )

    def f(hs, ws, ht, wt, lab):
        return fj.fused_linear_jsd(hs, ws, ht, wt, lab if labels else None, chunk_size=CHUNK, **opts)

    vg = jax.value_and_grad(f, argnums=(0, 1))
    expected = jax.jit(vg)(*arrays)
    shardings = (s("data", None), s("model", None), s("data", None), s(*teacher), s("data"))
    if constrain:
        fn = jax.jit(lambda *a: vg(*(jax.lax.with_sharding_constraint(x, sh) for x, sh in zip(a, shardings))))
        args = arrays
    else:
        fn = jax.jit(vg)
        args = tuple(jax.device_put(x, sh) for x, sh in zip(arrays, shardings))
    return measured(fn, args, expected)


def jsd_cases() -> dict:
    out = {}
    for shape in ((1, 2), (1, 4), (2, 4), (8, 1)):
        for name in JSD_OPTIONS if shape == (2, 4) else ("beta03",):
            out[f"jsd/{shape[0]}x{shape[1]}/{name}"] = jsd_case(mesh_of(shape), 64, JSD_OPTIONS[name])
    mesh = mesh_of((2, 4))
    out["jsd/2x4/beta03/no_labels"] = jsd_case(mesh, 64, JSD_OPTIONS["beta03"], labels=False)
    out["jsd/2x4/beta03/teacher_replicated"] = jsd_case(mesh, 64, JSD_OPTIONS["beta03"], teacher=(None, None))
    out["jsd/2x4/beta03/tokens_uneven"] = jsd_case(mesh, 64, JSD_OPTIONS["beta03"], n=30, constrain=True)
    for shape in ((1, 4), (2, 4)):
        out[f"jsd/{shape[0]}x{shape[1]}/beta03/v1001"] = jsd_case(mesh_of(shape), 1001, JSD_OPTIONS["beta03"], constrain=True)
    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    out["jsd/explicit/beta03"] = jsd_case(explicit, 64, JSD_OPTIONS["beta03"])
    return out


def jsd_axis_name_cases() -> dict:
    """fused_linear_jsd's axis_name= form inside the caller's shard_map over (data 2, model 4):
    without labels the tokens over "data" (the mean over each device's 16 tokens, pmean'ed over
    "data"); with labels the tokens whole on every device (the mean over them all), V 64 and V
    1001 in blocks padded with NaN (vocab_size=1001); the loss and the student's gradients
    against the one-device call."""
    mesh = mesh_of((2, 4))
    out = {}
    opts = JSD_OPTIONS["beta03"]
    for v, vocab_size, labels in ((64, None, False), (64, None, True), (1001, 1001, True)):
        rng = np.random.default_rng(6)
        pad = 4 * -(-v // 4) - v
        hs, ht = (jnp.asarray(rng.standard_normal((32, d)), jnp.float32) for d in (16, 12))
        ws, wt = (jnp.asarray(rng.standard_normal((v, d)) * 0.4, jnp.float32) for d in (16, 12))
        lab = jnp.asarray(rng.integers(0, v, 32), jnp.int32).at[::5].set(-100)
        wsp, wtp = (jnp.pad(w, ((0, pad), (0, 0)), constant_values=jnp.nan) for w in (ws, wt))
        tokens = None if labels else "data"

        def local(hs, ws, ht, wt, lab, vocab_size=vocab_size, labels=labels):
            loss = fj.fused_linear_jsd(
                hs, ws, ht, wt, lab if labels else None, chunk_size=CHUNK, axis_name="model", vocab_size=vocab_size, **opts
            )
            return loss if labels else jax.lax.pmean(loss, "data")

        specs = (P(tokens, None), P("model", None), P(tokens, None), P("model", None), P(tokens))
        sm = shard_map(local, mesh=mesh, in_specs=specs, out_specs=P())
        got = jax.jit(jax.value_and_grad(sm, argnums=(0, 1)))(hs, wsp, ht, wtp, lab)
        got = (got[0], (got[1][0], got[1][1][:v]))
        ref = jax.jit(jax.value_and_grad(functools.partial(fj.fused_linear_jsd, **opts), argnums=(0, 1)))
        expected = ref(hs, ws, ht, wt, lab if labels else None)
        out[f"axis_name/jsd/v{v}" + ("" if labels else "/no_labels")] = {"rel_diff": rel_diff(got, expected)}
    return out


def _error(fn) -> str:
    try:
        jax.block_until_ready(fn())
    except ValueError as e:
        return str(e)
    return "ran"


def target_cases() -> dict:
    """A target outside [0, V) (not ignore_index) in eager calls on the CPU, the classes sharded
    over "model" (mesh 1 x 2) and not: the error of each (the message; "ran" if none)."""
    mesh = mesh_of((1, 2))
    rng = np.random.default_rng(7)
    h = jnp.asarray(rng.standard_normal((13, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((13, 16)), jnp.float32)
    ws = jax.device_put(w, NamedSharding(mesh, P("model", None)))
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "model")))
    out = {}
    flce, ce = fj.fused_linear_cross_entropy, fj.cross_entropy
    for bad, ignore_index in ((16, -100), (-1, 3)):
        t = jnp.asarray(rng.integers(0, 16, 13), jnp.int32).at[7].set(bad).at[2].set(ignore_index)
        kw = {"ignore_index": ignore_index}
        errors = {
            "flce/sharded/mean": _error(lambda t=t, kw=kw: flce(h, ws, t, chunk_size=5, **kw)),
            "flce/sharded/none": _error(lambda t=t, kw=kw: flce(h, ws, t, chunk_size=5, reduction="none", **kw)),
            "flce/unsharded": _error(
                lambda t=t, kw=kw: flce(h, w, t, chunk_size=13, **kw)
            ),  # one chunk: its index is the token's
            "ce/sharded": _error(lambda t=t, kw=kw: ce(xs, t, **kw)),
            "ce/unsharded": _error(lambda t=t, kw=kw: ce(x, t, **kw)),
        }
        out[f"targets/{bad}"] = {"rel_diff": 0.0, "errors": errors}
    t = jnp.asarray(rng.integers(0, 16, 13), jnp.int32).at[2].set(-100)
    got = fj.fused_linear_cross_entropy(h, ws, t, chunk_size=5)  # in range: computed, no error
    out["targets/in_range"] = {"rel_diff": rel_diff(got, fj.fused_linear_cross_entropy(h, w, t, chunk_size=5))}
    return out


def main():
    out = {}
    out.update(target_cases())
    out.update(jsd_cases())
    out.update(mesh_cases())
    out.update(flce_cases())
    out.update(ce_cases())
    out.update(axis_name_cases())
    out.update(jsd_axis_name_cases())
    out.update(loss_cases())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
