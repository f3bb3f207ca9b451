"""Vocab-parallel cross-entropy for JAX: the classes (the head's rows, the logits' last dim)
sharded over mesh axes, the math of one device's block of them.

The device at index r of the vocab axes holds the classes [r * V_r, (r + 1) * V_r) of the
padded vocabulary (V_r: the block, alike on every device, as SPMD gives it); the classes at or
past V (the real vocabulary: the last blocks of an uneven split, which XLA pads) are masked,
their logits -inf and their gradients 0, whatever the padding holds.

Per block of n rows the forward (stats) takes the local logits [n, V_r], soft-capped in float32,
and combines per-row float32 statistics across the vocab axes in two all-reduces:
  1. pmax of the local row max m_r: the global row max m;
  2. psum of the stacked [k, n]: sum_j exp(s_j - m) (the local sum of exponentials, rescaled to
     the global max), the target's logit (0 on the devices that do not hold it) and, with label
     smoothing, the local sum of the logits (k = 3; else 2).
Then lse = m + log(sum), and the loss (1 - ls)(lse - s_t) + ls (lse - sum / V) + zl lse^2, 0
where the target is ignore_index: alike on every device of the vocab axes. The backward
(dlogits) needs no collective: p_j = exp(s_j - lse) with the global lse is the global softmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding


def axes_of(entry) -> tuple:
    """The mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def check_axis_name(axis_name) -> tuple | None:
    """axis_name as a tuple of mesh axis names, or None."""
    if axis_name is None:
        return None
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"axis_name: expected None, a mesh axis name (str) or a tuple of them, got {axis_name!r}")
    return names


def axis_size(axes: tuple) -> int:
    """The devices over the named axes (inside shard_map or a partitioned computation)."""
    return int(jax.lax.axis_size(axes)) if axes else 1


def index(axes: tuple):
    """This device's linear index over `axes` (0 with none)."""
    return jax.lax.axis_index(axes) if axes else 0


def kept(t, ignore_index: int):
    """True where the target counts (is not ignore_index)."""
    info = jnp.iinfo(t.dtype)
    if not info.min <= ignore_index <= info.max:  # no target can equal it
        return jnp.ones(t.shape, bool)
    return t != ignore_index


def _capped(logits, softcap: float):
    s = logits.astype(jnp.float32)
    return softcap * jnp.tanh(s / softcap) if softcap else s


def _columns(n_cols: int, offset, vocab: int):
    """(global class id of each local column, whether it is a real class)."""
    cols = offset + jnp.arange(n_cols, dtype=jnp.int32)
    return cols, cols < vocab


def _local_target(t, offset, n_cols: int, vocab: int, keep):
    """(the target's local column, clipped into the block; whether this block holds it)."""
    local = t.astype(jnp.int32) - offset
    owned = keep & (local >= 0) & (local < n_cols) & (t < vocab)
    return jnp.clip(local, 0, max(n_cols - 1, 0)), owned


def stats(logits, t, op_args: tuple, axes: tuple, vocab: int, offset, rows_ok=None):
    """(loss, z, lse) per row [n], float32, alike on every device of `axes`: logits [n, V_r] this
    device's classes [offset, offset + V_r) (those >= vocab masked), t [n] global class ids.
    rows_ok [n] bool or None: False for padding rows (0, like ignored ones). A target outside
    [0, vocab) that is not ignore_index gives NaN (eager calls on the CPU refuse it first:
    refuse_targets)."""
    ignore_index, ls, zl, cap = op_args
    n_cols = logits.shape[-1]
    s = _capped(logits, cap)
    cols, real = _columns(n_cols, offset, vocab)
    s_real = jnp.where(real, s, -jnp.inf)
    keep = kept(t, ignore_index)
    if rows_ok is not None:
        keep = keep & rows_ok
    local, owned = _local_target(t, offset, n_cols, vocab, keep)
    m = jnp.max(s_real, axis=-1) if n_cols else jnp.full(t.shape, -jnp.inf, jnp.float32)
    if axes:
        m = jax.lax.pmax(m, axes)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # rows of no real class anywhere: never kept
    parts = [
        jnp.sum(jnp.exp(s_real - m[..., None]), axis=-1),
        jnp.where(owned, jnp.take_along_axis(s, local[..., None], axis=-1)[..., 0], 0.0),
    ]
    if ls > 0:
        parts.append(jnp.sum(jnp.where(real, s, 0.0), axis=-1))
    summed = jnp.stack(parts)
    if axes:
        summed = jax.lax.psum(summed, axes)  # one all-reduce of [k, n] float32
    lse = m + jnp.log(summed[0])
    ce = lse - summed[1] if ls == 0 else (1.0 - ls) * (lse - summed[1]) + ls * (lse - summed[2] / vocab)
    z = zl * lse * lse
    bad = keep & ((t < 0) | (t >= vocab))
    ce = jnp.where(bad, jnp.nan, ce)
    zero = jnp.zeros((), jnp.float32)
    return jnp.where(keep, ce + z, zero), jnp.where(keep, z, zero), jnp.where(keep, lse, zero)


