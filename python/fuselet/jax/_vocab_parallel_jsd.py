"""Vocab-parallel fused_linear_jsd for JAX: the student's and the teacher's heads sharded on V over
mesh axes (the same axes: the teacher's is resharded to the student's), the tokens over others.

As fused_linear_cross_entropy (docs/tensor_parallel.md), the chunked loop is one
custom_partitioning call (under jax.shard_map where the heads are sharded over Explicit mesh
axes; _chunk_partition), whose partition callback reads the operands' shardings: the student
head's row dim's mesh axes (else the teacher head's) are the vocab axes, student_hidden's leading
dim's the token axes. Each device runs the loop over its own tokens and its own classes,
[chunk, V_r] logits of each model; per chunk:

  1. one all-reduce (max) of [2, n] float32 over the vocab axes: the row maxima of the student's
     and the teacher's logits (times 1 / temperature);
  2. one all-reduce (sum) of [2, n]: their sums of exponentials, so that x = s / T - lse_s and
     t = u / T - lse_t are the global log-probabilities log Q and log P of the device's classes;
  3. one all-reduce (sum) of [2, n]: the sums over the device's classes of the divergence's
     terms (with beta in (0, 1) those of the mixture M = beta P + (1 - beta) Q) and of
     d term / dx: the row's loss and S = sum_k dx_k, alike on every device of the vocab axes.

The student's dlogits g / T (dx_j - Q_j S) need no collective; dhidden is psum'ed over the vocab
axes once per call, dweight stays sharded (psum'ed over the token axes), the loss is psum'ed over
the token axes. Classes past V (XLA's padding of an uneven split) are masked: their logits -inf,
their gradients 0. The math is fuselet/divergence.h's (its forms at beta 0 and 1, every weight-0
term 0), in XLA's element-wise code around the chunk's matmuls. Without vocab axes (the heads
whole on every device) each device runs fused_linear_jsd's own loop (the divergence kernel) over
its tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fuselet.jax import _chunk_partition as cp
from fuselet.jax._sharding import vary_like, varying_axes
from fuselet.jax.fused_linear_cross_entropy import _over_chunks

# The operands: student_hidden, student_weight, teacher_hidden, teacher_weight, the tokens' weights
# (g); the results: the loss, dhidden, dweight. cp.explicit reads "h" and "w" (student's).
_INS, _OUTS = "hwtvg", "shw"
# The factors of each (Shardy): n tokens, v classes, k / j the student's / teacher's hidden (whole).
_FACTORS = {"h": "n k", "w": "v k", "t": "n j", "v": "v j", "g": "n", "s": ""}


def _terms(x, q, t, p, beta: float):
    """(term, dx) per class of fuselet/divergence.h's JSD (DivergenceMath.term_dx): x, t the
    log-probabilities, q, p their exponentials; every weight-0 term selected to 0."""
    if beta == 0.0:  # forward KL(P || Q)
        return jnp.where(p > 0, p * (t - x), 0.0), -p
    if beta == 1.0:  # reverse KL(Q || P)
        return jnp.where(q > 0, q * (x - t), 0.0), jnp.where(q > 0, q * (x - t + 1.0), 0.0)
    lm = jnp.log(beta * p + (1.0 - beta) * q)
    b = jnp.where(q > 0, (1.0 - beta) * q * (x - lm), 0.0)
    return jnp.where(p > 0, beta * p * (t - lm), 0.0) + b, b


def jsd_chunk(s, u, g, beta: float, inv_t: float, axes: tuple, vocab: int, offset):
    """(rows [n] float32, alike on every device of `axes`; dlogits [n, V_r] in s's dtype): s, u
    this device's student and teacher logits [n, V_r] of the classes [offset, offset + V_r)
    (those >= vocab masked), g [n] float32 each row's weight. Three all-reduces of [2, n]."""
    n_cols = s.shape[-1]
    real = offset + jnp.arange(n_cols, dtype=jnp.int32) < vocab
    x = jnp.where(real, s.astype(jnp.float32) * inv_t, -jnp.inf)
    t = jnp.where(real, u.astype(jnp.float32) * inv_t, -jnp.inf)
    both = jnp.stack([x, t])  # [2, n, V_r]
    m = jnp.max(both, axis=-1) if n_cols else jnp.full(both.shape[:-1], -jnp.inf, jnp.float32)
    if axes:
        m = jax.lax.pmax(m, axes)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    total = jnp.sum(jnp.exp(both - m[..., None]), axis=-1)
    if axes:
        total = jax.lax.psum(total, axes)
    lse = m + jnp.log(total)  # [2, n]: the global log-sum-exps of the student's and the teacher's
    x, t = x - lse[0, :, None], t - lse[1, :, None]
    q, p = jnp.exp(x), jnp.exp(t)
    term, dx = _terms(x, q, t, p, beta)
    sums = jnp.stack([jnp.sum(jnp.where(real, term, 0.0), axis=-1), jnp.sum(jnp.where(real, dx, 0.0), axis=-1)])
    if axes:
        sums = jax.lax.psum(sums, axes)
    d = (g * inv_t)[:, None] * (dx - q * sums[1][:, None])
    return sums[0], jnp.where(real, d, 0.0).astype(s.dtype)


def _local(where: cp.Where, unsharded, options, chunk: int, hs, ws, ht, wt, g):
    """(loss, dhidden, dweight) of this device's tokens and classes: the loss summed over all
    tokens (alike everywhere), dhidden its tokens' (the whole heads'), dweight its rows'."""
    ok = where.rows_ok(hs.shape[0])
    if ok is not None:  # padding tokens: out of the loss and of the gradients
        g = jnp.where(ok, g, 0.0)
        hs, ht = (jnp.where(ok[:, None], a, jnp.zeros((), a.dtype)) for a in (hs, ht))
    if not where.vocab_axes:  # the heads whole: fused_linear_jsd's own loop on this device's tokens
        loss, dhs, dws = unsharded(hs, ws, ht, wt, g, options, max(1, min(chunk, hs.shape[0])))
        return where.sum_tokens(loss), dhs, where.sum_tokens(dws.astype(jnp.float32)).astype(ws.dtype)
    ws, _, offset = where.head(ws, None)
    wt, _, _ = where.head(wt, None)
    beta, inv_t = float(options.beta), 1.0 / options.temperature

    def body(dws, xs):
        h, t, gi = xs
        rows, dl = jsd_chunk(jnp.dot(h, ws.T), jnp.dot(t, wt.T), gi, beta, inv_t, where.vocab_axes, where.vocab, offset)
        dl = dl.astype(ws.dtype)
        dws = dws + jnp.dot(dl.T, h, preferred_element_type=jnp.float32)
        return dws, (jnp.where(gi > 0, rows * gi, 0.0), jnp.dot(dl, ws))

    zeros = vary_like(varying_axes(ws, hs, ht, g), jnp.zeros(ws.shape, jnp.float32))
    dws, (rows, dhs) = _over_chunks(body, zeros, (hs, ht, g.astype(jnp.float32)), chunk)
    loss = where.sum_tokens(jnp.sum(rows))
    return loss, where.sum_classes(dhs), where.sum_tokens(dws).astype(ws.dtype)


def _call(unsharded, options, chunk: int):
    """call(where, hs, ws, ht, wt, g): the loop on one device's share (_local)."""
    return lambda where, *a: _local(where, unsharded, options, chunk, *a)


@functools.cache
def _partitioned(unsharded, options, chunk: int):
    """The loop as one custom_partitioning call over (hs, ws, ht, wt, g) -> (loss, dhs, dws)."""

    def whole(*args):  # unpartitioned: one device, everything whole
        return unsharded(*args, options, chunk)

    return cp.partitioned(_INS, _OUTS, _call(unsharded, options, chunk), _FACTORS, "wv", whole)


def loss_and_grads(unsharded, hs, ws, ht, wt, g, options, chunk: int, axis=None, vocab_size=None):
    """(loss, dhs, dws) of fused_linear_jsd's loop, partitioned by the operands' shardings:
    unsharded(hs, ws, ht, wt, g, options, chunk) is the loop of one device over whole heads (a
    module-level function: the partitioned call is cached on it). With axis (inside the caller's
    shard_map): this device's share, the heads its blocks of the classes over axis (vocab_size
    the real V, None: V_r times the axis size), the loss over its tokens."""
    args = (hs, ws, ht, wt, g)
    if axis is not None:
        return _local(cp.in_shard_map(axis, vocab_size, ws, hs), unsharded, options, chunk, *args)
    layout = cp.explicit(args, _INS)
    if layout is not None:
        if layout[1]:  # heads sharded over Explicit axes
            return cp.shard_mapped(_INS, _OUTS, _call(unsharded, options, chunk), layout, args, _FACTORS)
        return unsharded(*args, options, chunk)  # tokens alone over Explicit axes: as GSPMD takes it
    return _partitioned(unsharded, options, chunk)(*args)
