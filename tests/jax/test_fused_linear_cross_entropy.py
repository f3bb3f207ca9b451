"""fuselet.jax.fused_linear_cross_entropy against the float64 reference (tests/reference.py) and
against fuselet's own cross_entropy of the materialized logits."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
jnp = pytest.importorskip("jax.numpy")
P = pytest.importorskip("jax.sharding").PartitionSpec
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


def test_bad_axis_name_and_vocab_size():
    """axis_name= / vocab_size= (the vocab-parallel form inside shard_map): named errors, from
    every function that takes them."""
    hidden, weight, bias, target = inputs()
    logits = hidden @ weight.T
    for call in (
        lambda **kw: fj.fused_linear_cross_entropy(hidden, weight, target, **kw),
        lambda **kw: fj.cross_entropy(logits, target, **kw),
        lambda **kw: fj.fused_linear_logprobs(hidden, weight, target, **kw),
        lambda **kw: fj.fused_linear_jsd(hidden, weight, hidden, weight, target, **kw),
    ):
        with pytest.raises(TypeError, match="axis_name: expected None, a mesh axis name \\(str\\) or a tuple of them, got 3"):
            call(axis_name=3)
        with pytest.raises(ValueError, match="vocab_size: expected None without axis_name"):
            call(vocab_size=5)
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:1])
    v = weight.shape[0]

    def bad(h, w, t):
        return fj.fused_linear_cross_entropy(h, w, t, axis_name="model", vocab_size=v + 1)

    sm = jax.shard_map(bad, mesh=mesh, in_specs=(P(), P("model"), P()), out_specs=P())
    with pytest.raises(ValueError, match=rf"vocab_size: expected in \(0, {v}\] .* got {v + 1}"):
        jax.jit(sm)(hidden, weight, target)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_axis_name_on_one_device(reduction):
    """axis_name= over a mesh axis of one device (the vocab-parallel math, no peers): the loss and
    gradients of the plain call; the last 3 classes padding (vocab_size=V - 3, NaN rows)."""
    hidden, weight, bias, target = inputs()
    v = weight.shape[0]
    target = jnp.where(target >= v - 3, 1, target)
    kw = dict(label_smoothing=0.1, z_loss=1e-3, softcap=6.0, reduction=reduction, chunk_size=7)
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:1])
    padded_w = weight.at[v - 3 :].set(jnp.nan)
    padded_b = bias.at[v - 3 :].set(jnp.nan)

    def local(h, w, b, t):
        return jnp.sum(fj.fused_linear_cross_entropy(h, w, t, bias=b, axis_name="model", vocab_size=v - 3, **kw))

    sm = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("model"), P("model"), P()), out_specs=P())
    got = jax.jit(jax.value_and_grad(sm, argnums=(0, 1, 2)))(hidden, padded_w, padded_b, target)

    def plain(h, w, b, t):
        return jnp.sum(fj.fused_linear_cross_entropy(h, w, t, bias=b, **kw))

    expected = jax.value_and_grad(plain, argnums=(0, 1, 2))(hidden, weight[: v - 3], bias[: v - 3], target)
    np.testing.assert_allclose(float(got[0]), float(expected[0]), rtol=1e-5)
    for name, g, e in zip(("hidden", "weight", "bias"), got[1], expected[1]):
        g = g if name == "hidden" else g[: v - 3]
        assert not np.any(np.isnan(np.asarray(g))), name
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-6, err_msg=f"d{name}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_logits_are_xla_matmuls(dtype):
    """A 16-bit head on the CPU: the chunk loop's matmuls take the weight in float32, converted once,
    as XLA's own 16-bit matmuls compute: each token's loss is exactly cross_entropy of the logits
    hidden @ weight.T + bias that jnp gives."""
    kw = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 10.0, "reduction": "none"}
    hidden, weight, bias, target = inputs(n=300, h=64, v=1000, dtype=dtype)
    ours = fj.fused_linear_cross_entropy(hidden, weight, target, bias=bias, chunk_size=16, **kw)
    unfused = jax.jit(lambda h, w, b: fj.cross_entropy(h @ w.T + b, target, **kw))(hidden, weight, bias)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(unfused))


def _step_temp_bytes(loss, dtype, n=128, h=1024, v=4096):
    """XLA's temporary bytes (buffer assignment, CPU) of a jitted value_and_grad of
    loss(hidden, weight, target, teacher_hidden, teacher_weight) over hidden and the weight, on
    hidden [n, h] and weights [v, h]: what the step holds beyond its inputs and outputs."""
    cpu = jax.devices("cpu")[0]
    arrays = [jax.device_put(jnp.zeros(s, dtype), cpu) for s in ((n, h), (v, h), (n, h), (v, h))]
    arrays.insert(2, jax.device_put(jnp.zeros((n,), jnp.int32), cpu))
    step = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(loss(*a)), argnums=(0, 1)))
    return step.lower(*arrays).compile().memory_analysis().temp_size_in_bytes


# the chunk loops: (the 16-bit heads converted for the matmuls, loss(hidden, weight, target, teacher_hidden, teacher_weight))
LOOPS = {
    "mean": (1, lambda h, w, t, *_: fj.fused_linear_cross_entropy(h, w, t, chunk_size=16)),
    "none": (1, lambda h, w, t, *_: fj.fused_linear_cross_entropy(h, w, t, reduction="none", chunk_size=16)),
    "logprobs": (1, lambda h, w, t, *_: fj.fused_linear_logprobs(h, w, t, outputs=("entropy",), chunk_size=16).entropy),
    "jsd": (2, lambda h, w, t, ht, wt: fj.fused_linear_jsd(h, w, ht, wt, chunk_size=16)),
    # the reference model's loop (its head's float32 copy) runs before the backward's accumulators exist
    "dpo": (
        1,
        lambda h, w, t, ht, wt: fj.fused_linear_preference_loss(
            _seqs(h), w, _seqs(t), ref_hidden=_seqs(ht), ref_weight=wt, chunk_size=16
        ),
    ),
}


def _seqs(a):
    """Tokens [n, ...] as one chosen and one rejected sequence [2, n / 2, ...]."""
    return a.reshape(2, -1, *a.shape[1:])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("loop", LOOPS)
def test_chunk_loop_keeps_no_head_sized_temporaries(loop, dtype):
    """A training step's temporaries, in units of a float32 head [V, H] (V H large beside a chunk's
    logits): the dweight accumulator is the step's output, and each chunk's share is added a block
    of rows at a time (no [V, H] product per chunk); with 16-bit heads, the float32 dweight
    accumulator and one float32 copy of each head (fused_linear_jsd: the teacher's too), where
    XLA's own conversion would keep two copies of each for the loop (with the product, 4 heads
    for one)."""
    heads, loss = LOOPS[loop]
    allowed = (0 if dtype == "float32" else heads + 1) + 0.25  # + a block's product and the chunk-sized buffers
    assert _step_temp_bytes(loss, dtype) / (4096 * 1024 * 4) <= allowed
