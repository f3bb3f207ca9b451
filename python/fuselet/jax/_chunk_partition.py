"""The partitioning of a chunked loop over an LM head (fused_linear_cross_entropy,
_vocab_parallel_logprobs, _vocab_parallel_jsd; docs/tensor_parallel.md).

The loop is one custom_partitioning call (partitioned), or under jax.shard_map where the head or
hidden is sharded over Explicit mesh axes (explicit, shard_mapped). Either way each device runs
call(where, *arrays) over its own tokens and its own classes, `where` (Where) saying which. A
loop names its arrays by kinds, one letter each, and gives each kind its Shardy factors: n the
tokens, v the classes, any other a dim whole on every device (the hidden dims). The token axes
are hidden's ("h") leading dim's mesh axes, the vocab axes the head's ("w") rows'; an array's
PartitionSpec follows from its factors (specs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fuselet.jax import _vocab_parallel as vp
from fuselet.jax._ffi import _batched

# The factors of one head's arrays: hidden, weight, bias, per token, a scalar.
FACTORS = {"h": "n k", "w": "v k", "b": "v", "t": "n", "s": ""}


class Where:
    """Where one device's block sits: the mesh axes of the classes and of the tokens (both ()
    unsharded or in the unpartitioned call), V and N (the real ones: XLA pads uneven blocks)."""

    def __init__(self, vocab_axes, token_axes, vocab, tokens):
        self.vocab_axes, self.token_axes, self.vocab, self.tokens = vocab_axes, token_axes, vocab, tokens

    def head(self, w, b):
        """(w, b, offset): the block's rows, padding rows (past V) zeroed; the first one's class."""
        offset = vp.index(self.vocab_axes) * w.shape[0]
        if w.shape[0] * vp.axis_size(self.vocab_axes) != self.vocab:
            real = offset + jnp.arange(w.shape[0]) < self.vocab
            w = jnp.where(real[:, None], w, jnp.zeros((), w.dtype))
            b = None if b is None else jnp.where(real, b, jnp.zeros((), b.dtype))
        return w, b, offset

    def rows_ok(self, n):
        """[n] bool, False on padding tokens (past N), or None where there are none."""
        if n * vp.axis_size(self.token_axes) == self.tokens:
            return None
        return vp.index(self.token_axes) * n + jnp.arange(n) < self.tokens

    def sum_tokens(self, a):
        return jax.lax.psum(a, self.token_axes) if self.token_axes else a

    def sum_classes(self, a):
        return jax.lax.psum(a, self.vocab_axes) if self.vocab_axes else a


def in_shard_map(axis: tuple, vocab_size, w, h) -> Where:
    """This device's block inside the caller's shard_map: the classes (w's rows) over `axis`
    (vocab_size the real V, None: w's rows times the axis size), the tokens (h's) its own."""
    return Where(axis, (), vocab_size or w.shape[0] * vp.axis_size(axis), h.shape[0])


def local_call(ins: str, outs: str, local, has_bias: bool):
    """(ins, outs, call(where, *arrays)): the loop local(where, *arrays) over arrays of the kinds
    `ins` giving `outs`, "b" (a bias and its gradient) dropped without a bias; call takes and
    gives no None (local takes a None bias after the weight, and may give None)."""
    if not has_bias:
        ins, outs = ins.replace("b", ""), outs.replace("b", "")

    def call(where, *args):
        args = list(args)
        if not has_bias:
            args.insert(ins.index("w") + 1, None)
        return tuple(r for r in local(where, *args) if r is not None)

    return ins, outs, call


def layout(arg_shapes, ins: str, vocab_kinds: str = "w") -> tuple:
    """(vocab axes, token axes) of the operands: the rows' of the first of `vocab_kinds` whose
    rows are sharded, hidden's leading dim's (but the vocab axes, which its tokens cannot share)."""

    def axes(kind):
        sharding = arg_shapes[ins.index(kind)].sharding
        spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
        return vp.axes_of(spec[0]) if spec else ()

    vocab = next((a for a in map(axes, vocab_kinds) if a), ())
    return vocab, tuple(a for a in axes("h") if a not in vocab)


def specs(kinds: str, factors: dict, vocab: tuple, tokens: tuple) -> tuple:
    """The PartitionSpec of each kind: its factor n over the token axes, v over the vocab axes,
    the others whole."""
    axes = {"n": tokens or None, "v": vocab or None}
    return tuple(P(*(axes.get(f) for f in factors[k].split())) for k in kinds)


def sizes(ins: str, shapes) -> tuple:
    """(V, N): the weight's rows, hidden's tokens."""
    return shapes[ins.index("w")].shape[0], shapes[ins.index("h")].shape[0]


def partitioned(ins: str, outs: str, call, factors: dict = FACTORS, vocab_kinds: str = "w", whole=None):
    """The loop call(where, *arrays) as one custom_partitioning call over arrays of the kinds
    `ins` giving `outs` (layout: vocab_kinds). whole(*arrays): the unpartitioned call (one device,
    everything whole; None: call's). vmappable: a vmap runs it as a loop (lax.map)."""

    def fn(*args):
        return whole(*args) if whole is not None else call(Where((), (), *sizes(ins, args)), *args)

    def shardings(mesh, arg_shapes):
        vocab, tokens = layout(arg_shapes, ins, vocab_kinds)
        named = lambda kinds: tuple(NamedSharding(mesh, s) for s in specs(kinds, factors, vocab, tokens))  # noqa: E731
        return vocab, tokens, named(ins), named(outs)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[3]

    def partition(mesh, arg_shapes, result_shape):
        vocab, tokens, in_s, out_s = shardings(mesh, arg_shapes)
        where = Where(vocab, tokens, *sizes(ins, arg_shapes))
        return mesh, lambda *a: call(where, *a), out_s, in_s

    rule = f"{', '.join(factors[k] for k in ins)} -> {', '.join(factors[k] for k in outs)}"
    # the factors but n and v need replication, in order of first appearance (Shardy's index)
    whole_dims = tuple(f for f in dict.fromkeys(rule.replace(",", " ").split()) if f not in ("n", "v", "->"))
    wrapped = custom_partitioning(fn)
    wrapped.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule, need_replication_factors=whole_dims)
    return _batched(wrapped, (False,) * len(ins), False)


def explicit(args, ins: str):
    """(mesh, vocab axes, token axes) where hidden or the weight is sharded over Explicit mesh axes
    (sharding in types: jax.make_mesh's default), else None. custom_partitioning traces the
    whole loop with the global types, which Explicit axes refuse (a chunk that straddles the
    devices' tokens): there the loop runs under jax.shard_map instead (shard_mapped)."""

    def axes(kind):
        sharding = jax.typeof(args[ins.index(kind)]).sharding
        spec = tuple(getattr(sharding, "spec", ()))
        return (vp.axes_of(spec[0]) if spec else ()), getattr(sharding, "mesh", None)

    (vocab, mesh), (tokens, _) = axes("w"), axes("h")
    if mesh is None or not (vocab or tokens):
        return None
    explicit_axes = {n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit}
    if not set(vocab + tokens) <= explicit_axes:
        return None
    return mesh, vocab, tuple(a for a in tokens if a not in vocab)


def shard_mapped(ins: str, outs: str, call, mesh_axes, args, factors: dict = FACTORS):
    """The loop call(where, *args) under jax.shard_map over the Explicit axes of mesh_axes
    (explicit's result), the results but scalars ("s") resharded to the shardings of the
    arguments of their kinds."""
    mesh, vocab, tokens = mesh_axes
    where = Where(vocab, tokens, *sizes(ins, args))
    in_specs, out_specs = specs(ins, factors, vocab, tokens), specs(outs, factors, vocab, tokens)
    given = {k: jax.typeof(a).sharding for k, a in zip(ins, args)}  # the results go back to these
    args = tuple(jax.sharding.reshard(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs))
    results = jax.shard_map(lambda *a: call(where, *a), mesh=mesh, in_specs=in_specs, out_specs=out_specs)(*args)
    return tuple(r if k == "s" else jax.sharding.reshard(r, given[k]) for r, k in zip(results, outs))
