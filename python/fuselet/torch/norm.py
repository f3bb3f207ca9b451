"""RMSNorm and LayerNorm for PyTorch: checked wrappers, fake impls, autograd, modules.

Math and shapes: csrc/core/include/fuselet/norm.h. Statistics are float32; inputs and
parameters are float32, float16 or bfloat16 (parameters in x's dtype).
"""
from __future__ import annotations

import torch

from fuselet._checks import check_norm_args

ops = torch.ops.fuselet


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _check(x, eps, **params) -> None:
    for name, t in {"x": x, **params}.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    check_norm_args(tuple(x.shape), _dtype(x), {n: (tuple(t.shape), _dtype(t)) for n, t in params.items()}, eps)
    for name, t in params.items():
        if t.device != x.device:
            raise ValueError(f"{name}: expected a tensor on {x.device} (the device of x), got {t.device}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dim of x [..., H]."""
    _check(x, eps, weight=weight)
    return ops.rms_norm_fwd(x, weight, float(eps))[0]


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim of x [..., H]."""
    _check(x, eps, weight=weight, bias=bias)
    return ops.layer_norm_fwd(x, weight, bias, float(eps))[0]


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class LayerNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(hidden, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


# --- fake (meta) implementations: shapes only, for torch.compile and FakeTensor ---------

def _rows(x):
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("fuselet::rms_norm_fwd")
def _(x, weight, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), _rows(x)


@torch.library.register_fake("fuselet::rms_norm_bwd")
def _(dy, x, weight, rstd):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(weight)


@torch.library.register_fake("fuselet::layer_norm_fwd")
def _(x, weight, bias, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), _rows(x), _rows(x)


@torch.library.register_fake("fuselet::layer_norm_bwd")
def _(dy, x, weight, mean, rstd):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(weight),
            torch.empty_like(weight))


# --- autograd: the backward of each forward op is itself a registered op ----------------

def _rms_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    dx, dweight = ops.rms_norm_bwd(dy, x, weight, rstd)
    return dx, dweight, None


def _layer_setup(ctx, inputs, output):
    x, weight, _, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])


def _layer_backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    dx, dweight, dbias = ops.layer_norm_bwd(dy, x, weight, mean, rstd)
    return dx, dweight, dbias, None


torch.library.register_autograd("fuselet::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)
torch.library.register_autograd("fuselet::layer_norm_fwd", _layer_backward, setup_context=_layer_setup)
