"""Rotary position embedding for JAX: FFI calls wrapped in custom_vjp, custom_vmap and
custom_partitioning.

Math and shapes: csrc/core/include/fuselet/rope.h. x is [B, S, N, D] (layout="bshd") or
[B, N, S, D] (layout="bhsd"), B optional; cos and sin are [S, R] or [B, S, R], float32 or x's
dtype. The first R features of each head rotate (interleaved=False: i pairs with i + R/2,
transformers' rotate_half; True: 2j with 2j+1, GPT-J), the rest pass through. y has x's shape
and dtype. jax.grad gives x its gradient (the transposed rotation) and cos, sin zeros.

pair_table=True: cos and sin hold one angle per rotating pair, [S, R/2] or [B, S, R/2].
sections=(s_0, ..., s_{K-1}): cos and sin are K tables [K, S, R'] or [K, B, S, R'], pair j
reading the table of its section (contiguous; interleaved_sections=True: Qwen3-VL's rule); the
FFI targets rope_sections_fwd / _bwd. The K dim is never sharded.

Sharding: every head is independent, so y keeps x's sharding of B, S and N (no collective); a
sharded D is gathered. cos and sin are taken sharded like x along S (and B for [B, S, R]
tables), replicated along R: a replicated table is sliced in place, a table sharded some
other way is resharded (it, not x). vmap folds the mapped dim into B (the tables are
broadcast over it where they are not mapped themselves): one kernel call, no loop.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fuselet.jax import _sharding
from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import _call
from fuselet.spec import rope as spec

INTERLEAVED, BHSD, PAIR_TABLE, SECTIONS_INTERLEAVED = 1, 2, 4, 8  # fuselet_rope_flags of fuselet/rope.h


def _factors(ndim: int, bhsd: bool) -> list[str]:
    """Names of x's dims: b (if present), s, n in memory order, then d."""
    inner = ["n", "s"] if bhsd else ["s", "n"]
    return (["b"] if ndim == 4 else []) + inner + ["d"]


def _specs(x_sharding, ndim: int, cos_ndim: int, bhsd: bool, kd: int = 0):
    """(x / y spec, cos / sin spec): x keeps b, s, n; d and r replicated; cos follows x's b, s
    (its K dim, kd = 1, replicated)."""
    spec = tuple(x_sharding.spec) if isinstance(x_sharding, NamedSharding) else ()
    spec = (spec + (None,) * ndim)[:ndim]
    by = dict(zip(_factors(ndim, bhsd), spec))
    x_spec = P(*spec[:-1], None)
    cos_spec = P(*([None] * kd), *([by["b"]] if cos_ndim == 3 + kd else []), by["s"], None)
    return x_spec, cos_spec


@functools.cache
def _partitioned(op: str, flags: int, sections: tuple[int, ...] = ()):
    """The FFI call op(x or dy, cos, sin) -> like x, partitioned as the module doc says (with
    sections: op's rope_sections_ target)."""
    bhsd = bool(flags & BHSD)
    kd = 1 if sections else 0

    def call(x, cos, sin):
        out = (jax.ShapeDtypeStruct(x.shape, x.dtype),)
        if sections:
            target = op.replace("rope_", "rope_sections_")
            return _call(target, out, x, cos, sin, flags=np.int32(flags), sections=np.array(sections, np.int64))[0]
        return _call(op, out, x, cos, sin, flags=np.int32(flags))[0]

    def shardings(mesh, arg_shapes):
        x, cos = arg_shapes[0], arg_shapes[1]
        x_spec, cos_spec = _specs(x.sharding, len(x.shape), len(cos.shape), bhsd, kd)
        xs, cs = NamedSharding(mesh, x_spec), NamedSharding(mesh, cos_spec)
        return (xs, cs, cs), xs

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        ins, out = shardings(mesh, arg_shapes)
        return mesh, call, out, ins

    def rule(mesh, value_types, result_types):
        x = " ".join(_factors(len(value_types[0].shape), bhsd))
        table = ("k " if kd else "") + ("b " if len(value_types[1].shape) == 3 + kd else "") + "s r"
        return f"{x}, {table}, {table} -> {x}", {"need_replication_factors": ("d", "k", "r") if kd else ("d", "r")}

    wrapped = custom_partitioning(call)
    wrapped.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return wrapped


