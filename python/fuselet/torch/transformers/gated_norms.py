"""The gated norms (Qwen3-Next's and Qwen3.5's RMSNormGated, Mamba2's, Bamba's, FalconH1's,
NemotronH's, Zamba2's, GraniteMoeHybrid's): norm modules whose forward takes a `gate`. The probe
finds the ft.gated_rms_norm form (eps, group size, gate before or after the norm, scale by
weight or 1 + weight) equal to the module's forward; the fused forward runs it, or the class's
own forward for a call fuselet's op does not take (no gate, another dtype). A sigmoid gate
(Kimi Linear's) matches no form and is left."""

from __future__ import annotations

import inspect

import torch

from fuselet.torch.norm import gated_rms_norm
from fuselet.torch.transformers.norms import _EPS_ATTRS, _vector
from fuselet.torch.transformers.probe import _closest, _Left, _own_forward, _probe_device, _randn


def _is_gated(module) -> bool:
    """A norm whose forward takes a gate (called by the norm detection on norm modules only)."""
    try:
        return "gate" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False


def _call(x, z, form, weight):
    eps, group_size, norm_before_gate, zero_centered = form
    return gated_rms_norm(x, z, weight, eps, group_size, norm_before_gate, zero_centered)


def _group_sizes(module, size: int) -> list:
    """None (the whole row) and the module's own group size (group_size, or H / n_groups)."""
    sizes = [None]
    own = getattr(module, "group_size", None)
    groups = getattr(module, "n_groups", None)
    if isinstance(groups, int) and groups > 0 and size % groups == 0:
        own = own or size // groups
    if isinstance(own, int) and 0 < own < size and size % own == 0:
        sizes.append(own)
    return sizes


def _gated_forward(self, x, gate=None, *args, **kwargs):
    form, mixed = self._fuselet_norm
    weight = getattr(self, "weight", None)
    usable = (
        not args
        and not kwargs
        and isinstance(x, torch.Tensor)
        and isinstance(gate, torch.Tensor)
        and gate.shape == x.shape
        and gate.dtype == x.dtype
        and (weight is None or x.shape[-1:] == weight.shape)
        and (weight is None or weight.dtype == x.dtype or (mixed and weight.dtype == torch.float32))
    )
    if not usable:
        return type(self).forward(self, x, gate, *args, **kwargs)
    return _call(x, gate, form, weight)


def _gated_form(module):
    """(form, mixed): the (eps, group_size, norm_before_gate, zero_centered) whose
    ft.gated_rms_norm equals the module's forward on the probe, and whether a half x with
    float32 weights keeps x's dtype; _Left otherwise."""
    weight = _vector(module, "weight")
    size = weight.shape[0] if weight is not None else 64
    like = _probe_device(module)
    own = [
        float(v)
        for v in (getattr(module, a, None) for a in _EPS_ATTRS)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    zero_centered = (False, True) if weight is not None else (False,)
    forms = [
        (eps, group, before, zc)
        for eps in dict.fromkeys(own + [1e-5, 1e-6])
        for group in _group_sizes(module, size)
        for before in (True, False)
        for zc in zero_centered
    ]
    x = _randn(2, 3, size, like=like, dtype=torch.float32) * 2 + 0.5
    z = _randn(2, 3, size, like=like, dtype=torch.float32, gen=torch.Generator().manual_seed(1))
    w32 = None if weight is None else weight.float()
    with torch.no_grad():
        wants = []
        for probe in (x, x * 1e-3):
            try:
                wants.append(module(probe, z))
            except Exception as e:
                raise _Left(f"its forward failed on a float32 probe with a gate ({type(e).__name__})") from None
        match = _closest(forms, lambda f: [(_call(p, z, f, w32), w) for p, w in zip((x, x * 1e-3), wants)], torch.float32)
        if match is None:
            raise _Left("no gated RMSNorm form (silu gate, before or after the norm, per group) equals its forward on the probe")
        mixed = True
        if weight is not None and weight.dtype == torch.float32:
            half = x.to(torch.bfloat16)
            mixed = module(half, z.to(torch.bfloat16)).dtype == torch.bfloat16
    return match, mixed


def _fuse_gated_norm(module) -> str:
    match, mixed = _gated_form(module)
    module._fuselet_norm = (match, mixed)
    if not _own_forward(module, _gated_forward):
        raise _Left("it already has a forward of its own (hooked, or fused)")
    eps, group, before, zc = match
    parts = [f"eps={eps:g}"] + ([f"group_size={group}"] if group else []) + ([] if before else ["norm_before_gate=False"])
    return f"ft.gated_rms_norm({', '.join(parts)}{', zero_centered_gamma' if zc else ''})"
