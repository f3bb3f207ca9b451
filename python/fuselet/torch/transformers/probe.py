"""What every kind of layer's check shares: _Left (a candidate left as it was, the message says
why), the probe inputs (seeded random tensors on the module's device), the comparison of a
fuselet op's output with the module's own within the dtype's tolerance, and the swap itself: a
forward of the instance's own, never the class's."""

from __future__ import annotations

import math
import types

import torch


class _Left(Exception):
    """A candidate module fuselet leaves as it was; the message says why."""


def _generator():
    return torch.Generator().manual_seed(0)


def _randn(*shape, like: torch.Tensor, dtype=None, gen=None) -> torch.Tensor:
    return torch.randn(*shape, generator=gen or _generator()).to(device=like.device, dtype=dtype or like.dtype)


def _tolerance(dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


def _error(got, want) -> float:
    """max |got - want| / max(1, max |want|), inf where the shapes differ or want is not finite."""
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape:
        return math.inf
    got, want = got.detach().double(), want.detach().double()
    if not bool(torch.isfinite(want).all()):
        return math.inf
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def _close(got, want, dtype) -> bool:
    return _error(got, want) <= _tolerance(dtype)


def _closest(candidates, pairs, dtype):
    """The candidate c whose pairs(c) ([(got, want), ...]) agree best, if within dtype's
    tolerance; None otherwise. The best, not the first close one: a softcap of 30 on logits
    near 1, or eps 1e-5 against 1e-6, changes a probe by less than the tolerance."""
    best, best_error = None, math.inf
    for c in candidates:
        error = max(_error(g, w) for g, w in pairs(c))
        if error < best_error:
            best, best_error = c, error
    return best if best_error <= _tolerance(dtype) else None


def _probe_device(module) -> torch.Tensor:
    """A tensor on the module's device (its first parameter's or buffer's), or CPU; _Left on meta."""
    for t in (*module.parameters(), *module.buffers()):
        if t.is_meta:
            raise _Left("parameters on the meta device cannot be probed")
        if type(t) is not torch.nn.Parameter and type(t) is not torch.Tensor:
            raise _Left(f"parameters of type {type(t).__name__} (fuse before sharding or wrapping)")
        return t
    return torch.empty(0)


def _own_forward(module, fn) -> bool:
    """Give `module` (this instance only) the forward fn(module, ...); False where something
    (accelerate's hooks, an earlier fuse) already set one on the instance."""
    if "forward" in vars(module):
        return False
    module.forward = types.MethodType(fn, module)
    return True


def _plain_linear(m) -> bool:
    """A torch.nn.Linear whose forward is Linear's own (not LoRA-wrapped or hooked)."""
    return isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward and "forward" not in vars(m)
