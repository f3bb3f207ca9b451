"""Which kind of layer a module of the model is, by structure alone: a norm, a gated MLP (or MoE
experts, or an ungated MLP fuselet has no op for), an attention that calls the rotary function,
or a causal LM with a loss; the reason an ungated MLP is left. fuse() asks it of every module."""

from __future__ import annotations

import torch

from fuselet.torch.transformers.loss import _is_lm
from fuselet.torch.transformers.mlp import _mlp_layout
from fuselet.torch.transformers.norms import _is_norm
from fuselet.torch.transformers.rotary import _calls_rotary, _kernelized_rotary


def _kind_of(module):
    """(kind, argument) for a module fuse() considers, or None."""
    if _is_norm(module):
        return "norm", None
    layout = _mlp_layout(module)
    if layout is not None:
        return "mlp", layout
    name = type(module).__name__
    if name.endswith("Experts") or any(isinstance(getattr(module, n, None), torch.nn.Parameter) for n in ("gate_up_proj", "w1")):
        return "mlp", "experts"
    projections = sum(getattr(getattr(m, "weight", None), "ndim", 0) == 2 for m in module.children())
    if name.endswith("MLP") and projections >= 2:
        return "mlp", "plain"  # fc1 / fc2, GPT-2's Conv1D pair (a block of router and experts is not one)
    if _calls_rotary(type(module)) or _kernelized_rotary(module) is not None:
        return "rope", None
    if _is_lm(module):
        return "loss", None
    return None


def _left_reason(arg) -> str:
    return {"plain": "no gate / up projection pair: fuselet has no op for an ungated act(x W1) W2"}[arg]
