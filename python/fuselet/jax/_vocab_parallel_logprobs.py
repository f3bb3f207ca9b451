"""Vocab-parallel fused_linear_logprobs for JAX: the head's rows (the classes) sharded over mesh
axes, the tokens over others (docs/tensor_parallel.md).

As fused_linear_cross_entropy, the chunked loop is one custom_partitioning call (under
jax.shard_map where the head or hidden is sharded over Explicit mesh axes; _chunk_partition),
whose partition callback reads the operands' shardings: the head's row dim's mesh axes are the
vocab axes, hidden's leading dim's the token axes. Each device runs the loop over its own tokens
and its own classes. Without vocab axes (the head whole on every device) that loop is
fused_linear_logprobs' own (fuselet's logprobs kernel per chunk). With them, per chunk of n
tokens, each device's logits [n, V_r] (soft-capped in float32, the classes at or past V masked):

  1. **one all-reduce (max) of [n] float32** over the vocab axes: the row max m;
  2. **one all-reduce (sum) of [k, n] float32**: sum_j e_j (e_j = exp(s_j - m)), the target's
     logit s_t (0 on the devices that do not hold it), and as asked sum_j e_j (s_j - m) (the
     entropy), sum_j e_j^2 (log_sum_sq_probs), sum_j s_j (mean_logits); k = 2 to 5;
  3. with is_top1, **one all-reduce (min) of [n] int32**: the first class whose logit is m (the
     argmax, ties to the lowest class).

Then lse = m + log(sum e), log_probs = s_t - lse, entropy = log(sum e) - sum e (s - m) / sum e,
log_sum_sq_probs = log(sum e^2) - 2 log(sum e), mean_logits = sum s / V, is_top1 = (t ==
argmax), alike on every device of the vocab axes; 0 (False) where the target is ignore_index.
The backward of a chunk needs no collective: with p_j = exp(s_j - lse) the global softmax,
dlogits_j = g ([j == t] - p_j) - h p_j ((s_j - lse) + entropy) (g, h the cotangents of log_probs
and entropy), times the softcap's derivative. dhidden is psum'ed over the vocab axes once per
backward, dweight / dbias stay sharded (psum'ed over the token axes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fuselet.jax import _chunk_partition as cp
from fuselet.jax import _vocab_parallel as vp
from fuselet.jax.fused_linear_cross_entropy import _accumulate, _logits, _over_chunks, _zeros
from fuselet.spec import fused_linear_logprobs as spec


def asked_of(options: spec.FusedLinearLogProbsOptions) -> tuple:
    """The outputs beyond log_probs, in spec.OUTPUTS' order."""
    return tuple(name for name in spec.OUTPUTS[1:] if name in options.outputs)


# --- the per-chunk math of one device's classes ----------------------------------------------


def _parts(logits, t, ignore_index: int, cap: float, vocab: int, offset, rows_ok):
    """(s: the soft-capped float32 logits, real: the columns that are classes < V, keep: the rows
    that count, local: the target's local column, owned: whether this block holds it)."""
    n_cols = logits.shape[-1]
    s = vp._capped(logits, cap)
    _, real = vp._columns(n_cols, offset, vocab)
    keep = vp.kept(t, ignore_index)
    if rows_ok is not None:
        keep = keep & rows_ok
    local, owned = vp._local_target(t, offset, n_cols, vocab, keep)
    return s, real, keep, local, owned


def stats(logits, t, ignore_index: int, cap: float, asked: tuple, axes: tuple, vocab: int, offset, rows_ok=None) -> tuple:
    """(log_probs, lse, *asked) per row [n] float32 (is_top1 1.0 / 0.0), alike on every device of
    `axes`: logits [n, V_r] this device's classes [offset, offset + V_r) (those >= vocab masked),
    t [n] global class ids; rows_ok [n] bool or None (False: padding rows, 0 like ignored ones)."""
    s, real, keep, local, owned = _parts(logits, t, ignore_index, cap, vocab, offset, rows_ok)
    n_cols = logits.shape[-1]
    s_real = jnp.where(real, s, -jnp.inf)
    m = jnp.max(s_real, axis=-1) if n_cols else jnp.full(t.shape, -jnp.inf, jnp.float32)
    if axes:
        m = jax.lax.pmax(m, axes)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # rows of no real class anywhere: never kept
    e = jnp.exp(s_real - m[..., None])
    parts = {"sum": jnp.sum(e, axis=-1), "s_t": jnp.where(owned, jnp.take_along_axis(s, local[..., None], axis=-1)[..., 0], 0.0)}
    if "entropy" in asked:
        parts["e_s"] = jnp.sum(jnp.where(real, e * (s - m[..., None]), 0.0), axis=-1)
    if "log_sum_sq_probs" in asked:
        parts["e2"] = jnp.sum(e * e, axis=-1)
    if "mean_logits" in asked:
        parts["s"] = jnp.sum(jnp.where(real, s, 0.0), axis=-1)
    summed = jnp.stack(list(parts.values()))
    if axes:
        summed = jax.lax.psum(summed, axes)  # one all-reduce of [k, n] float32
    got = dict(zip(parts, summed))
    log_sum = jnp.log(got["sum"])
    lse = m + log_sum
    out = {"log_probs": got["s_t"] - lse, "lse": lse}
    if "entropy" in asked:
        out["entropy"] = log_sum - got["e_s"] / got["sum"]
    if "log_sum_sq_probs" in asked:
        out["log_sum_sq_probs"] = jnp.log(got["e2"]) - 2.0 * log_sum
    if "mean_logits" in asked:
        out["mean_logits"] = got["s"] / vocab
    if "is_top1" in asked:
        cols = offset + jnp.arange(n_cols, dtype=jnp.int32)
        first = jnp.min(jnp.where(s_real == m[..., None], cols, vocab), axis=-1) if n_cols else jnp.full(t.shape, vocab)
        if axes:
            first = jax.lax.pmin(first, axes)
        out["is_top1"] = (t.astype(jnp.int32) == first).astype(jnp.float32)
    bad = keep & ((t < 0) | (t >= vocab))
    out["log_probs"] = jnp.where(bad, jnp.nan, out["log_probs"])
    zero = jnp.zeros((), jnp.float32)
    return tuple(jnp.where(keep, out[name], zero) for name in ("log_probs", "lse", *asked))


