"""fuselet.jax.fused_linear_cross_entropy against the float64 reference (tests/reference.py) and
against fuselet's own cross_entropy of the materialized logits."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
jnp = pytest.importorskip("jax.numpy")
fj = import_layer("jax")

OPTIONS = {
    "plain": {},
    "smooth_ignore": {"label_smoothing": 0.1, "ignore_index": 2},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 5.0, "ignore_index": 0},
}


def inputs(n=37, h=16, v=29, dtype="float32", seed=0, device=None, lead=()):
    rng = np.random.default_rng(seed)

    def a(*shape, scale=1.0):
        x = jnp.asarray(rng.standard_normal(shape) * scale, dtype=dtype)
        return jax.device_put(x, device) if device is not None else x

    hidden, weight, bias = a(*lead, n, h), a(v, h, scale=h**-0.5 * 3), a(v)
    target = jnp.asarray(rng.integers(0, v, (*lead, n)), dtype=jnp.int32)
    return hidden, weight, bias, target


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64) if a.dtype != jnp.bfloat16 else np.asarray(a.astype(jnp.float32), np.float64)


def reference(
    hidden, weight, bias, target, dloss=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean"
):
    """float64 (loss, dhidden, dweight, dbias) of cross_entropy(hidden @ weight.T + bias)."""
    h, w = f64(hidden).reshape(-1, hidden.shape[-1]), f64(weight)
    logits = h @ w.T + (0.0 if bias is None else f64(bias))
    t = np.asarray(target).reshape(-1)
    loss, _, _ = ref.cross_entropy_fwd(logits, t, ignore_index, label_smoothing, z_loss, softcap)
    if reduction == "none":
        g = f64(dloss).reshape(-1)
        out = loss.reshape(target.shape)
    else:
        scale = 1.0 / max(1, (t != ignore_index).sum()) if reduction == "mean" else 1.0
        g, out = np.full_like(loss, scale), loss.sum() * scale
    dl = ref.cross_entropy_bwd(g, logits, t, ignore_index, label_smoothing, z_loss, softcap)
    return out, (dl @ w).reshape(hidden.shape), dl.T @ h, dl.sum(0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("chunk", [None, 5])
def test_against_reference(reduction, options, chunk, jax_device):
    hidden, weight, bias, target = inputs(device=jax_device)
    kw = {**OPTIONS[options], "reduction": reduction}
    dloss = jnp.linspace(0.5, 1.5, target.size).reshape(target.shape)

    def f(h, w, b):
        loss = fj.fused_linear_cross_entropy(h, w, target, bias=b, chunk_size=chunk, **kw)
        return jnp.sum(loss * dloss) if reduction == "none" else loss

    loss = fj.fused_linear_cross_entropy(hidden, weight, target, bias=bias, chunk_size=chunk, **kw)
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(hidden, weight, bias)
    expected = reference(hidden, weight, bias, target, dloss, **kw)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(f64(loss), expected[0], rtol=1e-5, atol=1e-5)
    for name, g, e in zip(("hidden", "weight", "bias"), grads, expected[1:]):
        np.testing.assert_allclose(f64(g), e, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")


def test_all_ignored_and_no_bias():
    hidden, weight, _, target = inputs(n=8)
    target = jnp.full_like(target, -100)
    loss, grads = jax.value_and_grad(lambda h, w: fj.fused_linear_cross_entropy(h, w, target), argnums=(0, 1))(hidden, weight)
    assert float(loss) == 0.0 and all(not np.any(np.asarray(g)) for g in grads)


def test_z_loss_returned():
    hidden, weight, bias, target = inputs()
    loss, z = fj.fused_linear_cross_entropy(hidden, weight, target, bias=bias, z_loss=1e-2, return_z_loss=True)
    _, z_ref, _ = ref.cross_entropy_fwd(f64(hidden) @ f64(weight).T + f64(bias), np.asarray(target), -100, 0.0, 1e-2, None)
    np.testing.assert_allclose(float(z), z_ref.mean(), rtol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bfloat16(reduction):
    """The loss of fuselet's cross_entropy of the materialized bf16 logits; gradients within bf16
    rounding of the float64 reference (closer than the unfused path's, whose bias gradient sums
    the tokens in bf16)."""
    kw = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 10.0, "reduction": reduction}
    hidden, weight, bias, target = inputs(n=64, h=32, v=96, dtype="bfloat16", lead=(2,))

    def ours(h, w, b):
        return jnp.sum(fj.fused_linear_cross_entropy(h, w, target, bias=b, chunk_size=16, **kw))

    def unfused(h, w, b):
        return jnp.sum(fj.cross_entropy(h @ w.T + b, target, **kw))

    loss, grads = jax.value_and_grad(ours, argnums=(0, 1, 2))(hidden, weight, bias)
    np.testing.assert_allclose(float(loss), float(unfused(hidden, weight, bias)), rtol=1e-3)
    expected = reference(hidden, weight, bias, target, jnp.ones(target.shape), **kw)
    for name, g, e in zip(("hidden", "weight", "bias"), grads, expected[1:]):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(f64(g), e, rtol=2e-2, atol=2e-2, err_msg=f"d{name}")


def test_bad_input():
    hidden, weight, bias, target = inputs()
    with pytest.raises(TypeError, match="weight: expected dtype float32 \\(the dtype of hidden\\), got bfloat16"):
        fj.fused_linear_cross_entropy(hidden, weight.astype(jnp.bfloat16), target)
    with pytest.raises(ValueError, match="chunk_size: expected None or an int >= 1"):
        fj.fused_linear_cross_entropy(hidden, weight, target, chunk_size=0)
