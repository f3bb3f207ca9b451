"""fuselet.jax gated RMSNorm against the float64 reference (tests/reference.py): forward, grad,
jit, vmap, both gate orders and groups."""

from __future__ import annotations

import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
EPS = 1e-6
f64 = ref.to_float64


def arrays(shape, dtype, device=None, seed=0) -> dict:
    a, b = ref.make_inputs(shape, dtype, seed), ref.make_inputs(shape, dtype, seed + 1)
    values = {"x": a["x"], "z": b["x"], "weight": a["weight"], "dy": a["dy"]}
    return {k: jax.device_put(jnp.asarray(v), device) for k, v in values.items()}


def group_of(shape):
    return shape[-1] // 2 if shape[-1] % 2 == 0 and shape[-1] > 1 else None


def grad_of(group_size, norm_before_gate):
    def loss(x, z, weight, dy):
        y = fj.gated_rms_norm(x, z, weight, EPS, group_size, norm_before_gate)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def check(a, y, grads, dtype, group_size, norm_before_gate):
    args = (EPS, group_size, norm_before_gate)
    expected, _ = ref.gated_rms_norm_fwd(a["x"], a["z"], a["weight"], *args)
    assert y.dtype == a["x"].dtype and y.shape == a["x"].shape
    ref.assert_close(f64(y), expected, dtype, "out", name="y")
    dx, dz, dw = ref.gated_rms_norm_bwd(a["dy"], a["x"], a["z"], a["weight"], *args)
    ref.assert_close(f64(grads[0]), dx, dtype, "out", name="dx")
    ref.assert_close(f64(grads[1]), dz, dtype, "out", name="dz")
    ref.assert_close(f64(grads[2]), dw, dtype, "reduce", rows=ref.rows_of(a["x"].shape), name="dweight")


@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_then_gate", "gate_first"])
def test_forward_grad(dtype, shape, jax_device, norm_before_gate):
    a = arrays(shape, dtype, jax_device)
    group_size = group_of(shape)
    y = fj.gated_rms_norm(a["x"], a["z"], a["weight"], EPS, group_size, norm_before_gate)
    grads = grad_of(group_size, norm_before_gate)(a["x"], a["z"], a["weight"], a["dy"])
    check(a, y, grads, dtype, group_size, norm_before_gate)


def test_jit(dtype):
    a = arrays((3, 5, 128), dtype)
    y = jax.jit(lambda x, z, w: fj.gated_rms_norm(x, z, w, EPS, 64))(a["x"], a["z"], a["weight"])
    check(a, y, jax.jit(grad_of(64, True))(a["x"], a["z"], a["weight"], a["dy"]), dtype, 64, True)


def test_no_weight():
    a = arrays((4, 32), "float32")
    y = fj.gated_rms_norm(a["x"], a["z"], group_size=8, norm_before_gate=False)
    expected, _ = ref.gated_rms_norm_fwd(a["x"], a["z"], None, EPS, 8, False)
    ref.assert_close(f64(y), expected, "float32", name="y")


def test_vmap_and_vmap_of_grad():
    parts = [arrays((8, 64), "float32", seed=s) for s in range(3)]
    b = {k: jnp.stack([p[k] for p in parts]) for k in parts[0]}
    w = parts[0]["weight"]
    ys = jax.vmap(lambda x, z: fj.gated_rms_norm(x, z, w, EPS, 16))(b["x"], b["z"])
    grads = jax.vmap(grad_of(16, True), in_axes=(0, 0, None, 0))(b["x"], b["z"], w, b["dy"])
    for i in range(3):
        example = {k: b[k][i] for k in b} | {"weight": w}
        check(example, ys[i], [g[i] for g in grads], "float32", 16, True)