def dlogits(logits, t, lse, entropy, dlogp, dentropy, ignore_index: int, cap: float, vocab: int, offset, rows_ok=None):
    """The gradient [n, V_r] (logits' dtype) of sum(dlogp * log_probs + dentropy * entropy) over
    this device's logits (lse, entropy the global ones of stats; dentropy None: 0). No collective."""
    s, real, keep, local, owned = _parts(logits, t, ignore_index, cap, vocab, offset, rows_ok)
    x = jnp.where(real, s - lse[..., None], -jnp.inf)  # log p_j
    p = jnp.exp(x)
    onehot = owned[..., None] & (jnp.arange(logits.shape[-1], dtype=jnp.int32) == local[..., None])
    d = dlogp.astype(jnp.float32)[..., None] * (onehot.astype(jnp.float32) - p)
    if dentropy is not None:
        d = d - dentropy.astype(jnp.float32)[..., None] * p * (jnp.where(real, x, 0.0) + entropy[..., None])
    if cap:
        d = d * (1.0 - jnp.square(s / cap))
    return jnp.where(keep[..., None] & real, d, 0.0).astype(logits.dtype)


# --- one device's share: its tokens, its classes ---------------------------------------------


def _padded(ok, t, h):
    """Padding tokens (XLA's, past N) out of the kernel's way: class 0, zero hidden."""
    if ok is None:
        return t, h
    return jnp.where(ok, t, jnp.zeros((), t.dtype)), jnp.where(ok[:, None], h, jnp.zeros((), h.dtype))


def _local_fwd(where: cp.Where, unsharded, options, chunk: int, h, w, b, t) -> tuple:
    """(log_probs, lse, *asked) per token of this device's tokens [n], float32."""
    asked = asked_of(options)
    ok = where.rows_ok(h.shape[0])
    if not where.vocab_axes:  # the head whole: fused_linear_logprobs' own loop on this device's tokens
        t_k, h_k = _padded(ok, t, h)
        out, res = unsharded(h_k, w, b, t_k, options, chunk)
        values = (out["log_probs"], res[4], *(out[n].astype(jnp.float32) for n in asked))
        return values if ok is None else tuple(jnp.where(ok, v, 0.0) for v in values)
    w, b, offset = where.head(w, b)
    ignore_index, cap, _, _ = options.op_args()

    def body(carry, xs):
        h_i, t_i = xs[:2]
        ok_i = xs[2] if ok is not None else None
        return carry, stats(_logits(h_i, w, b), t_i, ignore_index, cap, asked, where.vocab_axes, where.vocab, offset, ok_i)

    arrays = (h, t) if ok is None else (h, t, ok)
    return _over_chunks(body, (), arrays, chunk)[1]


