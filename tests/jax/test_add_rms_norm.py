"""fuselet.jax residual add + RMSNorm against the float64 reference (tests/reference.py):
forward, grad, jit, vmap."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
EPS = 1e-6


def arrays(shape, dtype, device=None, seed=0) -> dict:
    a = ref.make_inputs(shape, dtype, seed)
    b = ref.make_inputs(shape, dtype, seed + 1)
    values = {"x": a["x"], "residual": b["x"], "weight": a["weight"], "dy": a["dy"], "dresidual_out": b["dy"]}
    return {k: jax.device_put(jnp.asarray(v), device) for k, v in values.items()}


f64 = ref.to_float64


def loss(x, residual, weight, dy, dh):
    y, h = fj.add_rms_norm(x, residual, weight, EPS)
    return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32)) + jnp.sum(h.astype(jnp.float32) * dh.astype(jnp.float32))


grad = jax.grad(loss, argnums=(0, 1, 2))


def check(a, y, h, grads, dtype):
    expected_y, expected_h, _ = ref.add_rms_norm_fwd(a["x"], a["residual"], a["weight"], EPS, dtype)
    assert y.dtype == h.dtype == a["x"].dtype and y.shape == h.shape == a["x"].shape
    ref.assert_close(f64(h), expected_h, dtype, "out", name="residual_out")
    ref.assert_close(f64(y), expected_y, dtype, "out", name="y")
    dx, dw = ref.add_rms_norm_bwd(a["dy"], a["dresidual_out"], expected_h, a["weight"], EPS)
    for name, g in zip(("x", "residual"), grads[:2]):
        assert g.dtype == a[name].dtype
        ref.assert_close(f64(g), dx, dtype, "out", name=f"d{name}")
    ref.assert_close(f64(grads[2]), dw, dtype, "reduce", rows=ref.rows_of(a["x"].shape), name="dweight")


def test_forward_grad(dtype, shape, jax_device):
    a = arrays(shape, dtype, jax_device)
    y, h = fj.add_rms_norm(a["x"], a["residual"], a["weight"], EPS)
    check(a, y, h, grad(a["x"], a["residual"], a["weight"], a["dy"], a["dresidual_out"]), dtype)


def test_jit(dtype):
    a = arrays((3, 5, 127), dtype)
    y, h = jax.jit(lambda x, r, w: fj.add_rms_norm(x, r, w, EPS))(a["x"], a["residual"], a["weight"])
    check(a, y, h, jax.jit(grad)(a["x"], a["residual"], a["weight"], a["dy"], a["dresidual_out"]), dtype)


def test_no_weight():
    a = arrays((4, 33), "float32")
    y, h = fj.add_rms_norm(a["x"], a["residual"])
    expected_y, expected_h, _ = ref.add_rms_norm_fwd(a["x"], a["residual"], None, EPS, "float32")
    ref.assert_close(f64(y), expected_y, "float32", name="y")
    g = jax.grad(lambda x: jnp.sum(fj.add_rms_norm(x, a["residual"])[0] * a["dy"]))(a["x"])
    dx, _ = ref.add_rms_norm_bwd(a["dy"], np.zeros(a["x"].shape), expected_h, None, EPS)
    ref.assert_close(f64(g), dx, "float32", name="dx")


def test_vmap_and_vmap_of_grad():
    parts = [arrays((8, 127), "float32", seed=s) for s in range(3)]
    b = {k: jnp.stack([p[k] for p in parts]) for k in parts[0]}
    w = parts[0]["weight"]
    ys, hs = jax.vmap(lambda x, r: fj.add_rms_norm(x, r, w, EPS))(b["x"], b["residual"])
    grads = jax.vmap(grad, in_axes=(0, 0, None, 0, 0))(b["x"], b["residual"], w, b["dy"], b["dresidual_out"])
    for i in range(3):
        example = {k: b[k][i] for k in b} | {"weight": w}
        check(example, ys[i], hs[i], [g[i] for g in grads], "float32")


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(shape):
    a = arrays(shape, "float32")
    y, h = fj.add_rms_norm(a["x"], a["residual"], a["weight"])
    assert y.shape == h.shape == shape
    g = grad(a["x"], a["residual"], a["weight"], a["dy"], a["dresidual_out"])
    np.testing.assert_array_equal(f64(g[2]), np.zeros(shape[-1]))
