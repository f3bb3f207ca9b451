"""SwiGLU, GeGLU and GPT-OSS's clamped SwiGLU for PyTorch: checked wrappers, fake impls, autograd.

Math and shapes: csrc/core/include/fuselet/glu.h. x [..., 2F] is [gate, up] (clamped_swiglu:
or interleaved [g0, u0, g1, u1, ...]); y [..., F] has x's dtype (float32, float16 or bfloat16;
the math runs in float32).
"""

from __future__ import annotations

import torch

from fuselet.spec import glu as spec
from fuselet.torch._args import check_dense, facts, op_tensors
from fuselet.torch._dtensor import rowwise, sharding

ops = torch.ops.fuselet


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """y = silu(gate) * up with x [..., 2F] = [gate, up]; y [..., F]."""
    check_dense("x", x)
    return ops.swiglu_fwd(x, *spec.swiglu(facts(x)).op_args())


def geglu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """y = gelu(gate, approximate) * up with x [..., 2F] = [gate, up]; approximate "none" (erf) or "tanh"."""
    check_dense("x", x)
    return ops.geglu_fwd(x, *spec.geglu(facts(x), approximate).op_args())


def clamped_swiglu(x: torch.Tensor, *, alpha: float = 1.702, limit: float = 7.0, interleaved: bool = False) -> torch.Tensor:
    """GPT-OSS's SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), y = g * sigmoid(alpha * g) * (u + 1).

    x [..., 2F] is [gate, up], or [g0, u0, g1, u1, ...] with interleaved=True (GPT-OSS's
    gate_up_proj); y [..., F]. The defaults are GPT-OSS's (swiglu_alpha, swiglu_limit)."""
    check_dense("x", x)
    return ops.clamped_swiglu_fwd(x, *spec.clamped_swiglu(facts(x), alpha, limit, interleaved).op_args())


# --- fake (meta) implementations ----------------------------------------------------------


def _half(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _fake_check(name, x, *op_args, dy=None):
    """The op's checks (spec.op) of x [..., 2F], its options and (the backward's) dy [..., F]."""
    op_tensors(x=x, **({} if dy is None else {"dy": dy}))
    spec.op(name, facts(x), *op_args, dy=facts(dy))


@torch.library.register_fake("fuselet::swiglu_fwd")
def _(x):
    _fake_check("swiglu", x)
    return _half(x)


@torch.library.register_fake("fuselet::swiglu_bwd")
def _(dy, x):
    _fake_check("swiglu", x, dy=dy)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fuselet::geglu_fwd")
def _(x, approximate="none"):
    _fake_check("geglu", x, approximate)
    return _half(x)


@torch.library.register_fake("fuselet::geglu_bwd")
def _(dy, x, approximate="none"):
    _fake_check("geglu", x, approximate, dy=dy)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fuselet::clamped_swiglu_fwd")
def _(x, alpha=1.702, limit=7.0, interleaved=False):
    _fake_check("clamped_swiglu", x, alpha, limit, interleaved)
    return _half(x)


@torch.library.register_fake("fuselet::clamped_swiglu_bwd")
def _(dy, x, alpha=1.702, limit=7.0, interleaved=False):
    _fake_check("clamped_swiglu", x, alpha, limit, interleaved, dy=dy)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# --- DTensor sharding (fuselet.torch._dtensor): rows keep their sharding; the [gate, up] dim
# is whole (a Shard(-1) of it would pair gate and up columns of different ranks).


@sharding("swiglu_fwd")
def _(x):
    return rowwise([(x, "rows")], ["rows"])


@sharding("swiglu_bwd")
def _(dy, x):
    return rowwise([(dy, "rows"), (x, "rows")], ["rows"])


@sharding("geglu_fwd")
def _(x, approximate="none"):
    return rowwise([(x, "rows"), (approximate, None)], ["rows"])


@sharding("geglu_bwd")
def _(dy, x, approximate="none"):
    return rowwise([(dy, "rows"), (x, "rows"), (approximate, None)], ["rows"])


@sharding("clamped_swiglu_fwd")
def _(x, alpha=1.702, limit=7.0, interleaved=False):
    return rowwise([(x, "rows"), (alpha, None), (limit, None), (interleaved, None)], ["rows"])


@sharding("clamped_swiglu_bwd")
def _(dy, x, alpha=1.702, limit=7.0, interleaved=False):
    return rowwise([(dy, "rows"), (x, "rows"), (alpha, None), (limit, None), (interleaved, None)], ["rows"])


# --- autograd: the backward of each forward op is itself a registered op ----------------


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return ops.swiglu_bwd(dy, x)


def _geglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.approximate = inputs[1]


def _geglu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return ops.geglu_bwd(dy, x, ctx.approximate), None


def _clamped_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.options = inputs[1:]


def _clamped_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return ops.clamped_swiglu_bwd(dy, x, *ctx.options), None, None, None


torch.library.register_autograd("fuselet::swiglu_fwd", _swiglu_backward, setup_context=_swiglu_setup)
torch.library.register_autograd("fuselet::geglu_fwd", _geglu_backward, setup_context=_geglu_setup)
torch.library.register_autograd("fuselet::clamped_swiglu_fwd", _clamped_backward, setup_context=_clamped_setup)
