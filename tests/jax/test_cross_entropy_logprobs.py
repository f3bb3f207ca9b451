"""fuselet.jax's log-probabilities of a chunk of logits (cross_entropy.logprobs_chunk and
logprobs_chunk_grad, the FFI targets logprobs_fwd and logprobs_bwd) against the float64 reference
(tests/reference.py): every output, softcap, ignored tokens, ties for is_top1, the gradient of
log_probs and entropy, under jit."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")
from fuselet.jax.cross_entropy import logprobs_chunk, logprobs_chunk_grad  # noqa: E402

f64 = ref.to_float64
ALL = frozenset({"entropy", "log_sum_sq_probs", "mean_logits", "is_top1"})
TIE = 16.0  # exact in every dtype, above every random logit


def make(n, vocab, dtype, device=None, seed=0, ignore_index=-100):
    """As tests/torch/test_cross_entropy_logprobs.py's: every 4th token ignored, tokens 2 mod 4
    tie their target's logit with another class's at the row's max (before it, or after it)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, vocab)) * 3.0
    target = rng.integers(0, vocab, n)
    for r in range(2, n, 4):
        other = (target[r] - 1) % vocab if r % 8 == 2 else (target[r] + 1) % vocab
        logits[r, target[r]] = logits[r, other] = TIE
    target[1::4] = ignore_index
    logits = logits.astype(ref.NUMPY_DTYPES[dtype])
    return jax.device_put(jnp.asarray(logits), device), jax.device_put(jnp.asarray(target.astype(np.int32)), device)


@pytest.mark.parametrize("softcap", [None, 5.0], ids=["plain", "softcap"])
@pytest.mark.parametrize("vocab", [1, 3, 4097])
def test_forward_grad(dtype, vocab, softcap, jax_device):
    logits, target = make(11, vocab, dtype, jax_device)
    out = logprobs_chunk(logits, target, ignore_index=-100, softcap=softcap, outputs=ALL)
    assert set(out) == {"log_probs", "lse", *ALL}
    want = ref.logprobs_fwd(f64(logits), np.asarray(target), -100, softcap)
    for name, value in out.items():
        assert value.shape == target.shape
        if name == "is_top1":
            assert value.dtype == jnp.bool_
            np.testing.assert_array_equal(np.asarray(value), want[name].astype(bool), err_msg=name)
        else:
            assert value.dtype == jnp.float32
            ref.assert_close(f64(value), want[name], "float32", name=name)
    if vocab > 1:
        t = np.asarray(target)
        expect = [(t[r] + (vocab - 1 if r % 8 == 2 else 1)) % vocab > t[r] for r in range(2, 11, 4)]
        assert np.asarray(out["is_top1"])[2::4].tolist() == expect, "ties go to the lowest index"
    rng = np.random.default_rng(1)
    dlogp, dentropy = (jnp.asarray(rng.standard_normal(11), jnp.float32) for _ in range(2))
    dx = logprobs_chunk_grad(logits, target, out["lse"], out["entropy"], dlogp, dentropy, ignore_index=-100, softcap=softcap)
    assert dx.dtype == logits.dtype and dx.shape == logits.shape
    want_dx = ref.logprobs_bwd(f64(dlogp), f64(dentropy), f64(logits), np.asarray(target), -100, softcap)
    ref.assert_close(f64(dx), want_dx, dtype, name="dlogits")


@pytest.mark.parametrize("which", ["dlogp", "dentropy"])
def test_gradient_of_one(which, jax_device):
    logits, target = make(9, 257, "float32", jax_device, seed=3, ignore_index=2)
    out = logprobs_chunk(logits, target, ignore_index=2, softcap=10.0, outputs={"entropy"})
    assert set(out) == {"log_probs", "lse", "entropy"}
    g = jnp.asarray(np.random.default_rng(4).standard_normal(9), jnp.float32)
    dlogp, dentropy = (g, None) if which == "dlogp" else (None, g)
    entropy = out["entropy"] if which == "dentropy" else None
    dx = logprobs_chunk_grad(logits, target, out["lse"], entropy, dlogp, dentropy, ignore_index=2, softcap=10.0)
    want = ref.logprobs_bwd(
        None if dlogp is None else f64(dlogp),
        None if dentropy is None else f64(dentropy),
        f64(logits),
        np.asarray(target),
        2,
        10.0,
    )
    ref.assert_close(f64(dx), want, "float32", name=f"dlogits of {which}")


def test_jit_and_leading_dims():
    logits, target = make(12, 50, "bfloat16")

    @jax.jit
    def step(x, t):
        out = logprobs_chunk(x, t, ignore_index=-100, softcap=None, outputs={"entropy", "mean_logits"})
        return out, logprobs_chunk_grad(x, t, out["lse"], out["entropy"], out["log_probs"], None, ignore_index=-100, softcap=None)

    out, dx = step(logits.reshape(3, 4, 50), target.reshape(3, 4))
    eager = logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs={"entropy", "mean_logits"})
    assert set(out) == {"log_probs", "lse", "entropy", "mean_logits"}
    for name in out:
        assert out[name].shape == (3, 4)
        np.testing.assert_array_equal(np.asarray(out[name]).reshape(12), np.asarray(eager[name]), err_msg=name)
    want = ref.logprobs_bwd(f64(eager["log_probs"]), None, f64(logits), np.asarray(target))
    ref.assert_close(f64(dx).reshape(12, 50), want, "bfloat16", name="dlogits")


@pytest.mark.parametrize("bad", [50, -1])
def test_bad_target_value(bad):
    logits, target = make(4, 50, "float32")
    target = target.at[3].set(bad)
    with pytest.raises(ValueError, match=rf"target: element 3 is {bad}, outside \[0, 50\)"):
        logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs=set())


def test_dentropy_needs_entropy():
    logits, target = make(4, 8, "float32")
    out = logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs=set())
    with pytest.raises(ValueError, match=r"entropy: expected a tensor \(the forward's entropy, needed with dentropy\)"):
        logprobs_chunk_grad(logits, target, out["lse"], None, None, jnp.ones(4), ignore_index=-100, softcap=None)
