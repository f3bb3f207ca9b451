"""Checks of tensor arguments for the torch layer: the wrappers' (a dense torch.Tensor, on x's
device) and the fake impls' (what the C++ ops check before calling the core, in their words, so
that meta tensors and torch.compile's tracing meet the errors of a real call).

Shapes are compared with == and != only: under torch.compile they may be SymInts.
"""

from __future__ import annotations

import math

import torch


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def facts(t: torch.Tensor | None) -> tuple[tuple, str] | None:
    """(shape, dtype name) of t, what the specs (fuselet/spec) take; None for None."""
    return None if t is None else (tuple(t.shape), dtype_name(t))


def check_dense(name: str, t, optional: bool = False) -> None:
    """t: a strided (dense) torch.Tensor (or None when optional)."""
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor{' or None' if optional else ''}, got {type(t).__name__}")
    if t.is_nested:
        raise NotImplementedError(f"{name}: expected a strided (dense) tensor, got a nested tensor")
    if t.layout != torch.strided:
        raise NotImplementedError(f"{name}: expected a strided (dense) tensor, got layout {t.layout}")


def check_same_device(ref_name: str, ref: torch.Tensor, **tensors) -> None:
    """Every tensor of `tensors` (None: absent) on the device of `ref`."""
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name}: expected a tensor on {ref.device} (the device of {ref_name}), got {t.device}")


# --- the fake impls: the raw ops' own checks ------------------------------------------------


def op_tensors(optional=(), **tensors) -> None:
    """A raw op's tensor arguments: present unless named in `optional`, then all on the device
    of the first one (a real call with one meta tensor runs the fake impl: it is refused here)."""
    for name, t in tensors.items():
        if t is None and name not in optional:
            raise TypeError(f"{name}: expected a tensor, got None")
        if t is not None:
            check_dense(name, t)
    (ref_name, ref), *_ = tensors.items()
    check_same_device(ref_name, ref, **tensors)


def shape_str(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def rows_of(name: str, t: torch.Tensor, last: str = "H"):
    """(rows, last dim) of t [..., last]; float32, float16 or bfloat16."""
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {dtype_name(t)}")
    if t.dim() == 0:
        raise ValueError(f"{name}: expected a tensor of shape [..., {last}], got a 0-d tensor")
    return math.prod(t.shape[:-1]), t.shape[-1]


def rows_like(name: str, t: torch.Tensor, like: str, ref: torch.Tensor, rows, cols, suffix: str = "") -> None:
    """t: ref's dtype, read as `rows` rows of `cols` elements (any leading shape)."""
    if t.dtype != ref.dtype:
        raise TypeError(f"{name}: expected dtype {dtype_name(ref)} (the dtype of {like}), got {dtype_name(t)}")
    got_rows, got_cols = rows_of(name, t)
    if got_rows != rows or got_cols != cols:
        raise ValueError(f"{name}: expected {rows} rows of {cols} elements{suffix}, got {got_rows} rows of {got_cols}")


def vector(name: str, t: torch.Tensor, n, dtype: torch.dtype = torch.float32) -> None:
    """t: n elements of `dtype`, any shape (per-row statistics and losses)."""
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {str(dtype).removeprefix('torch.')}, got {dtype_name(t)}")
    if t.numel() != n:
        raise ValueError(f"{name}: expected {n} elements, got shape {shape_str(t)}")
