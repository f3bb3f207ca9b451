"""fuselet.jax softmax against the float64 reference (tests/reference.py): forward, grad,
jit, vmap."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
CAUSAL_SHAPES = [(4, 4), (3, 7), (7, 3), (2, 3, 5, 127), (2, 130, 129), (1, 4097)]
f64 = ref.to_float64


def arrays(shape, dtype, device=None, seed=0):
    a = ref.make_inputs(shape, dtype, seed)
    return jax.device_put(jnp.asarray(a["x"]), device), jax.device_put(jnp.asarray(a["dy"]), device)


def vjp(scale, causal):
    return jax.grad(lambda x, dy: jnp.sum(fj.softmax(x, scale, causal).astype(jnp.float32) * dy.astype(jnp.float32)))


def check(x, dy, y, dx, dtype, scale, causal):
    assert y.dtype == x.dtype and y.shape == x.shape
    ref.assert_close(f64(y), ref.softmax_fwd(x, scale, causal), dtype, "out", name="y")
    assert dx.dtype == x.dtype and not np.isnan(f64(dx)).any()
    ref.assert_close(f64(dx), ref.softmax_bwd(dy, y, scale), dtype, "out", name="dx")


@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_forward_grad(dtype, shape, scale, jax_device):
    x, dy = arrays(shape, dtype, jax_device)
    check(x, dy, fj.softmax(x, scale), vjp(scale, False)(x, dy), dtype, scale, False)


@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_causal(dtype, shape, jax_device):
    x, dy = arrays(shape, dtype, jax_device)
    check(x, dy, fj.softmax(x, 0.3, True), vjp(0.3, True)(x, dy), dtype, 0.3, True)


def test_jit():
    x, dy = arrays((2, 5, 7), "bfloat16")
    y = jax.jit(lambda x: fj.softmax(x, 0.5, True))(x)
    check(x, dy, y, jax.jit(vjp(0.5, True))(x, dy), "bfloat16", 0.5, True)


def test_vmap_and_vmap_of_grad():
    """vmap over a leading batch dim keeps each example's causal mask."""
    parts = [arrays((6, 4), "float32", seed=s) for s in range(3)]
    xs, dys = jnp.stack([p[0] for p in parts]), jnp.stack([p[1] for p in parts])
    ys = jax.vmap(lambda x: fj.softmax(x, 0.5, True))(xs)
    dxs = jax.vmap(vjp(0.5, True))(xs, dys)
    for i in range(3):
        check(xs[i], dys[i], ys[i], dxs[i], "float32", 0.5, True)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(shape):
    x, dy = arrays(shape, "float32")
    assert fj.softmax(x, causal=True).shape == shape
    assert vjp(1.0, True)(x, dy).shape == shape
