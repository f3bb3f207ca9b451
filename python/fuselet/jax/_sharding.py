"""Sharding rules for FFI calls that treat every leading dim of x [..., H] as independent rows.

`row_partitioned(fn, in_kinds, out_kinds)` wraps fn(*arrays) -> tuple of arrays in
jax.experimental.custom_partitioning. Each array is one of:
  ROWS       [..., H]  rows of x (x, dy, y, dx): the leading dims keep x's sharding, H is
                       gathered when sharded (the kernels need whole rows)
  HALF       [..., H/2] rows of half the width (y and dy of a gated linear unit): like ROWS
  STATS      [...]     one value per row (mean, rstd): sharded like the rows
  GROUPS     [..., G]  one value per group of each row (the gated norm's rstd, G = H / the
                       call's group_size attribute, 1 when it is 0): like STATS, G whole
  PARAM      [H] / [0] a per-column parameter (weight, bias; [0] = absent): replicated
  PARAM_SUM  [H] / [0] an output summed over rows (dweight, dbias): each shard sums its
                       rows, then one all-reduce (psum) over the mesh axes of the rows
So any sharding of the rows runs with no collective but the psum of the parameter
gradients, and a sharded H is gathered for that dimension only. Inside a shard_map over
every mesh axis the call runs as is (each device already holds its rows).
"""

from __future__ import annotations

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

ROWS, HALF, STATS, GROUPS, PARAM, PARAM_SUM = "rows", "half", "stats", "groups", "param", "param_sum"


def out_types(args, in_kinds, out_kinds, attrs: dict | None = None) -> tuple:
    """ShapeDtypeStructs of the outputs: ROWS like the first ROWS input, STATS float32 per row,
    GROUPS float32 per group of group_size (attrs) elements, the k-th PARAM_SUM like the k-th
    PARAM input."""
    x = args[in_kinds.index(ROWS)]
    group_size = int((attrs or {}).get("group_size", 0))
    params = iter([a for a, k in zip(args, in_kinds) if k == PARAM])
    types = {
        ROWS: lambda: jax.ShapeDtypeStruct(x.shape, x.dtype),
        HALF: lambda: jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype),
        STATS: lambda: jax.ShapeDtypeStruct(x.shape[:-1], jax.numpy.float32),
        GROUPS: lambda: jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // group_size if group_size else 1), jax.numpy.float32),
    }
    out = []
    for kind in out_kinds:
        if kind == PARAM_SUM:
            p = next(params)
            out.append(jax.ShapeDtypeStruct(p.shape, p.dtype))
        else:
            out.append(types[kind]())
    return tuple(out)


def _row_spec(sharding, ndim: int, core_dims: int = 1) -> tuple:
    """The partition spec of the leading (row) dims of an [..., H] operand: all but the last
    `core_dims` dims (2 where the kernel reads the second-to-last dim too: causal softmax)."""
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    return (spec + (None,) * ndim)[: ndim - core_dims]


def _spec(kind: str, rows: tuple, core_dims: int = 1) -> P:
    inner = (None,) * core_dims
    return {ROWS: P(*rows, *inner), HALF: P(*rows, *inner), STATS: P(*rows), GROUPS: P(*rows, None)}.get(kind, P(None))


def _mesh_axes(rows: tuple) -> tuple:
    axes = []
    for entry in rows:
        if entry is not None:
            axes.extend(entry if isinstance(entry, tuple) else (entry,))
    return tuple(axes)


