"""FFI calls of fuselet.jax: registered targets, row sharding rules (see _sharding), vmap.

row_op(op, in_kinds, out_kinds, args, fold, workspace=False, **attrs) is how every op family
calls its FFI targets.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fuselet import _core
from fuselet.jax import _load, _sharding
from fuselet.jax._sharding import GROUPS, HALF, ROWS, STATS


def _call(op: str, outs, *args, aliases=(), **attrs):
    """aliases: ((input index, output index), ...), outputs that may reuse an input's buffer
    (XLA copies the input first where it is still live)."""
    target = _load.target(op)
    return jax.ffi.ffi_call(target, outs, input_output_aliases=dict(aliases) or None)(*args, **attrs)


def _workspace_bytes(x) -> int:
    """The CUDA backward's workspace for the rows of x: an output buffer of the FFI call (so that
    XLA can capture the call in a command buffer); 0 where the CUDA handlers are not registered."""
    from fuselet.jax import BUILD_INFO

    if not _load.cuda_targets(bool(BUILD_INFO.get("cuda_kernels"))):
        return 0
    return _core.norm_bwd_workspace_bytes_cuda(math.prod(x.shape[:-1]), x.shape[-1])


@functools.cache
def _op(
    op: str,
    in_kinds: tuple,
    out_kinds: tuple,
    workspace: bool,
    attrs: tuple,
    core_dims: int,
    aliases: tuple = (),
    sharded_last=None,
):
    """The FFI call `op` with row sharding rules (see _sharding), attrs as ((name, value), ...).
    With `workspace`, the call has one more (uint8) output, its workspace, dropped here.
    aliases: see _call. sharded_last(axes, width, attrs, *args): see _sharding.row_partitioned
    (its attrs: a dict)."""

    def call(*args):
        outs = _sharding.out_types(args, in_kinds, out_kinds, dict(attrs))
        if workspace:
            outs += (jax.ShapeDtypeStruct((_workspace_bytes(args[in_kinds.index(ROWS)]),), jnp.uint8),)
        return tuple(_call(op, outs, *args, aliases=aliases, **dict(attrs)))[: len(out_kinds)]

    last = None if sharded_last is None else (lambda axes, width, *a: sharded_last(axes, width, dict(attrs), *a))
    return _sharding.row_partitioned(call, in_kinds, out_kinds, core_dims, last)


def row_op(op, in_kinds, out_kinds, args, fold, workspace=False, core_dims=1, aliases=(), sharded_last=None, **attrs):
    """_op(...)(*args), vmappable (see _batched) and typed for shard_map (see _sharding.vary_like).
    sharded_last: a module-level function (see _op)."""
    axes = _sharding.varying_axes(*args)
    fn = _op(op, in_kinds, out_kinds, workspace, tuple(sorted(attrs.items())), core_dims, tuple(aliases), sharded_last)
    call = lambda *a: tuple(_sharding.vary_like(axes, r) for r in fn(*a))  # noqa: E731
    return _batched(call, tuple(k in (ROWS, HALF, STATS, GROUPS) for k in in_kinds), fold)(*args)


def _batched(fn, row_args: tuple[bool, ...], fold: bool):
    """fn(*args) -> tuple, made vmappable.

    row_args[i]: arg i is [..., H] rows (x, dy) or per-row stats; the others are per-H
    parameters. With `fold`, a vmap that batches only row args adds a leading row dim
    (the kernel treats every leading dim as rows); otherwise, or when a parameter is
    batched, the batch runs as a loop (lax.map).
    """
    f = jax.custom_batching.custom_vmap(fn)

    @f.def_vmap
    def rule(axis_size, in_batched, *args):
        def full(a, b):
            return a if b else jnp.broadcast_to(a, (axis_size, *a.shape))

        if fold and not any(b for b, r in zip(in_batched, row_args) if not r):
            out = fn(*(full(a, b) if r else a for a, b, r in zip(args, in_batched, row_args)))
        else:
            out = jax.lax.map(lambda xs: fn(*xs), tuple(full(a, b) for a, b in zip(args, in_batched)))
        return out, tuple(True for _ in out)

    return f