def _local_bwd(where: cp.Where, unsharded, options, chunk: int, dlogp, h, w, b, t, lse, dentropy=None, entropy=None) -> tuple:
    """(dhidden, dweight, dbias) of this device's tokens (dhidden the whole head's) and classes."""
    ok = where.rows_ok(h.shape[0])
    if ok is not None:  # padding tokens: no gradient
        dlogp = jnp.where(ok, dlogp, 0.0)
        dentropy = None if dentropy is None else jnp.where(ok, dentropy, 0.0)
    if not where.vocab_axes:
        t_k, h_k = _padded(ok, t, h)
        g = {"log_probs": dlogp, "entropy": dentropy}
        dh, dw, db, _ = unsharded(options, chunk, (h_k, w, b, t_k, lse, entropy), g)
        dw = where.sum_tokens(dw.astype(jnp.float32)).astype(w.dtype)
        return dh, dw, None if b is None else where.sum_tokens(db.astype(jnp.float32)).astype(b.dtype)
    w, b, offset = where.head(w, b)
    ignore_index, cap, _, _ = options.op_args()

    def body(carry, xs):
        h_i, t_i, l_i, g_i = xs[:4]
        e_i, ge_i = (xs[4], xs[5]) if entropy is not None else (None, None)
        ok_i = xs[-1] if ok is not None else None
        dl = dlogits(_logits(h_i, w, b), t_i, l_i, e_i, g_i, ge_i, ignore_index, cap, where.vocab, offset, ok_i)
        return _accumulate(carry, dl, h_i), (jnp.dot(dl, w),)

    arrays = (h, t, lse, dlogp.astype(jnp.float32))
    if entropy is not None:
        arrays += (entropy, dentropy.astype(jnp.float32))
    if ok is not None:
        arrays += (ok,)
    (dw, db), (dh,) = _over_chunks(body, _zeros(w, b, *arrays), arrays, chunk)
    dh = where.sum_classes(dh)
    dw, db = where.sum_tokens(dw), None if db is None else where.sum_tokens(db)
    return dh, dw.astype(w.dtype), None if b is None else db.astype(b.dtype)


# --- the partitioned calls (_chunk_partition) ------------------------------------------------


def _local_call(kind: str, unsharded, options, chunk: int, has_bias: bool):
    """(input kinds, output kinds, call(where, *arrays)) of the loop `kind` on one device's share,
    over its arrays (no None for an absent bias) and giving them (no None). fwd: (h, w, b, t) ->
    (log_probs, lse, *asked); bwd: (dlogp, h, w, b, t, lse[, dentropy, entropy]) -> (dh, dw, db)."""
    if kind == "fwd":
        ins, outs = "hwbt", "t" * (2 + len(asked_of(options)))
    else:
        ins, outs = "thwbtt" + ("tt" if "entropy" in options.outputs else ""), "hwb"
    local = _local_fwd if kind == "fwd" else _local_bwd
    return cp.local_call(ins, outs, lambda where, *a: local(where, unsharded, options, chunk, *a), has_bias)


@functools.cache
def _partitioned(kind: str, unsharded, options, chunk: int, has_bias: bool):
    """The loop `kind` as one custom_partitioning call over its arrays (no None)."""
    return cp.partitioned(*_local_call(kind, unsharded, options, chunk, has_bias))


def _run(kind: str, unsharded, options, chunk: int, args: tuple, axis=None, vocab_size=None) -> tuple:
    """The loop `kind` over args (bias None or an array), partitioned by their shardings, or with
    axis (inside the caller's shard_map) this device's share, the classes over axis (vocab_size
    the real V, None: V_r times the axis size); the results with None for an absent bias's
    gradient."""
    if axis is not None:
        h, w = args[1:3] if kind == "bwd" else args[:2]
        where = cp.in_shard_map(axis, vocab_size, w, h)
        return tuple((_local_fwd if kind == "fwd" else _local_bwd)(where, unsharded, options, chunk, *args))
    has_bias = args[3 if kind == "bwd" else 2] is not None
    given = tuple(a for a in args if a is not None)
    loop = _local_call(kind, unsharded, options, chunk, has_bias)
    layout = cp.explicit(given, loop[0])
    if layout is not None:
        results = cp.shard_mapped(*loop, layout, given)
    else:
        results = _partitioned(kind, unsharded, options, chunk, has_bias)(*given)
    if kind == "bwd" and not has_bias:
        return (*results, None)
    return tuple(results)


def forward(unsharded, h, w, b, t, options, chunk: int, axis=None, vocab_size=None) -> tuple:
    """(outputs {name: [N]}: log_probs and the asked ones, is_top1 bool; lse [N]) of the loop
    `unsharded(h, w, b, t, options, chunk) -> (outputs, (h, w, b, t, lse, entropy))` (one device's,
    whole head: a module-level function, the partitioned call is cached on it), run on each
    device's tokens and classes (with axis: as _run)."""
    asked = asked_of(options)
    log_probs, lse, *rest = _run("fwd", unsharded, options, chunk, (h, w, b, t), axis, vocab_size)
    out = {"log_probs": log_probs, **dict(zip(asked, rest))}
    if "is_top1" in out:
        out["is_top1"] = out["is_top1"] > 0.5
    return out, lse


def backward(unsharded, options, chunk: int, h, w, b, t, lse, entropy, dlogp, dentropy, axis=None, vocab_size=None) -> tuple:
    """(dhidden, dweight, dbias) of the loop `unsharded(options, chunk, residuals, cotangents)`
    (one device's, whole head), run on each device's tokens and classes (with axis: as _run)."""
    args = (dlogp.astype(jnp.float32), h, w, b, t, lse)
    if "entropy" in options.outputs:
        zeros = jnp.zeros_like(lse)
        args += (zeros if dentropy is None else dentropy.astype(jnp.float32), entropy)
    return _run("bwd", unsharded, options, chunk, args, axis, vocab_size)