def _batched(fn, kd: int = 0):
    """fn(x, cos, sin) made vmappable by folding the mapped dim into B (kd = 1: the tables have a
    leading K dim, kept in front)."""
    f = jax.custom_batching.custom_vmap(fn)

    @f.def_vmap
    def rule(axis_size, in_batched, x, cos, sin):
        x = x if in_batched[0] else jnp.broadcast_to(x, (axis_size, *x.shape))
        has_b = x.ndim == 5  # [V, B, ...] (else [V, S, N, D] / [V, N, S, D]: V becomes B)
        if not in_batched[1] and not in_batched[2] and cos.ndim == 2 + kd:
            tables = (cos, sin)  # shared by every sequence of every mapped example
        else:
            tables = tuple(t if b else jnp.broadcast_to(t, (axis_size, *t.shape)) for t, b in zip((cos, sin), in_batched[1:]))
            if kd:  # [V, K, ...] -> [K, V, ...]: V next to the tables' B (or as it)
                tables = tuple(jnp.moveaxis(t, 0, 1) for t in tables)
            if has_b:  # [K,] [V, B, S, R], or [K,] [V, S, R] shared over B
                tables = tuple(
                    t
                    if t.ndim == 4 + kd
                    else jnp.broadcast_to(jnp.expand_dims(t, kd + 1), (*t.shape[:kd], axis_size, x.shape[1], *t.shape[kd + 1 :]))
                    for t in tables
                )
                tables = tuple(t.reshape(*t.shape[:kd], -1, *t.shape[kd + 2 :]) for t in tables)
        out = fn(x.reshape(-1, *x.shape[2:]) if has_b else x, *tables)
        return out.reshape(x.shape), True

    return f


def _apply(op: str, x, cos, sin, flags: int, sections: tuple[int, ...]):
    axes = _sharding.varying_axes(x, cos, sin)
    fn = _partitioned(op, flags, sections)
    return _batched(lambda a, c, s: _sharding.vary_like(axes, fn(a, c, s)), 1 if sections else 0)(x, cos, sin)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _rope(x, cos, sin, flags, sections):
    return _apply("rope_fwd", x, cos, sin, flags, sections)


def _rope_fwd(x, cos, sin, flags, sections):
    return _apply("rope_fwd", x, cos, sin, flags, sections), (cos, sin)


def _rope_bwd(flags, sections, res, dy):
    cos, sin = res
    return _apply("rope_bwd", dy, cos, sin, flags, sections), jnp.zeros_like(cos), jnp.zeros_like(sin)


_rope.defvjp(_rope_fwd, _rope_bwd)
# Jitted so that an eager call with sharded x is partitioned too (inside jit it is inlined).
_rope_jit = jax.jit(_rope, static_argnums=(3, 4))


def rope(
    x,
    cos,
    sin,
    *,
    layout: str = "bshd",
    interleaved: bool = False,
    pair_table: bool = False,
    sections: tuple[int, ...] | None = None,
    interleaved_sections: bool = False,
):
    """y[..., i] = x[..., i] * cos[i] + rot(x)[..., i] * sin[i] for i < R; x[..., i] beyond
    (cos[i], sin[i]: feature i's angle, from its pair's column with pair_table and from its
    pair's table with sections: fuselet/rope.h)."""
    options = spec.rope(
        array_facts("x", x),
        array_facts("cos", cos),
        array_facts("sin", sin),
        layout,
        interleaved,
        pair_table,
        sections,
        interleaved_sections,
    )
    bhsd, interleaved, pair_table, sections, interleaved_sections = options.op_args()
    flags = (
        (BHSD if bhsd else 0)
        | (INTERLEAVED if interleaved else 0)
        | (PAIR_TABLE if pair_table else 0)
        | (SECTIONS_INTERLEAVED if interleaved_sections else 0)
    )
    axes = _sharding.varying_axes(x)
    return _rope_jit(x, _sharding.vary_like(axes, cos), _sharding.vary_like(axes, sin), flags, tuple(sections or ()))
