"""What a tensor argument is to the torch layer: a dense torch.Tensor on the device of the others,
and its facts (shape, dtype name), which the specs of fuselet/spec take. The rules themselves are
fuselet/spec's, shared with the JAX layer (the fake impls call the raw ops' own, spec/<op>.py's
`*op` functions, so that meta tensors and torch.compile's tracing meet the errors of a real call).
"""

from __future__ import annotations

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
