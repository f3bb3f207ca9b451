"""Vocab-parallel fused_linear_jsd for JAX: the student's and the teacher's heads sharded on V over
mesh axes (the same axes: the teacher's is resharded to the student's), the tokens over others.

As fused_linear_cross_entropy (docs/tensor_parallel.md), the chunked loop is one
custom_partitioning call (under jax.shard_map where the heads are sharded over Explicit mesh
axes), whose partition callback reads the operands' shardings: the student head's row dim's mesh
axes are the vocab axes, student_hidden's leading dim's the token axes. Each device runs the loop
over its own tokens and its own classes, [chunk, V_r] logits of each model; per chunk:

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
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fuselet.jax import _vocab_parallel as vp
from fuselet.jax._ffi import _batched
from fuselet.jax._sharding import vary_like, varying_axes
from fuselet.jax.fused_linear_cross_entropy import _explicit, _over_chunks, _Where

# The operands: student_hidden, student_weight, teacher_hidden, teacher_weight, the tokens' weights
# (g); the results: the loss, dhidden, dweight. _explicit reads "h" and "w" (student's).
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


def _local(where: _Where, unsharded, options, chunk: int, hs, ws, ht, wt, g):
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


def _layout(arg_shapes):
    """(vocab axes, token axes): the student head's rows' (else the teacher head's), student
    hidden's leading dim's (but the vocab axes, which its tokens cannot share)."""

    def axes(i, dim):
        sharding = arg_shapes[i].sharding
        spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
        return vp.axes_of(spec[dim]) if dim < len(spec) else ()

    vocab = axes(_INS.index("w"), 0) or axes(_INS.index("v"), 0)
    return vocab, tuple(a for a in axes(_INS.index("h"), 0) if a not in vocab)


def _specs(kinds: str, vocab: tuple, tokens: tuple) -> tuple:
    v, n = vocab or None, tokens or None
    table = {"h": P(n, None), "w": P(v, None), "t": P(n, None), "v": P(v, None), "g": P(n), "s": P()}
    return tuple(table[k] for k in kinds)


def _sizes(shapes) -> tuple:
    """(V, N): the student head's rows, the tokens."""
    return shapes[_INS.index("w")].shape[0], shapes[_INS.index("h")].shape[0]


@functools.cache
def _partitioned(unsharded, options, chunk: int):
    """The loop as one custom_partitioning call over (hs, ws, ht, wt, g) -> (loss, dhs, dws)."""

    def fn(*args):  # unpartitioned: one device, everything whole
        return unsharded(*args, options, chunk)

    def shardings(mesh, arg_shapes):
        vocab, tokens = _layout(arg_shapes)
        named = lambda kinds: tuple(NamedSharding(mesh, s) for s in _specs(kinds, vocab, tokens))  # noqa: E731
        return vocab, tokens, named(_INS), named(_OUTS)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[3]

    def partition(mesh, arg_shapes, result_shape):
        vocab, tokens, in_s, out_s = shardings(mesh, arg_shapes)
        where = _Where(vocab, tokens, *_sizes(arg_shapes))
        return mesh, lambda *a: _local(where, unsharded, options, chunk, *a), out_s, in_s

    rule = f"{', '.join(_FACTORS[k] for k in _INS)} -> {', '.join(_FACTORS[k] for k in _OUTS)}"
    wrapped = custom_partitioning(fn)
    wrapped.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule, need_replication_factors=("k", "j"))
    return _batched(wrapped, (False,) * len(_INS), False)  # vmap: a loop (lax.map)


def _shard_mapped(unsharded, options, chunk: int, layout, args):
    """The loop under jax.shard_map over the Explicit axes of `layout`, the results resharded to
    their arrays' shardings."""
    mesh, vocab, tokens = layout
    where = _Where(vocab, tokens, *_sizes(args))
    in_specs, out_specs = _specs(_INS, vocab, tokens), _specs(_OUTS, vocab, tokens)
    given = {k: jax.typeof(a).sharding for k, a in zip(_INS, args)}
    args = tuple(jax.sharding.reshard(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs))
    local = functools.partial(_local, where, unsharded, options, chunk)
    results = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs)(*args)
    return tuple(r if k == "s" else jax.sharding.reshard(r, given[k]) for r, k in zip(results, _OUTS))


def loss_and_grads(unsharded, hs, ws, ht, wt, g, options, chunk: int, axis=None, vocab_size=None):
    """(loss, dhs, dws) of fused_linear_jsd's loop, partitioned by the operands' shardings:
    unsharded(hs, ws, ht, wt, g, options, chunk) is the loop of one device over whole heads (a
    module-level function: the partitioned call is cached on it). With axis (inside the caller's
    shard_map): this device's share, the heads its blocks of the classes over axis (vocab_size
    the real V, None: V_r times the axis size), the loss over its tokens."""
    args = (hs, ws, ht, wt, g)
    if axis is not None:
        vocab = vocab_size or ws.shape[0] * vp.axis_size(axis)
        return _local(_Where(axis, (), vocab, hs.shape[0]), unsharded, options, chunk, *args)
    layout = _explicit(args, _INS)
    if layout is not None:
        if layout[1]:  # heads sharded over Explicit axes
            return _shard_mapped(unsharded, options, chunk, layout, args)
        return unsharded(*args, options, chunk)  # tokens alone over Explicit axes: as GSPMD takes it
    return _partitioned(unsharded, options, chunk)(*args)