def dlogits(logits, t, g, lse, op_args: tuple, vocab: int, offset, rows_ok=None):
    """g * d loss_row / d logits [n, V_r] in logits' dtype (g [n] float32, lse [n] the global one
    from stats). No collective."""
    ignore_index, ls, zl, cap = op_args
    n_cols = logits.shape[-1]
    s = _capped(logits, cap)
    cols, real = _columns(n_cols, offset, vocab)
    keep = kept(t, ignore_index)
    if rows_ok is not None:
        keep = keep & rows_ok
    local, owned = _local_target(t, offset, n_cols, vocab, keep)
    g = g.astype(jnp.float32)
    p = jnp.exp(jnp.where(real, s, -jnp.inf) - lse[..., None])
    d = (1.0 + 2.0 * zl * lse)[..., None] * p - jnp.where(real, ls / vocab, 0.0)
    onehot = owned[..., None] & (jnp.arange(n_cols, dtype=jnp.int32) == local[..., None])
    d = d - jnp.where(onehot, 1.0 - ls, 0.0)
    if cap:
        d = d * (1.0 - jnp.square(s / cap))
    d = jnp.where(keep[..., None] & real, g[..., None] * d, 0.0)
    return d.astype(logits.dtype)


def check_vocab_size(vocab_size, axis, block: int) -> int | None:
    """vocab_size (with axis_name only: the real V of padded blocks), or None."""
    if vocab_size is None:
        return None
    if axis is None:
        raise ValueError("vocab_size: expected None without axis_name (a sharded weight's V is its own)")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size: expected a positive int (the real V), got {vocab_size!r}")
    size = axis_size(axis)
    if not (size - 1) * block < vocab_size <= size * block:
        raise ValueError(
            f"vocab_size: expected in ({(size - 1) * block}, {size * block}] (weight's {block} rows on each of "
            f"{size} devices of axis_name, the last block padded), got {vocab_size}"
        )
    return vocab_size


def _sharded_on(a, dim: int) -> bool:
    """Whether the concrete array a is split on its dim `dim` over more than one device."""
    sharding = getattr(a, "sharding", None)
    if not isinstance(sharding, NamedSharding) or a.ndim == 0:
        return False
    spec = tuple(sharding.spec)
    d = dim % a.ndim
    return any(sharding.mesh.shape[name] > 1 for name in axes_of(spec[d] if d < len(spec) else None))


def refuse_targets(target, classes, dim: int, vocab: int, ignore_index: int) -> None:
    """An eager call on the CPU whose classes are sharded (dim `dim` of `classes`: the head's rows,
    the logits' last dim): a target outside [0, vocab) that is not ignore_index raised as the
    ValueError of the unsharded path (the cross-entropy kernel's refusal; `element` the token's
    index in target, flattened). The vocab-parallel math, which no device runs over every class,
    would give NaN for that token, as the CUDA kernel and traced calls do."""
    if isinstance(target, jax.core.Tracer) or isinstance(classes, jax.core.Tracer) or not _sharded_on(classes, dim):
        return
    if {d.platform for d in classes.devices()} != {"cpu"}:
        return
    t = np.asarray(target).reshape(-1)
    bad = ((t < 0) | (t >= vocab)) & (t != ignore_index)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"fuselet: target: element {i} is {int(t[i])}, outside [0, {vocab}) and not ignore_index ({ignore_index})"
        )
