"""fuselet.jax fused_linear_jsd against the unfused loss (both heads' logits materialized) and
against fuselet.torch's."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")


def unfused(hs, ws, ht, wt, labels, beta, temperature):
    s = jax.nn.log_softmax((hs @ ws.T).astype(jnp.float32) / temperature, -1).reshape(-1, ws.shape[0])
    t = jax.nn.log_softmax((ht @ wt.T).astype(jnp.float32) / temperature, -1).reshape(-1, ws.shape[0])
    p, q = jnp.exp(t), jnp.exp(s)
    if beta == 0.0:
        rows = jnp.sum(p * (t - s), -1)
    elif beta == 1.0:
        rows = jnp.sum(q * (s - t), -1)
    else:
        m = jnp.log(beta * p + (1 - beta) * q)
        rows = jnp.sum(beta * p * (t - m) + (1 - beta) * q * (s - m), -1)
    keep = jnp.ones(rows.shape) if labels is None else (labels.reshape(-1) != -100).astype(jnp.float32)
    return jnp.sum(rows * keep) / jnp.maximum(jnp.sum(keep), 1)


def float64_loss_and_grads(hs, ws, ht, wt, labels, beta, temperature):
    """The loss and the student's gradients in float64 (numpy): log_softmax of both models' logits,
    the generalized JSD per token, its gradient through the student's log_softmax and head."""
    hs, ws, ht, wt = (np.asarray(a, np.float64) for a in (hs, ws, ht, wt))
    h = hs.reshape(-1, hs.shape[-1])

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    s = log_softmax(h @ ws.T / temperature)
    t = log_softmax(ht.reshape(-1, ht.shape[-1]) @ wt.T / temperature)
    p, q = np.exp(t), np.exp(s)
    if beta == 0.0:
        rows, ds = np.sum(p * (t - s), -1), -p
    elif beta == 1.0:
        rows, ds = np.sum(q * (s - t), -1), q * (s - t + 1)
    else:
        m = np.log(beta * p + (1 - beta) * q)
        rows, ds = np.sum(beta * p * (t - m) + (1 - beta) * q * (s - m), -1), (1 - beta) * q * (s - m)
    keep = np.ones(rows.shape) if labels is None else (np.asarray(labels).reshape(-1) != -100).astype(np.float64)
    w = keep / max(keep.sum(), 1)
    dz = w[:, None] * (ds - q * ds.sum(-1, keepdims=True)) / temperature
    return float(np.sum(rows * w)), (dz @ ws).reshape(hs.shape), dz.T @ h


def models(seed=0):
    rng = np.random.default_rng(seed)
    hs = jnp.asarray(rng.standard_normal((3, 11, 16)), jnp.float32)
    ws = jnp.asarray(rng.standard_normal((50, 16)) * 0.3, jnp.float32)
    ht = jnp.asarray(rng.standard_normal((3, 11, 24)), jnp.float32)
    wt = jnp.asarray(rng.standard_normal((50, 24)) * 0.3, jnp.float32)
    labels = rng.integers(0, 50, (3, 11)).astype(np.int32)
    labels[0, :4] = -100
    return hs, ws, ht, wt, jnp.asarray(labels)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("chunk_size", [None, 4, 7])