def _rule(in_kinds, out_kinds, core_dims=1, whole=("h", "f", "g", "q", "z")):
    """The Shardy rule: row factors r0.. pass through, H ("h"), the half width ("f"), the groups
    ("g"), a core query dim ("q", core_dims=2) and absent parameters ("z") need replication. PARAM_SUM
    results drop the row factors (their psum is in partition)."""

    def rule(mesh, value_types, result_types):
        ndim = len(value_types[in_kinds.index(ROWS)].shape)
        hidden = value_types[in_kinds.index(ROWS)].shape[-1]
        rows = " ".join(f"r{i}" for i in range(ndim - core_dims))
        q = " q" if core_dims == 2 else ""

        def factors(kind, t):
            if kind == ROWS:
                return f"{rows}{q} h".strip()
            if kind == HALF:
                return f"{rows}{q} f".strip()
            if kind == STATS:
                return rows
            if kind == GROUPS:
                return f"{rows} g".strip()
            return "h" if t.shape[0] == hidden else "z"

        ins = ", ".join(factors(k, t) for k, t in zip(in_kinds, value_types))
        outs = ", ".join(factors(k, t) for k, t in zip(out_kinds, result_types))
        rule = f"{ins} -> {outs}"
        used = rule.replace(",", " ").split()
        # In order of first appearance: Shardy wants them sorted by factor index.
        return rule, {"need_replication_factors": tuple(f for f in dict.fromkeys(used) if f in whole)}

    return rule


def _last_axes(sharding, ndim: int, rows: tuple) -> tuple:
    """The mesh axes of the last dim of an [..., H] operand (but those of its rows)."""
    spec = (tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()) + (None,) * ndim
    return tuple(a for a in _mesh_axes((spec[ndim - 1],)) if a not in _mesh_axes(rows))


def row_partitioned(fn, in_kinds: tuple, out_kinds: tuple, core_dims: int = 1, sharded_last=None):
    """fn wrapped so that its rows stay sharded as x's leading dims are (see the module doc);
    core_dims=2: the last two dims are gathered (the kernel indexes the second-to-last).
    sharded_last(axes, width, *args) -> results: where given, a last dim of x sharded over mesh
    axes stays so, each device running sharded_last on its block of it (width: the whole last
    dim; the ROWS operands' blocks, collectives over `axes` its own) instead of fn."""
    rows_at = in_kinds.index(ROWS)

    def shardings(mesh, arg_shapes):
        x = arg_shapes[rows_at]
        rows = _row_spec(x.sharding, len(x.shape), core_dims)
        last = _last_axes(x.sharding, len(x.shape), rows) if sharded_last is not None else ()

        def spec(k):
            if last and k in (ROWS, HALF):
                return P(*rows, last)
            return _spec(k, rows, core_dims)

        ins = tuple(NamedSharding(mesh, spec(k)) for k in in_kinds)
        outs = tuple(NamedSharding(mesh, spec(k)) for k in out_kinds)
        return rows, last, ins, outs

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[3]

    def partition(mesh, arg_shapes, result_shape):
        rows, last, ins, outs = shardings(mesh, arg_shapes)
        axes = _mesh_axes(rows)
        width = arg_shapes[rows_at].shape[-1]

        def per_shard(*args):
            results = sharded_last(last, width, *args) if last else fn(*args)
            return tuple(jax.lax.psum(r, axes) if k == PARAM_SUM and axes else r for r, k in zip(results, out_kinds))

        return mesh, per_shard, outs, ins

    whole = ("f", "g", "q", "z") if sharded_last is not None else ("h", "f", "g", "q", "z")
    wrapped = custom_partitioning(fn)
    rule = _rule(in_kinds, out_kinds, core_dims, whole)
    wrapped.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return wrapped


def _vma(a) -> frozenset:
    """The shard_map axes `a` varies over: aval.manual_axis_type.varying (jax >= 0.10), else aval.vma."""
    aval = jax.typeof(a)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def vary_like(axes: frozenset, a):
    """`a` typed as varying over the shard_map axes `axes` (a no-op outside shard_map).

    FFI calls do not track which manual axes their values vary over: parameters entering
    one are cast to x's axes (whose transpose, a psum, sums the per-shard gradients) and
    results leaving one are cast back."""
    if a is None:
        return None
    missing = tuple(sorted(axes - _vma(a)))
    if not missing:
        return a
    if hasattr(jax.lax, "pcast"):  # older jax has only pvary
        return jax.lax.pcast(a, missing, to="varying")
    return jax.lax.pvary(a, missing)


def varying_axes(*arrays) -> frozenset:
    return frozenset().union(*(_vma(a) for a in arrays if a is not None))
