"""fuselet.jax.fused_linear_logprobs against the float64 reference (tests/reference.py): every
output and the gradients of the log-probabilities and the entropy under jit, in every dtype, with
temperature, logit scale, softcap, bias and ignored tokens, over chunk sizes."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

fj = import_layer("jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
OPTIONS = {
    "plain": {},
    "temperature-bias": {"temperature": 0.7, "bias": True},
    "all": {"temperature": 1.3, "logit_scale": 0.6, "softcap": 3.0, "bias": True, "ignore_index": 2},
}
# as tests/torch/test_fused_linear_logprobs.py: float32 math over logits in the inputs' dtype
TOL = {"float32": (1e-5, 1e-5, 1e-4, 1e-5), "float16": (5e-3, 5e-3, 2e-2, 2e-2), "bfloat16": (5e-2, 5e-2, 1e-1, 1e-1)}


def inputs(n=37, h=16, v=29, dtype="float32", bias=False, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((2, n, h)), dtype)
    weight = jnp.asarray(rng.standard_normal((v, h)) * h**-0.5 * 3, dtype)
    b = jnp.asarray(rng.standard_normal(v), dtype) if bias else None
    target = rng.integers(0, v, (2, n)).astype(np.int32)
    logits = np.asarray(hidden, np.float32) @ np.asarray(weight, np.float32).T
    target.reshape(-1)[::5] = logits.argmax(-1).reshape(-1)[::5]  # argmax hits: is_top1 both ways
    return hidden, weight, b, jnp.asarray(target)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("chunk", [None, 7])
def test_against_reference(dtype, options, chunk):
    kw = dict(OPTIONS[options])
    hidden, weight, bias, target = inputs(dtype=dtype, bias=kw.pop("bias", False))
    g_logp = jnp.linspace(-1.0, 1.5, target.size).reshape(target.shape)
    g_entropy = jnp.linspace(0.5, 1.5, target.size).reshape(target.shape)

    def loss(h, w, b):
        got = fj.fused_linear_logprobs(h, w, target, bias=b, outputs=OUTPUTS, chunk_size=chunk, **kw)
        return jnp.sum(got.log_probs * g_logp + got.entropy * g_entropy), got

    (_, got), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(hidden, weight, bias)
    assert isinstance(got, fj.LogProbs) and got.is_top1.dtype == jnp.bool_
    h = hidden.shape[-1]
    want, want_grads = ref.fused_linear_logprobs(
        ref.to_float64(hidden).reshape(-1, h),
        ref.to_float64(weight),
        None if bias is None else ref.to_float64(bias),
        np.asarray(target).reshape(-1),
        np.asarray(g_logp, np.float64).reshape(-1),
        np.asarray(g_entropy, np.float64).reshape(-1),
        **kw,
    )
    rtol, atol, grtol, gatol = TOL[dtype]
    for name in ("log_probs", *OUTPUTS):
        value = getattr(got, name)
        assert value.shape == target.shape, name
        flat = np.asarray(value, np.float64).reshape(-1)
        if name == "is_top1":
            assert 0 < flat.sum() < target.size, "is_top1: all or none, which tests nothing"
            assert (flat == want[name]).mean() >= (1.0 if dtype == "float32" else 0.9), name
        else:
            assert value.dtype == jnp.float32, name
            np.testing.assert_allclose(flat, want[name], rtol=rtol, atol=atol, err_msg=name)
    for name, g, expected in zip(("hidden", "weight", "bias"), grads, want_grads):
        if expected is not None:
            np.testing.assert_allclose(
                ref.to_float64(g).reshape(expected.shape), expected, rtol=grtol, atol=gatol, err_msg=f"d{name}"
            )


def test_eager_equals_torch_layer():
    """The same outputs as fuselet.torch's on the same arrays."""
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    hidden, weight, bias, target = inputs(bias=True)
    kw = {"temperature": 0.9, "softcap": 5.0, "outputs": OUTPUTS}
    got = fj.fused_linear_logprobs(hidden, weight, target, bias=bias, **kw)
    t = [torch.from_numpy(np.asarray(a)) for a in (hidden, weight, bias, target)]
    want = ft.fused_linear_logprobs(t[0], t[1], t[3].long(), bias=t[2], **kw)
    for name, a, b in zip(got._fields, got, want):
        np.testing.assert_allclose(np.asarray(a, np.float64), b.double().numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
