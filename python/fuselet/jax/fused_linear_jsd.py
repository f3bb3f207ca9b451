"""The distillation loss fused with both LM heads, for JAX: the generalized JSD of a student's and
a teacher's token distributions from their last hidden states, without [tokens, V] logits.

As fuselet.torch.fused_linear_jsd: the tokens are taken chunk by chunk (a lax.scan; the last chunk
padded with tokens that count for nothing), each chunk's logits of both models from jnp's matmul (in
the inputs' dtype), one pass of fuselet's divergence kernel over them (divergence_logits: both
log_softmaxes, the loss per token and its gradient through the student's log_softmax and the
temperature), then the head's matmuls. The loss is a mean, so the gradients are computed in the forward (custom_vjp)
and kept as its residuals instead of any logits. Gradients flow to the student (hidden and
weight) only: the teacher's cotangents are zeros. Rules: fuselet/spec/fused_linear_jsd.py.

Sharded (fuselet.jax._vocab_parallel_jsd, docs/tensor_parallel.md): the loop is one
custom_partitioning call, each device running it over its own tokens, and with the heads sharded
on V over mesh axes over its own classes (vocab-parallel: the heads never gathered).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fuselet.jax import _vocab_parallel as vp
from fuselet.jax import _vocab_parallel_jsd as vpj
from fuselet.jax._checks import array_facts
from fuselet.jax._sharding import vary_like, varying_axes
from fuselet.jax.cross_entropy import logprobs_chunk
from fuselet.jax.divergence import _logits_call
from fuselet.jax.fused_linear_cross_entropy import (
    _accumulate,
    _add_dweight,
    _dhidden,
    _logits,
    _over_chunks,
    _with_heads,
    _zeros,
)
from fuselet.spec import fused_linear_jsd as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for


def _loss_and_grads(hs, ws, ht, wt, weight_of, options: spec.FusedLinearJSDOptions, chunk):
    n, inv_t = hs.shape[0], 1.0 / options.temperature
    pad = -n % chunk
    chunks = (n + pad) // chunk
    jsd = options.divergence

    def split(a):
        return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(chunks, chunk, *a.shape[1:])

    common = jnp.promote_types(hs.dtype, ht.dtype)  # the kernel's one dtype: both models' where they differ

    def loop(ws_mm, wt_mm):  # the heads as the matmuls take them (_with_heads)
        def step(dws, xs):
            h, t, g = xs
            # one pass: both log_softmaxes, the divergence and its gradient through the student's
            # log_softmax and the temperature, over the logits in their dtype
            z, zt = _logits(h, ws_mm, None).astype(common), _logits(t, wt_mm, None).astype(common)
            rows, dlogits = _logits_call(z, zt, g, jsd, inv_t)
            dlogits = dlogits.astype(ws.dtype)
            return _add_dweight(dws, dlogits, h), (jnp.sum(jnp.where(g > 0, rows * g, 0.0)), _dhidden(dlogits, ws_mm))

        return jax.lax.scan(step, jnp.zeros(ws.shape, jnp.float32), (split(hs), split(ht), split(weight_of)))

    dws, (losses, dhs) = _with_heads(loop, ws, wt)
    return jnp.sum(losses), dhs.reshape(-1, hs.shape[1])[:n], dws.astype(ws.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(hs, ws, ht, wt, weight_of, options, chunk, axis=None, vocab_size=None):
    return _fused_fwd(hs, ws, ht, wt, weight_of, options, chunk, axis, vocab_size)[0]


def _fused_fwd(hs, ws, ht, wt, weight_of, options, chunk, axis=None, vocab_size=None):
    loss, dhs, dws = vpj.loss_and_grads(_loss_and_grads, hs, ws, ht, wt, weight_of, options, chunk, axis, vocab_size)
    return loss, (dhs, dws, ht, wt, weight_of)


def _fused_bwd(options, chunk, axis, vocab_size, res, g):
    dhs, dws, ht, wt, weight_of = res
    return (
        dhs * g.astype(dhs.dtype),
        dws * g.astype(dws.dtype),
        jnp.zeros_like(ht),
        jnp.zeros_like(wt),
        jnp.zeros_like(weight_of),
    )


_fused.defvjp(_fused_fwd, _fused_bwd)
_fused_jit = jax.jit(_fused, static_argnums=(5, 6))


def fused_linear_jsd(
    student_hidden,
    student_weight,
    teacher_hidden,
    teacher_weight,
    labels=None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    axis_name=None,
    vocab_size: int | None = None,
):
    """The generalized JSD (jsd's beta: 0 forward KL, 1 reverse KL) of the student's and the
    teacher's softmax(hidden @ weight.T / temperature), the mean over the tokens whose label is not
    ignore_index, without [tokens, V] logits. student_hidden [..., Hs], student_weight [V, Hs],
    teacher_hidden [..., Ht] (the same tokens; Ht may differ), teacher_weight [V, Ht], labels the
    tokens' shape or None. float32 loss; gradients to the student only.

    Under jax.jit, heads sharded on V over mesh axes stay sharded (docs/tensor_parallel.md).
    Inside shard_map, axis_name (a mesh axis name or a tuple of them) says that student_weight and
    teacher_weight are this device's blocks of the classes over that axis, in axis order: the loss
    and student_hidden's gradient are the whole heads' (alike on every device of the axis), the
    student head's gradient this block's; the mean is over this device's tokens. vocab_size (with
    axis_name): the real V where the blocks are padded (the classes from vocab_size on are
    ignored); None: V_r times the axis size."""
    arrays = {
        "student_hidden": student_hidden,
        "student_weight": student_weight,
        "teacher_hidden": teacher_hidden,
        "teacher_weight": teacher_weight,
    }
    facts = [array_facts(name, a) for name, a in arrays.items()]
    options = spec.fused_linear_jsd(
        *facts,
        array_facts("labels", labels, optional=True),
        beta=beta,
        temperature=temperature,
        ignore_index=ignore_index,
        chunk_size=chunk_size,
    )
    hs = jnp.reshape(student_hidden, (-1, student_hidden.shape[-1]))
    ht = jax.lax.stop_gradient(jnp.reshape(teacher_hidden, (-1, teacher_hidden.shape[-1])))
    n = hs.shape[0]
    if labels is not None and jnp.iinfo(labels.dtype).min <= ignore_index <= jnp.iinfo(labels.dtype).max:
        keep = (jnp.reshape(labels, (-1,)) != ignore_index).astype(jnp.float32)
        weight_of = keep / jnp.maximum(jnp.sum(keep), 1.0)
    else:
        weight_of = jnp.full((n,), 1.0 / max(n, 1), jnp.float32)
    chunk = min(chunk_size or chunk_size_for(n, hs.shape[1], student_weight.shape[0]), max(n, 1))
    axis = vp.check_axis_name(axis_name)
    vocab_size = vp.check_vocab_size(vocab_size, axis, student_weight.shape[0])
    wt = jax.lax.stop_gradient(teacher_weight)
    if axis is not None:  # inside the caller's shard_map: no jit of our own
        # The student head's gradient is summed over the axes the tokens vary over (the transpose
        # of this cast); student_hidden's over the classes' axes inside (psum).
        ws = vary_like(varying_axes(hs, ht, weight_of) - frozenset(axis), student_weight)
        return _fused(hs, ws, ht, wt, weight_of, options, chunk, axis, vocab_size)
    return _fused_jit(hs, student_weight, ht, wt, weight_of, options, chunk)


# --- the per-token form (TRL's ChunkedDivergenceFunction's) ------------------------------------


class JSDPerToken(NamedTuple):
    """fused_linear_jsd_per_token's outputs, the tokens' shape each: divergence float32 with its
    gradient to the student; entropy (the student's, float32, no gradient) None unless asked for."""

    divergence: jax.Array
    entropy: jax.Array | None = None


def _capped(h, w, b, scale, cap):
    """(z, tanh or None) of a chunk's logits y = h @ w.T + b as the kernels take them:
    z = cap * tanh(scale * y / cap), or scale * y without a cap (as fuselet.torch's _capped_)."""
    y = _logits(h, w, b)
    if cap is None:
        return (y if scale == 1.0 else y * scale), None
    th = jnp.tanh(y * (scale / cap))
    return th * cap, th


def _per_token_fwd(hs, ws, bs, ht, wt, bt, options: spec.FusedLinearJSDPerTokenOptions, chunk):
    (s_scale, s_cap), (t_scale, t_cap) = options.logits("student"), options.logits("teacher")
    common = jnp.promote_types(hs.dtype, ht.dtype)

    def loop(ws_mm, wt_mm):  # the heads as the matmuls take them (_with_heads)
        def body(carry, xs):
            h, t = xs
            z = _capped(h, ws_mm, bs, s_scale, s_cap)[0].astype(common)
            zt = _capped(t, wt_mm, bt, t_scale, t_cap)[0].astype(common)
            out = ()
            if options.with_entropy:
                ids = jnp.zeros(h.shape[:1], jnp.int32)
                out = (logprobs_chunk(z, ids, ignore_index=-100, softcap=None, outputs=("entropy",))["entropy"],)
            rows, _ = _logits_call(z, zt, jnp.zeros(h.shape[:1], jnp.float32), options.divergence, 1.0)
            return carry, (rows, *out)

        return _over_chunks(body, (), (hs, ht), chunk)[1]

    ys = _with_heads(loop, ws, wt)
    return (ys[0], ys[1] if options.with_entropy else None), (hs, ws, bs, ht, wt, bt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _per_token(hs, ws, bs, ht, wt, bt, options, chunk):
    return _per_token_fwd(hs, ws, bs, ht, wt, bt, options, chunk)[0]


def _per_token_bwd(options, chunk, res, g):
    """Each chunk's logits of both heads again, the divergence kernel with the upstream gradient of
    the divergence (the entropy's is none), dlogits through the scale and the cap."""
    hs, ws, bs, ht, wt, bt = res
    (s_scale, s_cap), (t_scale, t_cap) = options.logits("student"), options.logits("teacher")
    common = jnp.promote_types(hs.dtype, ht.dtype)
    g = jnp.zeros(hs.shape[:1], jnp.float32) if g[0] is None else g[0].astype(jnp.float32)

    def loop(ws_mm, wt_mm):  # the heads as the matmuls take them (_with_heads)
        def body(carry, xs):
            h, t, g_i = xs
            z, th = _capped(h, ws_mm, bs, s_scale, s_cap)
            zt = _capped(t, wt_mm, bt, t_scale, t_cap)[0]
            _, dz = _logits_call(z.astype(common), zt.astype(common), g_i, options.divergence, 1.0)
            if th is not None:  # dz/dy = scale (1 - tanh^2)
                dz = dz * ((1 - th * th) * s_scale).astype(dz.dtype)
            elif s_scale != 1.0:
                dz = dz * s_scale
            dl = dz.astype(ws.dtype)
            return _accumulate(carry, dl, h, bs), (_dhidden(dl, ws_mm),)

        return _over_chunks(body, lambda: _zeros(ws, bs), (hs, ht, g), chunk)

    (dw, db), (dh,) = _with_heads(loop, ws, wt)
    zero = lambda a: None if a is None else jnp.zeros_like(a)  # noqa: E731
    return dh, dw.astype(ws.dtype), None if bs is None else db.astype(bs.dtype), zero(ht), zero(wt), zero(bt)


_per_token.defvjp(_per_token_fwd, _per_token_bwd)
_per_token_jit = jax.jit(_per_token, static_argnums=(6, 7))


def fused_linear_jsd_per_token(
    student_hidden,
    student_weight,
    teacher_hidden,
    teacher_weight,
    *,
    student_bias=None,
    teacher_bias=None,
    beta: float = 0.5,
    temperature: float = 1.0,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    teacher_softcap: float | None = None,
    with_entropy: bool = False,
    chunk_size: int | None = None,
) -> JSDPerToken:
    """fused_linear_jsd per token, without [tokens, V] logits: each token's generalized JSD (beta 0
    forward KL(teacher || student), 1 reverse KL) of the student's and the teacher's softmax over
    `softcap(logit_scale * (hidden @ weight.T + bias)) / temperature` (softcap c: c * tanh(x / c);
    each model its own bias, logit_scale and softcap), and with_entropy the entropy of the
    student's. student_hidden [..., Hs], student_weight [V, Hs], teacher_hidden [..., Ht] (the same
    tokens), teacher_weight [V, Ht], each bias [V] or None. Returns JSDPerToken, float32, the tokens'
    shape each; gradients flow from the divergence to the student (hidden, weight, bias) only, the
    entropy has none. The backward computes both heads' logits again, chunk by chunk."""
    arrays = {
        "student_hidden": student_hidden,
        "student_weight": student_weight,
        "teacher_hidden": teacher_hidden,
        "teacher_weight": teacher_weight,
        "student_bias": student_bias,
        "teacher_bias": teacher_bias,
    }
    options = spec.fused_linear_jsd_per_token(
        *(array_facts(name, a, optional=name.endswith("bias")) for name, a in arrays.items()),
        beta=beta,
        temperature=temperature,
        student_logit_scale=student_logit_scale,
        teacher_logit_scale=teacher_logit_scale,
        student_softcap=student_softcap,
        teacher_softcap=teacher_softcap,
        with_entropy=with_entropy,
        chunk_size=chunk_size,
    )
    shape = student_hidden.shape[:-1]
    hs = jnp.reshape(student_hidden, (-1, student_hidden.shape[-1]))
    ht = jax.lax.stop_gradient(jnp.reshape(teacher_hidden, (-1, teacher_hidden.shape[-1])))
    n = hs.shape[0]
    chunk = chunk_size or chunk_size_for(n, hs.shape[1], student_weight.shape[0])
    wt, bt = (None if a is None else jax.lax.stop_gradient(a) for a in (teacher_weight, teacher_bias))
    divergence, entropy = _per_token_jit(hs, student_weight, student_bias, ht, wt, bt, options, chunk)
    return JSDPerToken(divergence.reshape(shape), None if entropy is None else jax.lax.stop_gradient(entropy.reshape(shape)))
