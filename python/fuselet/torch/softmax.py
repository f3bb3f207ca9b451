"""Scaled, optionally causal softmax for PyTorch: checked wrapper, fake impls, autograd.

Math and shapes: csrc/core/include/fuselet/softmax.h. y = softmax(scale * x) over the last
dim of x [..., K]; causal=True takes x [..., Q, K] and masks key j for query i when
j > i + (K - Q) (bottom-right aligned); a fully masked row is zeros. y has x's dtype.
"""

from __future__ import annotations

import torch

from fuselet.spec import softmax as spec
from fuselet.torch._args import check_dense, facts, op_tensors
from fuselet.torch._dtensor import rowwise, sharding

ops = torch.ops.fuselet


def softmax(x: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """y = softmax(scale * x, dim=-1), with the bottom-right causal mask when causal=True."""
    check_dense("x", x)
    return ops.softmax_fwd(x, *spec.softmax(facts(x), scale, causal).op_args())


@torch.library.register_fake("fuselet::softmax_fwd")
def _(x, scale=1.0, causal=False):
    op_tensors(x=x)
    spec.softmax(facts(x), scale, causal)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fuselet::softmax_bwd")
def _(dy, y, scale=1.0):
    op_tensors(y=y, dy=dy)
    spec.bwd_op(facts(dy), facts(y), scale)
    return torch.empty_like(y, memory_format=torch.contiguous_format)


# --- DTensor sharding (fuselet.torch._dtensor): rows keep their sharding, K is whole; with
# causal=True the queries (dim -2) are whole too (the mask reads each query's position).


@sharding("softmax_fwd", static_argnum=1)
def _(x, scale=1.0, causal=False):
    return rowwise([(x, "rows"), (scale, None), (causal, None)], ["rows"], skip=(-2,) if causal else ())


@sharding("softmax_bwd")
def _(dy, y, scale=1.0):
    return rowwise([(dy, "rows"), (y, "rows"), (scale, None)], ["rows"])


def _setup(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return ops.softmax_bwd(dy, y, ctx.scale), None, None


torch.library.register_autograd("fuselet::softmax_fwd", _backward, setup_context=_setup)
