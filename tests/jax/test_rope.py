"""fuselet.jax rope against the float64 reference (tests/reference.py): forward, grad, jit,
vmap, and sharding on 8 CPU devices (this file's __main__ runs in a subprocess: XLA_FLAGS
must be set before jax is imported)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer
from tests.jax.multi_device import others, run_on_8_cpu_devices

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
f64 = ref.to_float64
B, S, N, D = 2, 5, 3, 16


def x_shape(layout, b=B, s=S, n=N, d=D) -> tuple:
    inner = (s, n) if layout == "bshd" else (n, s)
    return ((b,) if b is not None else ()) + inner + (d,)


def arrays(shape, dtype, rotary, table_shape, table_dtype, device=None, seed=0):
    """x, dy in `dtype`; cos, sin of `table_shape` + (rotary,) with arbitrary values, in
    `table_dtype` ("x": x's)."""
    rng = np.random.default_rng(seed)
    np_dt = ref.NUMPY_DTYPES[dtype]
    t_dt = ref.NUMPY_DTYPES[dtype if table_dtype == "x" else table_dtype]
    vals = (
        ((rng.standard_normal(shape) * 2 + 0.3), np_dt),
        (rng.standard_normal(shape), np_dt),
        (rng.uniform(-1.5, 1.5, (*table_shape, rotary)), t_dt),
        (rng.uniform(-1.5, 1.5, (*table_shape, rotary)), t_dt),
    )
    return tuple(jax.device_put(jnp.asarray(v.astype(dt)), device) for v, dt in vals)


def vjp(layout, interleaved):
    def loss(x, cos, sin, dy):
        y = fj.rope(x, cos, sin, layout=layout, interleaved=interleaved)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def check(x, dy, cos, sin, dtype, layout, interleaved, y=None, grads=None):
    bhsd = layout == "bhsd"
    y = fj.rope(x, cos, sin, layout=layout, interleaved=interleaved) if y is None else y
    assert y.dtype == x.dtype and y.shape == x.shape
    ref.assert_close(f64(y), ref.rope_fwd(x, cos, sin, bhsd, interleaved), dtype, name="y")
    r = cos.shape[-1]
    assert np.array_equal(f64(y)[..., r:], f64(x)[..., r:]), "features R..D-1 pass through unchanged"
    dx, dcos, dsin = vjp(layout, interleaved)(x, cos, sin, dy) if grads is None else grads
    assert dx.dtype == x.dtype and dx.shape == x.shape
    ref.assert_close(f64(dx), ref.rope_bwd(dy, cos, sin, bhsd, interleaved), dtype, name="dx")
    assert dcos.shape == cos.shape and not np.any(f64(dcos)) and not np.any(f64(dsin)), "cos, sin: zero gradients"


@pytest.mark.parametrize("table_dtype", ["float32", "x"])
@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("rotary", [D, 10], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_forward_grad(dtype, layout, interleaved, rotary, tables, table_dtype, jax_device):
    table_shape = (S,) if tables == "shared" else (B, S)
    x, dy, cos, sin = arrays(x_shape(layout), dtype, rotary, table_shape, table_dtype, jax_device)
    check(x, dy, cos, sin, dtype, layout, interleaved)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_no_batch_dim_and_head_dims(dtype, layout, interleaved, jax_device):
    x, dy, cos, sin = arrays(x_shape(layout, None), dtype, 12, (S,), "float32", jax_device)
    check(x, dy, cos, sin, dtype, layout, interleaved)
    x, dy, cos, sin = arrays(x_shape(layout, 3, 9, 2, 128), dtype, 64, (3, 9), "x", jax_device, seed=1)
    check(x, dy, cos, sin, dtype, layout, interleaved)


@pytest.mark.parametrize("empty", ["B=0", "S=0"])
def test_empty(empty):
    b, s = (0, S) if empty == "B=0" else (B, 0)
    for tables in ((s,), (b, s)):
        x, dy, cos, sin = arrays(x_shape("bshd", b, s), "float32", 8, tables, "x")
        assert fj.rope(x, cos, sin).shape == x.shape
        assert vjp("bshd", False)(x, cos, sin, dy)[0].shape == x.shape


# --- pair tables and sections (fuselet/rope.h), against the plain op on the full-width tables ---

SECTIONS = {1: (6,), 2: (2, 4), 3: (1, 3, 2), 4: (2, 0, 3, 1)}  # K -> sections of R/2 = 6 pairs
INTERLEAVED_SECTIONS = {1: (6,), 2: (3, 3), 3: (2, 2, 2), 4: (3, 2, 0, 1)}


def check_tables(x, dy, cos, sin, dtype, layout, interleaved, **table):
    full_cos, full_sin = ref.rope_full_tables(cos, sin, interleaved, **table)
    plain = [jnp.asarray(t.astype(np.float32)).astype(cos.dtype) for t in (full_cos, full_sin)]

    def loss(x, cos, sin, **options):
        y = fj.rope(x, cos, sin, layout=layout, interleaved=interleaved, **options)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32)), y

    (_, y), grads = jax.jit(jax.value_and_grad(lambda *a: loss(*a, **table), argnums=(0, 1, 2), has_aux=True))(x, cos, sin)
    (_, want), want_grads = jax.value_and_grad(loss, argnums=(0,), has_aux=True)(x, *plain)
    assert np.array_equal(np.asarray(y), np.asarray(want)) and np.array_equal(np.asarray(grads[0]), np.asarray(want_grads[0]))
    bhsd = layout == "bhsd"
    ref.assert_close(f64(y), ref.rope_fwd(x, full_cos, full_sin, bhsd, interleaved), dtype, name="y")
    ref.assert_close(f64(grads[0]), ref.rope_bwd(dy, full_cos, full_sin, bhsd, interleaved), dtype, name="dx")
    assert grads[1].shape == cos.shape and not np.any(f64(grads[1])) and not np.any(f64(grads[2])), "cos, sin: zero gradients"


