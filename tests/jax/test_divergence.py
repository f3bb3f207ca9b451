"""fuselet.jax kl_div, jsd and tvd against the float64 reference (tests/reference.py): forward,
grad of both arguments, jit, vmap, and the same values as fuselet.torch's ops."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
f64 = ref.to_float64
CASES = [
    ("kl_div", {"log_target": True}),
    ("kl_div", {"log_target": False}),
    ("jsd", {"beta": 0.0}),
    ("jsd", {"beta": 0.3}),
    ("jsd", {"beta": 1.0}),
    ("tvd", {}),
]
IDS = [f"{op}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for op, o in CASES]


def pair(shape, dtype, device=None, seed=0, log_target=True):
    rng = np.random.default_rng(seed)
    x = ref.log_softmax(rng.standard_normal(shape) * 2.0)
    t = ref.log_softmax(rng.standard_normal(shape) * 2.0)
    if not log_target:
        t = np.exp(t)
    dt = ref.NUMPY_DTYPES[dtype]
    return jax.device_put(jnp.asarray(x.astype(dt)), device), jax.device_put(jnp.asarray(t.astype(dt)), device)


def loss_fn(op, labels=None, **o):
    if op == "kl_div":
        return lambda x, t: fj.kl_div(x, t, **o)
    return lambda x, t: getattr(fj, op)(x, t, labels=labels, **o)


def expected(op, x, t, labels=None, **o):
    log_target, beta = o.get("log_target", True), o.get("beta", 0.0)
    rows = ref.divergence_fwd(op, x, t, log_target, beta)
    if op == "kl_div":
        keep, scale = np.ones(rows.shape, bool), 1.0 / x.shape[0]
    else:
        keep = np.ones(rows.shape, bool) if labels is None else np.asarray(labels) != -100
        scale = 1.0 / max(keep.sum(), 1)
    dx, dt = ref.divergence_bwd(op, np.where(keep, scale, 0.0), x, t, log_target, beta)
    return float(np.sum(np.where(keep, rows, 0.0)) * scale), dx, dt


@pytest.mark.parametrize("op,options", CASES, ids=IDS)
def test_forward_grad(op, options, dtype, jax_device):
    x, t = pair((3, 5, 127), dtype, jax_device, log_target=options.get("log_target", True))
    labels = None if op == "kl_div" else jnp.asarray([[1, -100, 2, 3, 4]] * 3, jnp.int32)
    fn = loss_fn(op, labels, **options)
    loss = fn(x, t)
    assert loss.dtype == jnp.float32 and loss.shape == ()
    want, dx, dt = expected(op, x, t, labels, **options)
    ref.assert_close(float(loss), want, dtype, "reduce", rows=15, name="loss")
    gx, gt = jax.grad(fn, argnums=(0, 1))(x, t)
    assert gx.dtype == x.dtype and gt.dtype == t.dtype
    ref.assert_close(f64(gx), dx, dtype, "out", name="dinput")
    ref.assert_close(f64(gt), dt, dtype, "out", name="dtarget")


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
def test_kl_div_reductions(reduction):
    x, t = pair((4, 6, 50), "float32", log_target=False)
    got = fj.kl_div(x, t, reduction=reduction)
    elems = np.where(f64(t) > 0, f64(t) * (np.log(f64(t)) - f64(x)), 0.0)
    want = {"batchmean": elems.sum() / 4, "sum": elems.sum(), "mean": elems.mean(), "none": elems}[reduction]
    np.testing.assert_allclose(f64(got), want, rtol=1e-5, atol=1e-6)


def test_jit():
    x, t = pair((2, 5, 33), "bfloat16")
    labels = jnp.asarray([[0, 1, -100, 2, 3], [-100] * 5], jnp.int32)
    fn = loss_fn("jsd", labels, beta=0.25)
    want, dx, _ = expected("jsd", x, t, labels, beta=0.25)
    ref.assert_close(float(jax.jit(fn)(x, t)), want, "bfloat16", "reduce", rows=10, name="loss")
    ref.assert_close(f64(jax.jit(jax.grad(fn))(x, t)), dx, "bfloat16", "out", name="dinput")


def test_vmap_and_vmap_of_grad():
    parts = [pair((6, 20), "float32", seed=s) for s in range(3)]
    xs, ts = jnp.stack([p[0] for p in parts]), jnp.stack([p[1] for p in parts])
    fn = loss_fn("tvd")
    losses = jax.vmap(fn)(xs, ts)
    grads = jax.vmap(jax.grad(fn))(xs, ts)
    for i in range(3):
        want, dx, _ = expected("tvd", xs[i], ts[i])
        np.testing.assert_allclose(float(losses[i]), want, rtol=1e-5)
        np.testing.assert_allclose(f64(grads[i]), dx, rtol=1e-5, atol=1e-6)


def test_unused_target_gradient_is_not_computed():
    """Under jit, the gradient of a teacher under stop_gradient is dropped: one backward call."""
    x, t = pair((4, 16), "float32")
    hlo = jax.jit(jax.grad(lambda a, b: fj.jsd(a, jax.lax.stop_gradient(b)))).lower(x, t).compile().as_text()
    assert hlo.count("fuselet_divergence_bwd") == 1, hlo


def test_same_as_torch():
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    x, t = pair((3, 40), "float32", seed=5)
    xt, tt = (torch.from_numpy(np.array(a)) for a in (x, t))
    for op, o in CASES:
        if not o.get("log_target", True):
            continue
        a = float(loss_fn(op, **o)(x, t))
        b = float(ft.kl_div(xt, tt, **o) if op == "kl_div" else getattr(ft, op)(xt, tt, **o))
        assert a == pytest.approx(b, rel=1e-6), op


def test_empty_rows():
    x, t = pair((0, 8), "float32")
    assert float(fj.jsd(x, t)) == 0.0
    assert jax.grad(loss_fn("jsd"))(x, t).shape == (0, 8)
