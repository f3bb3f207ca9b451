"""fuselet.jax cross_entropy against the float64 reference (tests/reference.py): options,
reductions, ignored tokens, grad, jit, vmap, the fused fwd_bwd helper."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
from fuselet.jax.cross_entropy import fwd_bwd  # noqa: E402  (the module; fuselet.jax.cross_entropy is the function)

f64 = ref.to_float64
VOCABS = [1, 3, 32000, 32001]
OPTIONS = {
    "plain": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 5.0},
    "ignore_inside": {"ignore_index": 2},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 10.0, "ignore_index": 1},
}


def make(shape, vocab, dtype, device=None, seed=0, ignore_index=-100, ignore_every=3):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((*shape, vocab)) * 3.0).astype(ref.NUMPY_DTYPES[dtype])
    target = rng.integers(0, vocab, shape).astype(np.int32)
    if ignore_every:
        target.reshape(-1)[1::ignore_every] = ignore_index
    return jax.device_put(jnp.asarray(logits), device), jax.device_put(jnp.asarray(target), device)


def full_options(opts):
    return {"ignore_index": -100, "label_smoothing": 0.0, "z_loss": 0.0, "softcap": None, **opts}


def check_none(logits, target, dtype, opts, seed=1):
    """reduction='none' with a per-token weight: losses and the weighted gradient."""
    o = full_options(opts)
    loss = fj.cross_entropy(logits, target, reduction="none", **opts)
    assert loss.dtype == jnp.float32 and loss.shape == target.shape
    ref.assert_close(f64(loss), ref.cross_entropy_fwd(logits, target, **o)[0], "float32", name="loss")
    w = jnp.asarray(np.random.default_rng(seed).standard_normal(target.shape), jnp.float32)
    w = jax.device_put(w, next(iter(logits.devices())))
    dx = jax.grad(lambda x: jnp.sum(fj.cross_entropy(x, target, reduction="none", **opts) * w))(logits)
    assert dx.dtype == logits.dtype and not np.isnan(f64(dx)).any()
    ref.assert_close(f64(dx), ref.cross_entropy_bwd(w, logits, target, **o), dtype, name="dlogits")


@pytest.mark.parametrize("vocab", VOCABS)
def test_forward_grad(dtype, vocab, jax_device):
    logits, target = make((3 if vocab > 100 else 9,), vocab, dtype, jax_device)
    check_none(logits, target, dtype, {})


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("vocab", [3, 4097])
def test_options(dtype, name, vocab, jax_device):
    opts = OPTIONS[name]
    logits, target = make((2, 5), vocab, dtype, jax_device, ignore_index=opts.get("ignore_index", -100))
    check_none(logits, target, dtype, opts)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reductions_and_return_z_loss(reduction):
    logits, target = make((4, 6), 50, "float32")
    opts = {"label_smoothing": 0.1, "z_loss": 1e-2}
    loss, z = fj.cross_entropy(logits, target, reduction=reduction, return_z_loss=True, **opts)
    l_ref, z_ref, _ = ref.cross_entropy_fwd(logits, target, **full_options(opts))
    valid = np.asarray(target) != -100
    n = valid.sum() if reduction == "mean" else 1
    np.testing.assert_allclose(float(loss), l_ref.sum() / n, rtol=1e-5)
    np.testing.assert_allclose(float(z), z_ref.sum() / n, rtol=1e-5)
    dx = jax.grad(lambda x: fj.cross_entropy(x, target, reduction=reduction, **opts))(logits)
    ref.assert_close(
        f64(dx),
        ref.cross_entropy_bwd(np.where(valid, 1.0 / n, 0.0), logits, target, **full_options(opts)),
        "float32",
        name="dlogits",
    )
    # z is for logging: no gradient flows through it.
    dz = jax.grad(lambda x: fj.cross_entropy(x, target, z_loss=1e-2, return_z_loss=True)[1])(logits)
    assert not np.any(np.asarray(dz))


def test_matches_optax_free_reference():
    """The jnp expression of the benchmark (plain, label smoothing) gives the same mean loss."""
    logits, target = make((8,), 30, "float32")
    valid = target != -100
    lse = jax.nn.logsumexp(logits, -1)
    st = jnp.take_along_axis(logits, jnp.where(valid, target, 0)[:, None], -1)[:, 0]
    want = jnp.sum(jnp.where(valid, (0.9 * (lse - st) + 0.1 * (lse - logits.mean(-1))), 0)) / valid.sum()
    np.testing.assert_allclose(float(fj.cross_entropy(logits, target, label_smoothing=0.1)), float(want), rtol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_tokens_ignored(reduction, jax_device):
    logits, target = make((5,), 7, "float32", jax_device)
    target = jnp.full_like(target, -100)
    loss, z = fj.cross_entropy(logits, target, reduction=reduction, z_loss=1e-3, return_z_loss=True)
    assert float(loss) == 0.0 and float(z) == 0.0
    dx = jax.grad(lambda x: fj.cross_entropy(x, target, reduction=reduction))(logits)
    assert not np.any(np.asarray(dx))


@pytest.mark.parametrize("bad", [7, -1])
def test_out_of_range_target(bad):
    logits, target = make((4,), 7, "float32", ignore_every=0)
    target = target.at[2].set(bad)
    with pytest.raises(ValueError, match=rf"target: element 2 is {bad}, outside \[0, 7\)"):
        fj.cross_entropy(logits, target)


def test_numpy_inputs():
    logits, target = make((4,), 7, "float32", ignore_every=0)
    np.testing.assert_array_equal(
        np.asarray(fj.cross_entropy(np.asarray(logits), np.asarray(target))), np.asarray(fj.cross_entropy(logits, target))
    )
    with pytest.raises(ValueError, match=r"target: element 0 is 9"):
        fj.cross_entropy(np.asarray(logits), np.asarray(target.at[0].set(9)))


def test_int64_target_with_x64():
    logits, target = make((6,), 9, "float32")
    with jax.enable_x64(True):
        t64 = jnp.asarray(np.asarray(target), jnp.int64)
        assert t64.dtype == jnp.int64
        a = fj.cross_entropy(logits, t64, reduction="none")
    np.testing.assert_array_equal(np.asarray(a), np.asarray(fj.cross_entropy(logits, target, reduction="none")))


def test_jit_and_3d():
    logits, target = make((2, 3), 17, "bfloat16")
    f = jax.jit(lambda x, t: fj.cross_entropy(x, t, softcap=4.0, reduction="none"))
    ref.assert_close(f64(f(logits, target)), ref.cross_entropy_fwd(logits, target, softcap=4.0)[0], "float32")
    check_none(logits, target, "bfloat16", {"softcap": 4.0})


def test_vmap_and_vmap_of_grad():
    parts = [make((6,), 11, "float32", seed=s) for s in range(3)]
    xs, ts = jnp.stack([p[0] for p in parts]), jnp.stack([p[1] for p in parts])
    losses = jax.vmap(lambda x, t: fj.cross_entropy(x, t, z_loss=1e-3))(xs, ts)
    grads = jax.vmap(jax.grad(lambda x, t: fj.cross_entropy(x, t, z_loss=1e-3)))(xs, ts)
    for i in range(3):
        np.testing.assert_allclose(float(losses[i]), float(fj.cross_entropy(xs[i], ts[i], z_loss=1e-3)), rtol=1e-6)
        want = jax.grad(lambda x, t=ts[i]: fj.cross_entropy(x, t, z_loss=1e-3))(xs[i])
        np.testing.assert_allclose(np.asarray(grads[i]), np.asarray(want), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(0,), (2, 0)], ids=["0", "2x0"])
def test_empty_batch(shape):
    logits, target = make(shape, 11, "float32")
    assert fj.cross_entropy(logits, target, reduction="none").shape == shape
    assert float(fj.cross_entropy(logits, target)) == 0.0
    assert jax.grad(lambda x: fj.cross_entropy(x, target))(logits).shape == (*shape, 11)


def test_fwd_bwd_helper(dtype):
    assert fj.cross_entropy.fwd_bwd is fwd_bwd
    logits, target = make((3, 5), 301, dtype)
    opts = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 15.0}
    loss, z, dlogits = fwd_bwd(logits, target, grad_scale=0.25, **opts)
    o = full_options(opts)
    l_ref, z_ref, _ = ref.cross_entropy_fwd(logits, target, **o)
    ref.assert_close(f64(loss), l_ref, "float32", name="loss")
    ref.assert_close(f64(z), z_ref, "float32", name="z")
    assert dlogits.dtype == logits.dtype
    ref.assert_close(f64(dlogits), ref.cross_entropy_bwd(np.full(target.shape, 0.25), logits, target, **o), dtype, name="dlogits")


def test_fwd_bwd_may_reuse_the_logits_buffer():
    """fwd_bwd's FFI call aliases its dlogits output to the logits input; the custom_vjp backward
    does not (a live input would be copied first)."""
    logits, target = make((4,), 8, "float32")
    grad_text = jax.jit(jax.grad(lambda x: fj.cross_entropy(x, target))).lower(logits).as_text()
    fused_text = jax.jit(lambda x: fwd_bwd(x, target)).lower(logits).as_text()
    assert "output_operand_aliases" in fused_text and "output_operand_aliases" not in grad_text
    donated = jax.jit(lambda x: fwd_bwd(x, target)[2], donate_argnums=0)
    want = fwd_bwd(logits, target)[2]
    np.testing.assert_array_equal(np.asarray(donated(jnp.array(logits))), np.asarray(want))


def test_ignore_index_outside_the_target_dtype():
    """An int32 target cannot hold ignore_index 2**32: every token counts."""
    logits, target = make((6,), 5, "float32", ignore_every=0)
    a = fj.cross_entropy(logits, target, ignore_index=2**32)
    np.testing.assert_allclose(float(a), float(fj.cross_entropy(logits, target)), rtol=1e-6)
