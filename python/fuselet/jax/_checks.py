"""What an array argument is to the JAX layer: the facts (shape, dtype name) that the specs of
fuselet/spec take, or a TypeError at the call for anything JAX does not take as an array, where
XLA would otherwise fail to read the argument at all. The rules themselves are fuselet/spec's,
shared with the torch layer (the float32 of the FFI attributes included).
"""

from __future__ import annotations

import jax.numpy as jnp


def array_facts(name: str, a, optional: bool = False) -> tuple[tuple, str] | None:
    """(shape, dtype name) of the array argument `name` (None for an absent optional one);
    TypeError for anything JAX does not take as an array (a torch.Tensor, a list, ...)."""
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
    return shape, dtype
