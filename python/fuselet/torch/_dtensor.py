"""DTensor sharding rules of the fuselet ops: how each op runs on torch.distributed.tensor.DTensor.

Each op file declares its rules next to its fake impls with `@sharding(op names...)`; a rule
takes the op's arguments (tensors as DTensorSpec-like objects with .ndim / .shape, None for an
absent optional tensor) and returns [(output placements, input placements), ...] for one mesh
dim, as torch.distributed.tensor.experimental.register_sharding expects (None for each
non-tensor argument). DTensor picks the cheapest strategy and redistributes the inputs to it.

The rules follow those of the JAX layer (python/fuselet/jax/_sharding.py):
  - rows: every dim but the kernel's last (normalized, softmax, gated, vocabulary) dim keeps
    its sharding, with no communication; a sharded last dim is redistributed (that mesh dim
    only; DTensor chooses the cheapest placement that some strategy accepts),
  - parameters (weight, bias) are replicated; their gradients come out Partial (each rank
    sums its own rows) and are reduced once, when DTensor needs them reduced.

Registration happens when torch.distributed.tensor is imported (at once if it already is): so
`import fuselet.torch` does not import DTensor (about a second of import time) and works where
torch.distributed is unavailable.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

_DTENSOR = "torch.distributed.tensor"
_RULES: list[tuple[tuple[str, ...], object, int | None]] = []
_registered = False


def sharding(*names: str, static_argnum: int | None = None):
    """Declares fn as the DTensor sharding rule of torch.ops.fuselet.<name> for each name.

    static_argnum: the first argument (by position) whose value the rule reads besides the
    tensors' placements and shapes (softmax's causal, rope's bhsd). DTensor's sharding cache is
    documented to key on the non-tensor arguments from RuntimeSchemaInfo.static_argnum on, and
    register_sharding sets that to the first int argument; a bool flag is declared here so the
    cache keys on it by contract (torch 2.13's cache key held it in the tests either way)."""

    def declare(fn):
        _RULES.append((names, fn, static_argnum))
        if _registered:
            _register(names, fn, static_argnum)
        return fn

    return declare


def _op(name: str):
    """The OpOverload of a fuselet op: torch.ops.fuselet.<name>.default."""
    return getattr(torch.ops.fuselet, name).default


def _register(names, fn, static_argnum) -> None:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental import register_sharding

    ops = [_op(n) for n in names]
    register_sharding(ops)(fn)
    if static_argnum is not None:  # no public knob for it in register_sharding (torch 2.13)
        info = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
        for op in ops:
            info[op] = RuntimeSchemaInfo(static_argnum, needs_pytree=True)


def _register_all() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    for names, fn, static_argnum in _RULES:
        _register(names, fn, static_argnum)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs _register_all once torch.distributed.tensor has been imported (by anyone)."""

    def find_spec(self, name, path=None, target=None):
        if name != _DTENSOR:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_all()

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Registers the declared rules now if DTensor is loaded, else when it is imported."""
    if not torch.distributed.is_available():
        return
    if _DTENSOR in sys.modules:
        _register_all()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def is_dtensor(t) -> bool:
    """Whether t is a DTensor (without importing torch.distributed.tensor)."""
    module = sys.modules.get(_DTENSOR)
    return module is not None and isinstance(t, module.DTensor)


# --- placement lists shared by the op files' rules ------------------------------------------


def placements():
    """(Replicate, Shard, Partial) of torch.distributed.tensor (imported only by the rules)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Replicate, Shard, Partial


def scalars(n: int) -> list:
    """rowwise's (value, kind) entries of n non-tensor arguments (eps, flags, options)."""
    return [(None, None)] * n


def row_dims(t, core_dims: int = 1) -> range:
    """The dims of t that a row-wise kernel leaves independent: all but the last core_dims."""
    return range(t.ndim - core_dims)


def rowwise(args, outs, core_dims: int = 1, skip: tuple = ()) -> list:
    """Strategies of an op whose tensors all share x's leading (row) dims.

    args: (value, kind) per argument of the op, kind "rows" (sharded like x's rows: x, dy, y,
    rstd, target, ...), "param" (replicated: weight, bias; None stays None) or None (not a
    tensor). outs: per output "rows", or ("sum", param): a parameter's gradient, Partial (each
    rank sums its rows), Replicate where param is None (the output is empty then). x is the
    "rows" argument of most dims (the one with the kernel's last dim: x, dy, logits); its row
    dims in `skip` (negative: from the end) are not offered. The other "rows" tensors (rstd,
    target, dloss) have x's leading dims, so each Shard(d) offered fits them too."""
    Replicate, Shard, Partial = placements()
    x = max((v for v, kind in args if kind == "rows"), key=lambda v: v.ndim)
    skip = {d % x.ndim for d in skip}

    def inputs(row):
        return [None if kind is None or v is None else (row if kind == "rows" else Replicate()) for v, kind in args]

    def outputs(row, partial):
        return [row if kind == "rows" else (partial if kind[1] is not None else Replicate()) for kind in outs]

    strategies = [(outputs(Replicate(), Replicate()), inputs(Replicate()))]
    for d in row_dims(x, core_dims):
        if d not in skip:
            strategies.append((outputs(Shard(d), Partial()), inputs(Shard(d))))
    return strategies


# --- the losses composed over the ops ---------------------------------------------------------


def check_dtensors(**tensors) -> None:
    """The tensor arguments of one call (None: absent; 0-d: scalars, taken either way) are all
    DTensors on one device mesh, or none is: fuselet computes a loss of DTensors over the global
    tensors, and a torch.Tensor beside them would be read as this rank's data alone."""
    given = {n: t for n, t in tensors.items() if t is not None and t.dim() > 0}
    first = next((n for n, t in given.items() if is_dtensor(t)), None)
    if first is None:
        return
    mesh = given[first].device_mesh
    for name, t in given.items():
        if not is_dtensor(t):
            raise TypeError(
                f"{name}: expected a DTensor on the device mesh of {first} ({first} is a DTensor, so every "
                "tensor argument must be one), got a torch.Tensor"
            )
        if t.device_mesh != mesh:
            raise ValueError(f"{name}: expected a DTensor on the device mesh of {first} ({mesh}), got one on {t.device_mesh}")


def on_row_shards(fn, rows: tuple, params: tuple):
    """fn(*rows, *params): a float32 sum over the rows of the DTensors `rows` (each [N, ...], the
    same N), run by each rank on its own shard of them, with `params` replicated. The rows keep a
    split of dim 0 (Shard(0)); any other placement of theirs is redistributed to Replicate, and
    params are redistributed to Replicate. Returns the sum as a DTensor, Partial over the mesh
    dims that split the rows (each rank's rows' share; Replicate over the others); the rows'
    gradients keep the rows' placements, the params' come out Partial like the sum."""
    from torch.distributed.tensor.experimental import local_map

    Replicate, Shard, Partial = placements()
    split = [isinstance(p, Shard) and p.dim == 0 for p in rows[0].placements]
    row = tuple(Shard(0) if s else Replicate() for s in split)
    summed = tuple(Partial() if s else Replicate() for s in split)
    whole = (Replicate(),) * len(split)
    return local_map(
        fn,
        out_placements=[*summed],  # a list: one output (a tuple is one placement list per output)
        in_placements=(row,) * len(rows) + (whole,) * len(params),
        in_grad_placements=(row,) * len(rows) + (summed,) * len(params),
        device_mesh=rows[0].device_mesh,
        redistribute_inputs=True,
    )(*rows, *params)