def test_matches_unfused(beta, chunk_size):
    hs, ws, ht, wt, labels = models()
    fused = jax.value_and_grad(
        lambda h, w: fj.fused_linear_jsd(h, w, ht, wt, labels, beta=beta, temperature=2.0, chunk_size=chunk_size), (0, 1)
    )
    plain = jax.value_and_grad(lambda h, w: unfused(h, w, ht, wt, labels, beta, 2.0), (0, 1))
    (a, ga), (b, gb) = fused(hs, ws), plain(hs, ws)
    np.testing.assert_allclose(float(a), float(b), rtol=1e-5, atol=1e-6)
    for x, y in zip(ga, gb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
    loss64, *grads64 = float64_loss_and_grads(hs, ws, ht, wt, labels, beta, 2.0)
    np.testing.assert_allclose(float(a), loss64, rtol=1e-5, atol=1e-6)
    for x, y in zip(ga, grads64):
        np.testing.assert_allclose(np.asarray(x, np.float64), y, rtol=1e-4, atol=1e-6)


def test_jit_and_teacher_cotangents_are_zero():
    hs, ws, ht, wt, labels = models(1)
    grads = jax.jit(jax.grad(lambda h, t: fj.fused_linear_jsd(h, ws, t, wt, labels, chunk_size=5), (0, 1)))(hs, ht)
    assert float(jnp.abs(grads[0]).sum()) > 0 and float(jnp.abs(grads[1]).sum()) == 0.0


def test_same_as_torch():
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    hs, ws, ht, wt, labels = models(2)
    a = fj.fused_linear_jsd(hs, ws, ht, wt, labels, beta=0.3, chunk_size=8)
    t = [torch.from_numpy(np.array(x)) for x in (hs, ws, ht, wt, labels)]
    b = ft.fused_linear_jsd(*t, beta=0.3, chunk_size=8)
    assert float(a) == pytest.approx(float(b), rel=1e-6)


# --- the per-token form: fused_linear_jsd_per_token, against fuselet.torch's ----------------------

PER_TOKEN_OPTIONS = {
    "plain": {},
    "scales": {"temperature": 1.3, "student_logit_scale": 0.5, "teacher_logit_scale": 2.0},
    "softcaps": {"student_softcap": 3.0, "teacher_softcap": 5.0, "temperature": 0.9},
    "all": {"temperature": 0.8, "student_logit_scale": 1.5, "student_softcap": 4.0, "teacher_softcap": 2.5},
}


def per_token_models(seed=0):
    hs, ws, ht, wt, _ = models(seed)
    rng = np.random.default_rng(seed + 100)
    bs, bt = (jnp.asarray(rng.standard_normal(50), jnp.float32) for _ in range(2))
    return hs, ws, ht, wt, bs, bt


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("case", list(PER_TOKEN_OPTIONS))
@pytest.mark.parametrize("bias", [False, True])
def test_per_token_same_as_torch(beta, case, bias):
    """Every token's divergence and entropy and the gradients of a weighted sum of the divergences to
    the student's hidden, weight and bias, under jit: fuselet.torch's within 1e-5 of their scale."""
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    hs, ws, ht, wt, bs, bt = per_token_models(1)
    bs, bt = (bs, bt) if bias else (None, None)
    options = {"beta": beta, "with_entropy": True, "chunk_size": 7, **PER_TOKEN_OPTIONS[case]}
    weights = np.random.default_rng(2).standard_normal(hs.shape[:-1]).astype(np.float32)

    def loss(h, w, b):
        got = fj.fused_linear_jsd_per_token(h, w, ht, wt, student_bias=b, teacher_bias=bt, **options)
        return jnp.sum(got.divergence * weights), got

    (_, got), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(hs, ws, bs)
    t = [None if a is None else torch.from_numpy(np.array(a)) for a in (hs, ws, ht, wt, bs, bt)]
    params = [p.requires_grad_(True) for p in (t[0], t[1], t[4]) if p is not None]
    want = ft.fused_linear_jsd_per_token(*t[:4], student_bias=t[4], teacher_bias=t[5], **options)
    wants = torch.autograd.grad((want.divergence * torch.from_numpy(weights)).sum(), params)
    pairs = [(got.divergence, want.divergence), (got.entropy, want.entropy), *zip([g for g in grads if g is not None], wants)]
    for name, (a, b) in zip(("divergence", "entropy", "d hidden", "d weight", "d bias"), pairs):
        b = b.detach().numpy()
        assert a.shape == b.shape, name
        scale = max(np.abs(b).max(), 1.0)
        np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-5 * scale, err_msg=name)


def test_per_token_teacher_and_entropy_get_no_gradient():
    hs, ws, ht, wt, bs, bt = per_token_models(3)

    def loss(h, t, w_t, b_t):
        got = fj.fused_linear_jsd_per_token(h, ws, t, w_t, student_bias=bs, teacher_bias=b_t, with_entropy=True, chunk_size=5)
        return jnp.sum(got.divergence) + jnp.sum(got.entropy)

    grads = jax.jit(jax.grad(loss, (0, 1, 2, 3)))(hs, ht, wt, bt)
    assert float(jnp.abs(grads[0]).sum()) > 0 and all(float(jnp.abs(g).sum()) == 0.0 for g in grads[1:])
    entropy_only = jax.grad(
        lambda h: jnp.sum(fj.fused_linear_jsd_per_token(h, ws, ht, wt, with_entropy=True).entropy)
    )(hs)  # fmt: skip
    assert float(jnp.abs(entropy_only).sum()) == 0.0
