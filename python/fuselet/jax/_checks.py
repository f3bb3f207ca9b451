"""Argument checks of the JAX layer that fuselet/_checks.py (shared with the torch layer) leaves
to each layer: what an array argument is here, and the float32 that the FFI attributes carry.

Both raise at the call, as the torch layer does, where XLA would otherwise refuse the call only
when it runs (a JaxRuntimeError INVALID_ARGUMENT) or fail to read the argument at all.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

MAX_DIMS = 8  # FUSELET_MAX_DIMS of fuselet/fuselet.h
_FLOAT32 = np.finfo(np.float32)
_MAX, _TINY = float(_FLOAT32.max), float(_FLOAT32.smallest_subnormal)


def array_facts(name: str, a, optional: bool = False) -> tuple[tuple, str] | None:
    """(shape, dtype name) of the array argument `name` (None for an absent optional one).

    TypeError for anything JAX does not take as an array (a torch.Tensor, a list, ...), ValueError
    for more dimensions than the kernels take."""
    if a is None and optional:
        return None
    try:
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            raise TypeError
        shape, dtype = tuple(a.shape), jnp.dtype(a.dtype).name
    except TypeError:
        expected = "a jax.Array or None" if optional else "a jax.Array"
        kind = type(a).__qualname__ if type(a).__module__ == "builtins" else f"{type(a).__module__}.{type(a).__qualname__}"
        raise TypeError(f"{name}: expected {expected}, got {kind}") from None
    if len(shape) > MAX_DIMS:
        raise ValueError(f"{name}: expected at most {MAX_DIMS} dimensions, got {len(shape)}")
    return shape, dtype


def check_float32(name: str, value, positive: bool = False) -> None:
    """`value` (already checked finite, and > 0 where `positive`) stays so in float32, the
    precision of the kernels' scalar attributes: 1e39 would become inf, an eps of 1e-50 zero."""
    try:
        as_float = float(value)
        overflow = abs(as_float) > _MAX
    except OverflowError:  # an int beyond any float
        overflow = True
    shown = value if isinstance(value, float) or abs(value) < 10**16 else f"an int of {len(str(abs(value)))} digits"
    if overflow:
        raise ValueError(
            f"{name}: expected a magnitude float32 can hold (<= {_MAX:.4g}; the kernels compute in float32), got {shown}"
        )
    if positive and np.float32(as_float) == 0:
        raise ValueError(
            f"{name}: expected a value > 0 in float32 (>= {_TINY:.4g}; the kernels compute in float32), "
            f"got {shown}, which float32 rounds to 0"
        )
