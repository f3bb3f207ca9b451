"""The norms: which leaf modules are norms, the probe that finds the RMSNorm / LayerNorm form
(op, eps, scale by weight or by 1 + weight) equal to a module's forward, and the forward a
fused norm gets, which runs ft.rms_norm / ft.layer_norm or the class's own forward for a call
fuselet's op does not take."""

from __future__ import annotations

import torch

from fuselet.torch.norm import layer_norm, rms_norm
from fuselet.torch.transformers.probe import _closest, _Left, _own_forward, _probe_device, _randn

_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon", "layer_norm_eps")


def _is_norm(module) -> bool:
    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        return True
    marker = getattr(type(module), "kernel_layer_name", None)
    return next(module.children(), None) is None and ("Norm" in type(module).__name__ or "Norm" in str(marker or ""))


def _vector(module, name):
    t = getattr(module, name, None)
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise _Left(f"{name} is a {type(t).__name__}, not a tensor")
    if t.dim() != 1:
        raise _Left(f"{name} of shape {list(t.shape)}: fuselet's norms take one vector [H]")
    return t


def _norm_call(x, spec, weight, bias):
    op, eps, zero_centered = spec
    if op == "rms_norm":
        return rms_norm(x, weight, eps, zero_centered_gamma=zero_centered)
    return layer_norm(x, weight, bias, eps, zero_centered_gamma=zero_centered)


def _norm_run(self, x, spec, mixed, args=(), kwargs=None):
    """The norm through fuselet's op in `spec`, or the class's own forward for a call it does not take."""
    weight, bias = getattr(self, "weight", None), getattr(self, "bias", None)
    if args or kwargs or not isinstance(x, torch.Tensor) or (weight is not None and x.shape[-1:] != weight.shape):
        return type(self).forward(self, x, *args, **(kwargs or {}))
    for p in (weight, bias):  # fuselet's op takes x's dtype or (where the module's output keeps x's) float32
        if p is not None and p.dtype != x.dtype and not (mixed and p.dtype == torch.float32):
            return type(self).forward(self, x, *args, **(kwargs or {}))
    return _norm_call(x, spec, weight, bias)


def _norm_forward(self, x, *args, **kwargs):
    spec, mixed = self._fuselet_norm
    return _norm_run(self, x, spec, mixed, args, kwargs)


def _norm_form(module):
    """(spec, mixed): the (op, eps, zero_centered) whose fuselet op equals the module's forward on
    the probe, and whether a half x with float32 weights keeps x's dtype; _Left otherwise."""
    weight, bias = _vector(module, "weight"), _vector(module, "bias")
    shape = getattr(module, "normalized_shape", None)
    size = (
        weight.shape[0] if weight is not None else (shape[-1] if isinstance(shape, (tuple, list)) and len(shape) == 1 else None)
    )
    if size is None:
        size = 64  # a norm without a weight is the same math at every H
    if bias is not None and bias.shape[0] != size:
        raise _Left(f"bias of shape {list(bias.shape)} for a weight of [{size}]")
    like = _probe_device(module)
    own = [
        float(v)
        for v in (getattr(module, a, None) for a in _EPS_ATTRS)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    eps_candidates = list(dict.fromkeys(own + [1e-5, 1e-6]))
    ops = ("layer_norm",) if bias is not None else ("rms_norm", "layer_norm")
    forms = [(op, eps, zc) for eps in eps_candidates for op in ops for zc in ((False, True) if weight is not None else (False,))]
    x = _randn(2, 3, size, like=like, dtype=torch.float32) * 2 + 0.5
    w32 = None if weight is None else weight.float()
    b32 = None if bias is None else bias.float()
    with torch.no_grad():
        wants = []
        for probe in (x, x * 1e-3):
            try:
                wants.append(module(probe))
            except Exception as e:
                raise _Left(f"its forward failed on a float32 probe ({type(e).__name__})") from None
        match = _closest(forms, lambda f: [(_norm_call(p, f, w32, b32), w) for p, w in zip((x, x * 1e-3), wants)], torch.float32)
        if match is None:
            raise _Left("no RMSNorm / LayerNorm form equals its forward on the probe")
        mixed = True
        if any(p is not None and p.dtype == torch.float32 for p in (weight, bias)):  # output dtype of a half x
            mixed = module(x.to(torch.bfloat16)).dtype == torch.bfloat16
    return match, mixed


def _fuse_norm(module) -> str:
    match, mixed = _norm_form(module)
    module._fuselet_norm = (match, mixed)
    if not _own_forward(module, _norm_forward):
        raise _Left("it already has a forward of its own (hooked, or fused)")
    op, eps, zc = match
    return f"ft.{op}(eps={eps:g}{', zero_centered_gamma' if zc else ''})"
