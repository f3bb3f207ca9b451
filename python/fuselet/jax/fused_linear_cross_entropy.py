"""Fused linear cross-entropy for JAX: the loss of `hidden @ weight.T + bias` without the
[tokens, V] logits.

The tokens are taken chunk by chunk (a lax.scan over the whole chunks, then the remainder):
each chunk's logits come from XLA's own matmul, fuselet's cross-entropy FFI call turns them
into the loss and dlogits in one pass, and the chunk's dhidden and its share of dweight / dbias
(float32 accumulators carried by the scan) follow at once, so one chunk of logits exists at a
time. With reduction "mean" / "sum" the gradients are computed in the forward (custom_vjp
residuals: dhidden, dweight, dbias); with "none" the backward recomputes each chunk's logits
from hidden, weight and the per-token lse.

Sharded (docs/tensor_parallel.md): the chunked loop is one custom_partitioning call
(_chunk_partition), so that each device runs it over its own tokens (hidden's leading dim,
sharded over any mesh axes: the chunks never span devices) and its own classes (weight's rows,
sharded over other mesh axes: vocab-parallel, the head never gathered). With the classes
sharded, each chunk's statistics are combined across their axes (_vocab_parallel: a pmax and a
psum of [chunk]-sized float32 values), dhidden is psum'ed over them once per call, and dweight /
dbias stay sharded (psum'ed over the token axes). Inside a user's shard_map, axis_name= names
the axes of the classes.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fuselet.jax import _chunk_partition as cp
from fuselet.jax import _vocab_parallel as vp
from fuselet.jax._checks import array_facts
from fuselet.jax._sharding import vary_like, varying_axes
from fuselet.jax.cross_entropy import _bwd_call, _fwd_bwd, _fwd_call, _target_errors
from fuselet.spec import fused_linear_cross_entropy as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for


def _over_chunks(body, carry, arrays, chunk):
    """body(carry, xs) -> (carry, ys) over the tokens (leading dim of `arrays`) chunk by chunk: the
    first chunk, a lax.scan over the whole chunks after it, then one call on the remainder (no
    padding); the ys of every chunk concatenated over the tokens.

    carry: the first carry, or a function that gives zeros of it (accumulators): these start as
    the first chunk's body(None, xs) instead (its products), made where the loop starts. Zeros
    made beforehand depend on nothing, and XLA makes them as early as it likes, e.g. before an
    earlier loop of the step (a reference model's) whose float32 head they then share the peak
    with. Where the token count is a symbolic dim (jax.export), whose scan after a first chunk
    might be empty, the scan takes every whole chunk from the zeros. Every loop takes its chunks
    alike, a forward's and its backward's (XLA may fold a conversion differently inside a scan
    than outside it)."""
    n = arrays[0].shape[0]
    parts, first = [], 0
    if isinstance(n, int):
        first = min(chunk, n)
        carry, ys = body(None if callable(carry) else carry, tuple(a[:first] for a in arrays))
        parts.append(ys)
    elif callable(carry):
        carry = carry()
    whole = (n - first) // chunk
    full = first + whole * chunk
    if whole:
        xs = tuple(a[first:full].reshape(whole, chunk, *a.shape[1:]) for a in arrays)
        carry, ys = jax.lax.scan(body, carry, xs)
        parts.append(tuple(y.reshape(whole * chunk, *y.shape[2:]) for y in ys))
    if full < n or not parts:
        carry, ys = body(carry, tuple(a[full:] for a in arrays))
        parts.append(ys)
    return carry, tuple(jnp.concatenate(p) if len(p) > 1 else p[0] for p in zip(*parts))


# --- the head's matmuls in the chunk loop ----------------------------------------------------
# What XLA's CPU backend would keep across the loop, [V, H] float32 each: it computes a 16-bit
# matmul in float32, converting its operands first; the weight being the same in every chunk,
# it hoists that conversion out of the loop and keeps two float32 copies of the weight for the
# whole loop (a transposed one for hidden @ weight.T, one for dlogits @ weight); and it adds
# each chunk's dlogits.T @ hidden to the dweight accumulator as a new [V, H] product. So the
# loop takes the weight as its matmuls do (_with_heads: on the CPU one float32 copy, made once),
# and adds to the accumulator a block of its rows at a time, in place (_add_dweight).

# the dweight accumulator gets each chunk's share in this many blocks of rows (at most)
DWEIGHT_BLOCKS = 8


def _with_heads(fn, *weights):
    """fn(*weights), each weight as the chunk loop's matmuls take it: where the loop runs on the
    CPU a bfloat16 / float16 weight converted to float32 once, before the loop (XLA's CPU matmuls
    compute in float32: the products are the same; one [V, H] float32 copy where XLA's own
    conversion keeps two), elsewhere (a GPU's 16-bit matmuls) as it is. _logits and _dhidden
    take them."""
    if all(w.dtype.itemsize > 2 for w in weights):
        return fn(*weights)
    widened = lambda *ws: fn(*(w.astype(jnp.float32) if w.dtype.itemsize <= 2 else w for w in ws))  # noqa: E731
    return jax.lax.platform_dependent(*weights, cpu=widened, default=fn)


def _logits(h, w, b):
    """A chunk's logits [n, V] in hidden's dtype; w as _with_heads gives it."""
    logits = jnp.dot(h.astype(w.dtype), w.T).astype(h.dtype)
    return logits if b is None else logits + b


def _dhidden(dl, w):
    """dlogits @ weight in dlogits' dtype; w as _with_heads gives it."""
    return jnp.dot(dl.astype(w.dtype), w).astype(dl.dtype)


def _add_dweight(dw, dl, h):
    """dw + dl.T @ h (float32 [V, H]; dw None: the product alone), in place: DWEIGHT_BLOCKS
    blocks of dw's rows in a fori_loop, each block's product added to its rows by a
    dynamic_update_slice (which XLA does in the accumulator's buffer), so that only one block's
    product [V / DWEIGHT_BLOCKS, H] exists beside dw. The last block may overlap the one before
    it (V not a multiple of the block): its columns of dl already added are zeroed."""
    if dw is None:
        return jnp.dot(dl.T, h, preferred_element_type=jnp.float32)
    v = dw.shape[0]
    rows = -(-v // DWEIGHT_BLOCKS) if v else 0
    if rows == 0 or rows == v:
        return dw + jnp.dot(dl.T, h, preferred_element_type=jnp.float32)

    def block(j, dw):
        start = j * rows
        first = jnp.minimum(start, v - rows)  # where dynamic_slice puts the block
        d = jax.lax.dynamic_slice_in_dim(dl, first, rows, 1)
        if v % rows:
            d = jnp.where(first + jnp.arange(rows) >= start, d, jnp.zeros((), d.dtype))
        part = jax.lax.dynamic_slice_in_dim(dw, first, rows, 0) + jnp.dot(d.T, h, preferred_element_type=jnp.float32)
        return jax.lax.dynamic_update_slice_in_dim(dw, part, first, 0)

    return jax.lax.fori_loop(0, -(-v // rows), block, dw)


def _accumulate(carry, dl, h, b=None):
    """(dweight, dbias) float32 accumulators plus one chunk's share; carry None (_over_chunks'
    first chunk): that share, dbias where there is a bias b."""
    dw, db = (None, None) if carry is None else carry
    if carry is None and b is not None:
        return _add_dweight(None, dl, h), jnp.sum(dl, axis=0, dtype=jnp.float32)
    return _add_dweight(dw, dl, h), None if db is None else db + jnp.sum(dl, axis=0, dtype=jnp.float32)


def _zeros(w, b, *others):
    """float32 accumulators of dweight and dbias (typed as varying over the shard_map axes of
    all the arrays, as the scan's sums will be)."""
    axes = varying_axes(w, b, *others)
    zeros = lambda a: vary_like(axes, jnp.zeros(a.shape, jnp.float32))  # noqa: E731
    return zeros(w), None if b is None else zeros(b)


def _scaled(a, scale, dtype):
    return None if a is None else (a.astype(jnp.float32) * scale).astype(dtype)


# --- one device's share: its tokens, its classes ---------------------------------------------


def _masked(rows_ok, t, *per_row):
    """Padding tokens out of the kernel's way (a valid class id) and of the results (0)."""
    if rows_ok is None:
        return t, per_row
    t = jnp.where(rows_ok, t, jnp.zeros((), t.dtype))
    return t, tuple(jnp.where(rows_ok.reshape(-1, *(1,) * (a.ndim - 1)), a, jnp.zeros((), a.dtype)) for a in per_row)


def _chunk_fwd_bwd(where, logits, t, ok, opts, offset, g=None, lse=None):
    """(loss, z, lse, dlogits) of one chunk of this device's logits: fuselet's kernel where the
    classes are whole, else the vocab-parallel math (statistics combined over the vocab axes).
    With g and lse (the "none" backward): dlogits alone, scaled by g."""
    if not where.vocab_axes:
        if g is not None:
            t_k, _ = _masked(ok, t)
            dl = _bwd_call(g, logits, t_k, lse, opts)
            return _masked(ok, t, dl)[1][0]
        t_k, _ = _masked(ok, t)
        loss, z, dl = _fwd_bwd(logits, t_k, opts, 1.0)
        return _masked(ok, t, loss, z, dl)[1]
    op_args = opts.op_args()
    if g is not None:
        return vp.dlogits(logits, t, g, lse, op_args, where.vocab, offset, ok)
    loss, z, lse = vp.stats(logits, t, op_args, where.vocab_axes, where.vocab, offset, ok)
    return loss, z, vp.dlogits(logits, t, jnp.ones_like(loss), lse, op_args, where.vocab, offset, ok)


def _local_reduced(where, opts, chunk, mean, h, w, b, t):
    """(loss, z, dhidden, dweight, dbias) of this device's tokens and classes, the loss and z
    summed (mean: divided by the count) over all tokens, the gradients of the "sum" / "mean" loss."""
    w, b, offset = where.head(w, b)
    ok = where.rows_ok(h.shape[0])
    ok_all = jnp.ones(h.shape[0], bool) if ok is None else ok

    def loop(w_mm):
        def body(carry, xs):
            h_i, t_i, ok_i = xs
            loss_i, z_i, dl = _chunk_fwd_bwd(where, _logits(h_i, w_mm, b), t_i, None if ok is None else ok_i, opts, offset)
            return _accumulate(carry, dl, h_i, b), (loss_i, z_i, _dhidden(dl, w_mm))

        return _over_chunks(body, lambda: _zeros(w, b, h, t), (h, t, ok_all), chunk)

    (dw, db), (loss, z, dh) = _with_heads(loop, w)
    dh = where.sum_classes(dh)  # each device's dlogits_r @ weight_r: its share of dhidden
    count = jnp.sum(vp.kept(t, opts.ignore_index) & ok_all, dtype=jnp.float32)
    sums = where.sum_tokens(jnp.stack([jnp.sum(loss), jnp.sum(z), count]))
    dw = where.sum_tokens(dw)
    db = None if db is None else where.sum_tokens(db)
    scale = 1.0 / jnp.maximum(sums[2], 1.0) if mean else 1.0
    grads = (_scaled(dh, scale, h.dtype), _scaled(dw, scale, w.dtype), None if b is None else _scaled(db, scale, b.dtype))
    return (sums[0] * scale, sums[1] * scale, *grads)


def _local_fwd(where, opts, chunk, h, w, b, t):
    """(loss, z, lse) per token of this device's tokens [n], float32."""
    w, b, offset = where.head(w, b)
    ok = where.rows_ok(h.shape[0])

    def loop(w_mm):
        def body(carry, xs):
            h_i, t_i = xs[:2]
            ok_i = xs[2] if ok is not None else None
            logits = _logits(h_i, w_mm, b)
            if where.vocab_axes:
                return carry, vp.stats(logits, t_i, opts.op_args(), where.vocab_axes, where.vocab, offset, ok_i)
            t_k, _ = _masked(ok_i, t_i)
            return carry, _masked(ok_i, t_i, *_fwd_call(logits, t_k, opts))[1]

        arrays = (h, t) if ok is None else (h, t, ok)
        return _over_chunks(body, (), arrays, chunk)[1]

    return _with_heads(loop, w)


def _local_bwd(where, opts, chunk, g, h, w, b, t, lse):
    """(dhidden, dweight, dbias) of the per-token loss under the cotangent g [n]."""
    w, b, offset = where.head(w, b)
    ok = where.rows_ok(h.shape[0])

    def loop(w_mm):
        def body(carry, xs):
            h_i, t_i, g_i, l_i = xs[:4]
            ok_i = xs[4] if ok is not None else None
            dl = _chunk_fwd_bwd(where, _logits(h_i, w_mm, b), t_i, ok_i, opts, offset, g_i, l_i)
            return _accumulate(carry, dl, h_i, b), (_dhidden(dl, w_mm),)

        return _over_chunks(body, lambda: _zeros(w, b, *arrays), arrays, chunk)

    arrays = (h, t, g.astype(jnp.float32), lse) + (() if ok is None else (ok,))
    (dw, db), (dh,) = _with_heads(loop, w)
    dh = where.sum_classes(dh)
    dw, db = where.sum_tokens(dw), None if db is None else where.sum_tokens(db)
    return dh, dw.astype(w.dtype), None if b is None else db.astype(b.dtype)


# --- the partitioned calls (_chunk_partition) ------------------------------------------------

# kind: (inputs, outputs), of the kinds of cp.FACTORS; "b" entries are dropped without a bias
_KINDS = {
    "reduced": ("hwbt", "sshwb"),
    "fwd": ("hwbt", "ttt"),
    "bwd": ("thwbtt", "hwb"),
}
_LOCAL = {"reduced": _local_reduced, "fwd": _local_fwd, "bwd": _local_bwd}


def _local_call(kind: str, opts, chunk: int, mean: bool, has_bias: bool):
    """(input kinds, output kinds, call(where, *arrays)): the chunked loop `kind` on one device's
    share, over its arrays (no None for an absent bias) and giving them (no None)."""
    extra = (mean,) if kind == "reduced" else ()
    local = lambda where, *a: _LOCAL[kind](where, opts, chunk, *extra, *a)  # noqa: E731
    return cp.local_call(*_KINDS[kind], local, has_bias)


@functools.cache
def _partitioned(kind: str, opts, chunk: int, mean: bool, has_bias: bool):
    """The chunked loop `kind` as one custom_partitioning call over its arrays (no None)."""
    return cp.partitioned(*_local_call(kind, opts, chunk, mean, has_bias))


def _run(kind, cfg, *args):
    """The chunked loop `kind` (cfg: opts, chunk, mean, axis, vocab_size): partitioned, or with
    axis (inside the caller's shard_map) this device's share, the classes over axis."""
    opts, chunk, mean, axis, vocab_size = cfg
    if axis is not None:
        h, w = args[1:3] if kind == "bwd" else args[:2]
        extra = (mean,) if kind == "reduced" else ()
        return _LOCAL[kind](cp.in_shard_map(axis, vocab_size, w, h), opts, chunk, *extra, *args)
    has_bias = args[3 if kind == "bwd" else 2] is not None
    given = tuple(a for a in args if a is not None)
    loop = _local_call(kind, opts, chunk, mean, has_bias)
    layout = cp.explicit(given, loop[0])
    if layout is not None:
        results = iter(cp.shard_mapped(*loop, layout, given))
    else:
        results = iter(_partitioned(kind, opts, chunk, mean, has_bias)(*given))
    n_out = len(_KINDS[kind][1])
    bias_out = _KINDS[kind][1].find("b")
    return tuple(next(results) if has_bias or i != bias_out else None for i in range(n_out))


# --- reduction "mean" / "sum": gradients in the forward --------------------------------------


def _reduced_fwd(h, w, b, t, cfg):
    loss, z, *grads = _run("reduced", cfg, h, w, b, t)
    return (loss, z), tuple(grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _reduced(h, w, b, t, cfg):
    return _reduced_fwd(h, w, b, t, cfg)[0]


def _reduced_bwd(cfg, res, g):
    gl = g[0]  # z is for logging: no gradient flows through it
    return (*(None if a is None else _scaled(a, gl, a.dtype) for a in res), None)


_reduced.defvjp(_reduced_fwd, _reduced_bwd)


# --- reduction "none": the backward recomputes the logits ------------------------------------


def _per_token_fwd(h, w, b, t, cfg):
    loss, z, lse = _run("fwd", cfg, h, w, b, t)
    return (loss, z), (h, w, b, t, lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _per_token(h, w, b, t, cfg):
    return _per_token_fwd(h, w, b, t, cfg)[0]


def _per_token_bwd(cfg, res, g):
    h, w, b, t, lse = res
    return (*_run("bwd", cfg, g[0], h, w, b, t, lse), None)


_per_token.defvjp(_per_token_fwd, _per_token_bwd)


def _loss(h, w, b, t, opts, chunk, reduction, axis=None, vocab_size=None):
    if axis is not None:
        # The head's gradient is summed over the axes the tokens vary over (the transpose of
        # this cast); hidden's over the classes' axes inside (psum): it is not cast.
        varying = varying_axes(h, t) - frozenset(axis)
        w, b = vary_like(varying, w), vary_like(varying, b)
    cfg = (opts, chunk, reduction == "mean", axis, vocab_size)
    if reduction == "none":
        return _per_token(h, w, b, t, cfg)
    return _reduced(h, w, b, t, cfg)


# Jitted so that an eager call runs as one computation (inside jit it is inlined).
_loss_jit = jax.jit(_loss, static_argnums=(4, 5, 6, 7, 8))


def _like(a, target):
    """a [N] reshaped to target's shape, and (Explicit mesh axes) to its sharding."""
    sharding = jax.typeof(target).sharding
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and jax.sharding.AxisType.Explicit in tuple(mesh.axis_types) and any(sharding.spec):
        return jax.lax.reshape(a, target.shape, out_sharding=sharding)
    return a.reshape(target.shape)


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
    axis_name=None,
    vocab_size: int | None = None,
):
    """cross_entropy(hidden @ weight.T + bias, target, ...) without materializing the logits.

    hidden [..., H], weight [V, H], bias [V] or None, all of one dtype (float32, float16 or
    bfloat16); target hidden.shape[:-1] of int32 class ids (int64 with x64). The options are
    cross_entropy's; chunk_size: tokens per chunk (None: chunk_size_for(N, H, V)). Returns the
    float32 loss (target's shape for reduction="none"), and with return_z_loss=True (loss, z).

    Under jax.jit, a weight (and bias) sharded on V over mesh axes stays sharded: each device
    computes the logits of its classes only (docs/tensor_parallel.md). Inside shard_map,
    axis_name (a mesh axis name or a tuple of them) says that weight and bias are this device's
    block of the classes over that axis, in axis order, target holding global class ids: the
    result and hidden's gradient are the whole head's (alike on every device of the axis), the
    weight's gradient this block's; the reduction is over this device's tokens. vocab_size (with
    axis_name): the real V where the blocks are padded (the classes from vocab_size on are
    ignored); None: V_r times the axis size."""
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
    axis = vp.check_axis_name(axis_name)
    vocab_size = vp.check_vocab_size(vocab_size, axis, weight.shape[0])
    shape, h_dim = target.shape, hidden.shape[-1]
    chunk = chunk_size or chunk_size_for(math.prod(shape), h_dim, weight.shape[0])
    opts = options.cross_entropy
    h2, t1 = hidden.reshape(-1, h_dim), target.reshape(-1)
    if axis is not None:  # inside the caller's shard_map: no jit of our own
        loss, z = _loss(h2, weight, bias, t1, opts, chunk, reduction, axis, vocab_size)
    else:
        vp.refuse_targets(target, weight, 0, weight.shape[0], opts.ignore_index)
        loss, z = _target_errors(target, lambda: _loss_jit(h2, weight, bias, t1, opts, chunk, reduction))
    if reduction == "none":
        loss, z = _like(loss, target), _like(z, target)
    return (loss, jax.lax.stop_gradient(z)) if return_z_loss else loss