@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("rotary", [D, 10], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_pair_table(dtype, layout, interleaved, rotary, tables, jax_device):
    table_shape = (S,) if tables == "shared" else (B, S)
    x, dy, cos, sin = arrays(x_shape(layout), dtype, rotary // 2, table_shape, "float32", jax_device)
    check_tables(x, dy, cos, sin, dtype, layout, interleaved, pair_table=True)


@pytest.mark.parametrize("k", sorted(SECTIONS))
@pytest.mark.parametrize("interleaved_sections", [False, True], ids=["contiguous", "interleaved_sections"])
@pytest.mark.parametrize("pair_table", [False, True], ids=["full", "pair"])
@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_sections(dtype, layout, interleaved, tables, pair_table, interleaved_sections, k, jax_device):
    sections = (INTERLEAVED_SECTIONS if interleaved_sections else SECTIONS)[k]
    table_shape = (k, S) if tables == "shared" else (k, B, S)
    x, dy, cos, sin = arrays(x_shape(layout), dtype, 6 if pair_table else 12, table_shape, "x", jax_device, seed=k)
    check_tables(
        x,
        dy,
        cos,
        sin,
        dtype,
        layout,
        interleaved,
        pair_table=pair_table,
        sections=sections,
        interleaved_sections=interleaved_sections,
    )


@pytest.mark.parametrize("case", ["x_only", "all", "tables_only"])
@pytest.mark.parametrize("per_seq", [False, True], ids=["shared", "per_seq"])
def test_vmap_with_sections(case, per_seq):
    """vmap of sectioned tables [K, ...]: the mapped dim goes next to B, behind K."""
    options = {"pair_table": True, "sections": (1, 2, 1), "interleaved_sections": False}
    parts = [arrays(x_shape("bshd"), "float32", 4, (3, B, S) if per_seq else (3, S), "float32", seed=i) for i in range(3)]
    xs, dys, coss, sins = (jnp.stack([p[k] for p in parts]) for k in range(4))
    x_axis = None if case == "tables_only" else 0
    t_axis = None if case == "x_only" else 0
    if x_axis is None:
        xs = parts[0][0]
    if t_axis is None:
        coss, sins = parts[0][2], parts[0][3]
    ys = jax.vmap(lambda x, c, s: fj.rope(x, c, s, **options), in_axes=(x_axis, t_axis, t_axis))(xs, coss, sins)
    for i in range(3):
        x = xs[i] if x_axis == 0 else xs
        cos, sin = (coss[i], sins[i]) if t_axis == 0 else (coss, sins)
        assert np.array_equal(np.asarray(ys[i]), np.asarray(fj.rope(x, cos, sin, **options))), i


def test_jit():
    x, dy, cos, sin = arrays(x_shape("bhsd"), "bfloat16", 8, (B, S), "float32")
    y = jax.jit(lambda x, c, s: fj.rope(x, c, s, layout="bhsd", interleaved=True))(x, cos, sin)
    check(x, dy, cos, sin, "bfloat16", "bhsd", True, y, jax.jit(vjp("bhsd", True))(x, cos, sin, dy))


@pytest.mark.parametrize("case", ["x_only_shared", "x_only_per_seq", "all_no_b", "all_per_seq", "tables_only"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_vmap_and_vmap_of_grad(case, layout):
    """vmap folds the mapped dim into B: each example keeps its own tables."""
    no_b = case == "all_no_b"
    per_seq = case in ("x_only_per_seq", "all_per_seq")
    parts = [
        arrays(x_shape(layout, None if no_b else B), "float32", 8, (B, S) if per_seq else (S,), "float32", seed=i)
        for i in range(3)
    ]
    xs, dys, coss, sins = (jnp.stack([p[k] for p in parts]) for k in range(4))
    x_axis = None if case == "tables_only" else 0
    t_axis = 0 if case.startswith("all") or case == "tables_only" else None
    if x_axis is None:
        xs, dys = parts[0][0], parts[0][1]
    if t_axis is None:
        coss, sins = parts[0][2], parts[0][3]
    axes = (x_axis, t_axis, t_axis)
    ys = jax.vmap(lambda x, c, s: fj.rope(x, c, s, layout=layout), in_axes=axes)(xs, coss, sins)
    grads = jax.vmap(vjp(layout, False), in_axes=(*axes, x_axis))(xs, coss, sins, dys)
    for i in range(3):
        x, dy, cos, sin = (a[i] if ax == 0 else a for a, ax in zip((xs, dys, coss, sins), (x_axis, x_axis, t_axis, t_axis)))
        dcos = grads[1][i] if t_axis == 0 else jnp.zeros_like(cos)
        dsin = grads[2][i] if t_axis == 0 else jnp.zeros_like(sin)
        check(x, dy, cos, sin, "float32", layout, False, ys[i], (grads[0][i], dcos, dsin))


# --- sharding (8 CPU devices, in a subprocess) ---------------------------------------------


@pytest.fixture(scope="module")
def sharded() -> dict:
    return run_on_8_cpu_devices("tests.jax.test_rope")


@pytest.mark.parametrize(
    "case",
    [
        "batch",
        "batch_and_heads",
        "bhsd_batch_and_heads",
        "per_seq_batch",
        "sequence",
        "bhsd_sequence",
        "shard_map",
        "sections_per_seq_batch",
        "sections_sequence",
    ],
)
@pytest.mark.processes
def test_sharding_has_no_collective(sharded, case):
    """x sharded on B, N and / or S (tables replicated, or sharded on B like x): no all-gather,
    all-reduce or any other collective, forward or gradient; y and dx keep x's sharding."""
    r = sharded[case]
    assert others(r["fwd"]) == {} and others(r["grad"]) == {}, r
    assert r["y_sharding_is_x"] and r["dx_sharding_is_x"] and r["max_diff"] < 1e-5, r


def test_sharded_head_dim_is_gathered(sharded):
    r = sharded["head_dim"]
    assert r["fwd"]["all-gather"] >= 1 and r["max_diff"] < 1e-5, r


def test_eager_call_with_uncommitted_tables(sharded):
    """fj.rope(x_sharded, cos, sin) outside jit with plain jnp tables: y keeps x's sharding."""
    r = sharded["eager"]
    assert r["y_sharding_is_x"] and r["max_diff"] < 1e-5, r


def _sharding_main():
    """Prints one JSON object: per case, the collectives of the compiled forward and gradient,
    whether y / dx keep x's sharding, and the largest difference from the unsharded result."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tests.jax.sharding_child import collectives as count

    def case(mesh, spec, layout, shape, tables, table_spec=None, shard_map=False, **options):
        rotary = shape[-1] // 2 if options.get("pair_table") else shape[-1]
        x, dy, cos, sin = arrays(shape, "float32", rotary, tables, "float32")

        def f(x, c, s):
            return fj.rope(x, c, s, layout=layout, interleaved=True, **options)

        g = jax.grad(lambda x, c, s, dy: jnp.sum(f(x, c, s) * dy), argnums=(0,))
        expected = f(x, cos, sin), g(x, cos, sin, dy)
        xs = NamedSharding(mesh, spec)
        ts = NamedSharding(mesh, table_spec if table_spec is not None else P())
        if shard_map:
            f = jax.shard_map(f, mesh=mesh, in_specs=(spec, table_spec, table_spec), out_specs=spec)
            g = jax.grad(lambda x, c, s, dy: jnp.sum(f(x, c, s) * dy), argnums=(0,))
        args = (jax.device_put(x, xs), jax.device_put(cos, ts), jax.device_put(sin, ts))
        dys = jax.device_put(dy, xs)
        jf, jg = jax.jit(f), jax.jit(g)
        y, grads = jf(*args), jg(*args, dys)
        diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in ((y, expected[0]), (grads[0], expected[1][0]))
        )
        return {
            "fwd": count(jf.lower(*args).compile().as_text()),
            "grad": count(jg.lower(*args, dys).compile().as_text()),
            "y_sharding_is_x": y.sharding.is_equivalent_to(xs, y.ndim),
            "dx_sharding_is_x": grads[0].sharding.is_equivalent_to(xs, y.ndim),
            "max_diff": diff,
        }

    mesh = jax.make_mesh((8,), ("data",))
    mesh2 = jax.make_mesh((2, 4), ("a", "b"))
    out = {
        "batch": case(mesh, P("data"), "bshd", (8, 6, 2, 16), (6,)),
        "batch_and_heads": case(mesh2, P("a", None, "b"), "bshd", (2, 6, 4, 16), (6,)),
        "bhsd_batch_and_heads": case(mesh2, P("a", "b"), "bhsd", (2, 4, 6, 16), (6,)),
        "per_seq_batch": case(mesh, P("data"), "bshd", (8, 6, 2, 16), (8, 6), P("data")),
        "sequence": case(mesh, P(None, "data"), "bshd", (2, 16, 2, 8), (16,)),
        "bhsd_sequence": case(mesh2, P("a", None, "b"), "bhsd", (2, 3, 8, 8), (2, 8)),
        "shard_map": case(mesh, P("data"), "bshd", (8, 6, 2, 16), (6,), P(), shard_map=True),
        "head_dim": case(mesh, P(None, None, None, "data"), "bshd", (2, 6, 2, 16), (6,)),
        "sections_per_seq_batch": case(
            mesh, P("data"), "bshd", (8, 6, 2, 16), (3, 8, 6), P(None, "data"), pair_table=True, sections=(4, 2, 2)
        ),
        "sections_sequence": case(
            mesh, P(None, "data"), "bshd", (2, 16, 2, 8), (2, 16), sections=(2, 2), interleaved_sections=True
        ),
    }
    x, _, cos, sin = arrays((8, 6, 2, 16), "float32", 16, (6,), "float32")
    xs = NamedSharding(mesh, P("data"))
    y = fj.rope(jax.device_put(x, xs), cos, sin)
    out["eager"] = {
        "y_sharding_is_x": y.sharding.is_equivalent_to(xs, y.ndim),
        "max_diff": float(np.max(np.abs(np.asarray(y) - np.asarray(fj.rope(x, cos, sin))))),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    assert "xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", ""), "set XLA_FLAGS first"
    _sharding_main()
