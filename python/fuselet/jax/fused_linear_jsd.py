"""The distillation loss fused with both LM heads, for JAX: the generalized JSD of a student's and
a teacher's token distributions from their last hidden states, without [tokens, V] logits.

As fuselet.torch.fused_linear_jsd: the tokens are taken chunk by chunk (a lax.scan; the last chunk
padded with tokens that count for nothing), each chunk's logits of both models from jnp's matmul (in
the inputs' dtype), one pass of fuselet's divergence kernel over them (divergence_logits: both
log_softmaxes, the loss per token and its gradient through the student's log_softmax and the
temperature), then the head's matmuls. The loss is a mean, so the gradients are computed in the forward (custom_vjp)
and kept as its residuals instead of any logits. Gradients flow to the student (hidden and
weight) only: the teacher's cotangents are zeros. Rules: fuselet/spec/fused_linear_jsd.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fuselet.jax._checks import array_facts
from fuselet.jax.divergence import _logits_call
from fuselet.jax.fused_linear_cross_entropy import _add_dweight, _dhidden, _logits, _with_heads
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _fused(hs, ws, ht, wt, weight_of, options, chunk):
    return _loss_and_grads(hs, ws, ht, wt, weight_of, options, chunk)[0]


def _fused_fwd(hs, ws, ht, wt, weight_of, options, chunk):
    loss, dhs, dws = _loss_and_grads(hs, ws, ht, wt, weight_of, options, chunk)
    return loss, (dhs, dws, ht, wt, weight_of)


def _fused_bwd(options, chunk, res, g):
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
):
    """The generalized JSD (jsd's beta: 0 forward KL, 1 reverse KL) of the student's and the
    teacher's softmax(hidden @ weight.T / temperature), the mean over the tokens whose label is not
    ignore_index, without [tokens, V] logits. student_hidden [..., Hs], student_weight [V, Hs],
    teacher_hidden [..., Ht] (the same tokens; Ht may differ), teacher_weight [V, Ht], labels the
    tokens' shape or None. float32 loss; gradients to the student only."""
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
    return _fused_jit(hs, student_weight, ht, jax.lax.stop_gradient(teacher_weight), weight_of, options, chunk)
