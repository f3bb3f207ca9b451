"""Fused linear cross-entropy for JAX: the loss of `hidden @ weight.T + bias` without the
[tokens, V] logits.

The tokens are taken chunk by chunk (a lax.scan over the whole chunks, then the remainder):
each chunk's logits come from XLA's own matmul, fuselet's cross-entropy FFI call turns them
into the loss and dlogits in one pass, and the chunk's dhidden and its share of dweight / dbias
(float32 accumulators carried by the scan) follow at once, so one chunk of logits exists at a
time. With reduction "mean" / "sum" the gradients are computed in the forward (custom_vjp
residuals: dhidden, dweight, dbias); with "none" the backward recomputes each chunk's logits
from hidden, weight and the per-token lse.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fuselet.jax._checks import array_facts
from fuselet.jax.cross_entropy import _bwd_call, _fwd_bwd, _fwd_call, _target_errors, _valid
from fuselet.spec import fused_linear_cross_entropy as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for


def _over_chunks(body, carry, arrays, chunk):
    """body(carry, xs) -> (carry, ys) over the tokens (leading dim of `arrays`) chunk by chunk: a
    lax.scan over the whole chunks, then one call on the remainder (no padding); the ys of every
    chunk concatenated over the tokens."""
    n = arrays[0].shape[0]
    full = n // chunk * chunk
    parts = []
    if full:
        xs = tuple(a[:full].reshape(full // chunk, chunk, *a.shape[1:]) for a in arrays)
        carry, ys = jax.lax.scan(body, carry, xs)
        parts.append(tuple(y.reshape(full, *y.shape[2:]) for y in ys))
    if full < n or n == 0:
        carry, ys = body(carry, tuple(a[full:] for a in arrays))
        parts.append(ys)
    return carry, tuple(jnp.concatenate(p) if len(p) > 1 else p[0] for p in zip(*parts))


def _logits(h, w, b):
    logits = jnp.dot(h, w.T)
    return logits if b is None else logits + b


def _accumulate(carry, dl, h):
    """(dweight, dbias) float32 accumulators plus one chunk's share."""
    dw, db = carry
    dw = dw + jnp.dot(dl.T, h, preferred_element_type=jnp.float32)
    return dw, None if db is None else db + jnp.sum(dl, axis=0, dtype=jnp.float32)


def _zeros(w, b):
    return jnp.zeros(w.shape, jnp.float32), None if b is None else jnp.zeros(b.shape, jnp.float32)


def _scaled(a, scale, dtype):
    return None if a is None else (a.astype(jnp.float32) * scale).astype(dtype)


# --- reduction "mean" / "sum": gradients in the forward --------------------------------------


def _reduced_fwd(h, w, b, t, opts, chunk, mean):
    def body(carry, xs):
        h_i, t_i = xs
        loss_i, z_i, dl = _fwd_bwd(_logits(h_i, w, b), t_i, opts, 1.0)
        return _accumulate(carry, dl, h_i), (loss_i, z_i, jnp.dot(dl, w))

    (dw, db), (loss, z, dh) = _over_chunks(body, _zeros(w, b), (h, t), chunk)
    scale = 1.0 / jnp.maximum(jnp.sum(_valid(t, opts.ignore_index)), 1.0) if mean else 1.0
    res = (_scaled(dh, scale, h.dtype), _scaled(dw, scale, w.dtype), None if b is None else _scaled(db, scale, b.dtype))
    return (jnp.sum(loss) * scale, jnp.sum(z) * scale), res


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _reduced(h, w, b, t, opts, chunk, mean):
    return _reduced_fwd(h, w, b, t, opts, chunk, mean)[0]


def _reduced_bwd(opts, chunk, mean, res, g):
    gl = g[0]  # z is for logging: no gradient flows through it
    return (*(None if a is None else _scaled(a, gl, a.dtype) for a in res), None)


_reduced.defvjp(_reduced_fwd, _reduced_bwd)


# --- reduction "none": the backward recomputes the logits ------------------------------------


def _per_token_fwd(h, w, b, t, opts, chunk):
    def body(carry, xs):
        h_i, t_i = xs
        return carry, _fwd_call(_logits(h_i, w, b), t_i, opts)

    _, (loss, z, lse) = _over_chunks(body, (), (h, t), chunk)
    return (loss, z), (h, w, b, t, lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _per_token(h, w, b, t, opts, chunk):
    return _per_token_fwd(h, w, b, t, opts, chunk)[0]


def _per_token_bwd(opts, chunk, res, g):
    h, w, b, t, lse = res

    def body(carry, xs):
        h_i, t_i, g_i, l_i = xs
        dl = _bwd_call(g_i, _logits(h_i, w, b), t_i, l_i, opts)
        return _accumulate(carry, dl, h_i), (jnp.dot(dl, w),)

    (dw, db), (dh,) = _over_chunks(body, _zeros(w, b), (h, t, g[0].astype(jnp.float32), lse), chunk)
    return dh, dw.astype(w.dtype), None if b is None else db.astype(b.dtype), None


_per_token.defvjp(_per_token_fwd, _per_token_bwd)


def _loss(h, w, b, t, opts, chunk, reduction):
    if reduction == "none":
        return _per_token(h, w, b, t, opts, chunk)
    return _reduced(h, w, b, t, opts, chunk, reduction == "mean")


# Jitted so that an eager call runs as one computation (inside jit it is inlined).
_loss_jit = jax.jit(_loss, static_argnums=(4, 5, 6))


def fused_linear_cross_entropy(
    hidden,
    weight,
    target,
    *,
    bias=None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    reduction: str = "mean",
    return_z_loss: bool = False,
    chunk_size: int | None = None,
):
    """cross_entropy(hidden @ weight.T + bias, target, ...) without materializing the logits.

    hidden [..., H], weight [V, H], bias [V] or None, all of one dtype (float32, float16 or
    bfloat16); target hidden.shape[:-1] of int32 class ids (int64 with x64). The options are
    cross_entropy's; chunk_size: tokens per chunk (None: chunk_size_for(N, H, V)). Returns the
    float32 loss (target's shape for reduction="none"), and with return_z_loss=True (loss, z)."""
    options = spec.fused_linear_cross_entropy(
        array_facts("hidden", hidden),
        array_facts("weight", weight),
        array_facts("bias", bias, optional=True),
        array_facts("target", target),
        chunk_size,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        softcap=softcap,
        reduction=reduction,
        return_z_loss=return_z_loss,
    )
    shape, h_dim = target.shape, hidden.shape[-1]
    chunk = chunk_size or chunk_size_for(math.prod(shape), h_dim, weight.shape[0])
    opts = options.cross_entropy
    loss, z = _target_errors(
        target, lambda: _loss_jit(hidden.reshape(-1, h_dim), weight, bias, target.reshape(-1), opts, chunk, reduction)
    )
    if reduction == "none":
        loss, z = loss.reshape(shape), z.reshape(shape)
    return (loss, jax.lax.stop_gradient(z)) if return_z_loss else loss
