"""Argument checks shared by the torch and jax layers, so both raise the same messages.

Each function takes plain facts (shapes as tuples, dtype names as strings) and raises
TypeError (wrong kind or dtype) or ValueError (wrong shape or value) naming the argument.
"""
from __future__ import annotations

import math

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def check_dtype(name: str, dtype: str, like: str | None = None) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {dtype}")
    if like is not None and dtype != like:
        raise TypeError(f"{name}: expected dtype {like} (the dtype of x), got {dtype}")


def check_norm_args(x_shape: tuple, x_dtype: str, params: dict, eps) -> None:
    """x: [..., H]; params: {"weight": (shape, dtype), "bias": ...}; eps: finite float > 0."""
    check_dtype("x", x_dtype)
    if len(x_shape) == 0:
        raise ValueError("x: expected shape [..., H] with at least 1 dimension, got a 0-d array")
    hidden = x_shape[-1]
    if hidden == 0:
        raise ValueError(f"x: the hidden size (last dimension) must be > 0, got shape {tuple(x_shape)}")
    for name, (shape, dtype) in params.items():
        if tuple(shape) != (hidden,):
            raise ValueError(f"{name}: expected shape ({hidden},) to match the last dimension of x "
                             f"{tuple(x_shape)}, got {tuple(shape)}")
        check_dtype(name, dtype, like=x_dtype)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a Python float, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps: expected a finite float > 0, got {eps}")
