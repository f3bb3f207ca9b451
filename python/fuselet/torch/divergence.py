"""Divergences for PyTorch (distillation losses): kl_div, jsd, tvd over one kernel pair, fake
impls, autograd.

Math and shapes: csrc/core/include/fuselet/divergence.h. input and target [..., V] of one shape
and dtype (float32, float16, bfloat16): input the log-probabilities log Q of the model being
trained (what log_softmax gives), target those of the reference log P (for kl_div with
log_target=False, its probabilities P). The kernel sums each row into one float32 loss and never
materializes the [..., V] terms; the reductions run here, around it:

- kl_div: torch.nn.functional.kl_div's math and reductions ("batchmean" = sum / input.shape[0],
  "sum", "mean" = sum / input.numel(); "none" is the [..., V] elementwise loss, computed by torch
  itself: an output as large as the input leaves nothing to fuse).
- jsd(beta) and tvd: the mean over the rows whose label is not ignore_index (all rows without
  labels); a loss over 0 kept rows is 0.

Losses are float32. Gradients flow to input and, where it requires grad, to target.
"""

from __future__ import annotations

import torch

from fuselet.spec import divergence as spec
from fuselet.torch._args import check_dense, check_same_device, facts, op_tensors
from fuselet.torch._dtensor import rowwise, scalars, sharding

ops = torch.ops.fuselet


def _rows(op, input, target, labels=None, **options):
    """The checked per-row losses of `op` (float32, input.shape[:-1]); None for kl_div's "none"."""
    check_dense("input", input)
    check_dense("target", target)
    check_dense("labels", labels, optional=True)
    arrays = {"labels": facts(labels)} if op != "kl_div" else {}
    checked = getattr(spec, op)(facts(input), facts(target), **arrays, **options)
    check_same_device("input", input, target=target, labels=labels)
    if checked.reduction == "none":
        return None
    return ops.divergence_fwd(input, target, *checked.op_args())


def _kept_mean(rows: torch.Tensor, labels, ignore_index: int) -> torch.Tensor:
    """The mean of the per-row losses over the rows whose label is not ignore_index."""
    if labels is None:
        return rows.sum() / max(rows.numel(), 1)
    info = torch.iinfo(labels.dtype)
    if not info.min <= ignore_index <= info.max:  # no label can equal it
        return rows.sum() / max(rows.numel(), 1)
    keep = labels != ignore_index
    return torch.where(keep, rows, 0.0).sum() / keep.sum().clamp(min=1)


def kl_div(input: torch.Tensor, target: torch.Tensor, *, log_target: bool = False, reduction: str = "batchmean"):
    """KL(P || Q) = sum P (log P - input) per row: torch.nn.functional.kl_div(input, target,
    reduction=reduction, log_target=log_target), the rows summed by one fused kernel."""
    rows = _rows("kl_div", input, target, log_target=log_target, reduction=reduction)
    if reduction == "none":  # elementwise: an output as large as the input leaves nothing to fuse
        return torch.nn.functional.kl_div(input.float(), target.float(), reduction="none", log_target=log_target)
    total = rows.sum()
    if reduction == "sum":
        return total
    if reduction == "batchmean":
        return total / input.shape[0]
    return total / input.numel()


def jsd(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    beta: float = 0.5,
    labels: torch.Tensor | None = None,
    ignore_index: int = -100,
):
    """Generalized Jensen-Shannon divergence of student log-probabilities `input` (log Q) and
    teacher ones `target` (log P), per row beta KL(P || M) + (1 - beta) KL(Q || M), M = beta P +
    (1 - beta) Q; beta = 0 is the forward KL(P || Q), beta = 1 the reverse KL(Q || P). The mean over
    the rows whose label (labels, input.shape[:-1]) is not ignore_index."""
    rows = _rows("jsd", input, target, labels, beta=beta, ignore_index=ignore_index)
    return _kept_mean(rows, labels, ignore_index)


def tvd(input: torch.Tensor, target: torch.Tensor, *, labels: torch.Tensor | None = None, ignore_index: int = -100):
    """Total variation distance 0.5 sum |exp(target) - exp(input)| per row of log-probabilities,
    the mean over the rows whose label (labels, input.shape[:-1]) is not ignore_index."""
    rows = _rows("tvd", input, target, labels, ignore_index=ignore_index)
    return _kept_mean(rows, labels, ignore_index)


# --- fake (meta) implementations: shapes only, for torch.compile and FakeTensor ---------


def _fake_check(input, target, kind, log_target, beta, **tokens):
    op_tensors(input=input, target=target, **tokens)
    spec.op(facts(input), facts(target), kind, log_target, beta, {n: facts(t) for n, t in tokens.items()})


@torch.library.register_fake("fuselet::divergence_fwd")
def _(input, target, kind, log_target, beta):
    _fake_check(input, target, kind, log_target, beta)
    return input.new_empty(input.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("fuselet::divergence_bwd")
def _(dloss, input, target, kind, log_target, beta, wrt_target):
    _fake_check(input, target, kind, log_target, beta, dloss=dloss)
    return torch.empty_like(target if wrt_target else input, memory_format=torch.contiguous_format)


@torch.library.register_fake("fuselet::divergence_logits_")
def _(input, target, dloss, kind, log_target, beta, scale):
    op_tensors(input=input, target=target, dloss=dloss)
    spec.logits_op(facts(input), facts(target), facts(dloss), kind, log_target, beta, scale)
    return input.new_empty(input.shape[:-1], dtype=torch.float32)


# --- DTensor sharding (fuselet.torch._dtensor): rows keep their sharding, V is whole (a
# vocab-sharded input is redistributed); the per-row losses are sharded like the rows, and a sum
# over them is Partial until DTensor reduces it.


@sharding("divergence_fwd")
def _(input, target, kind, log_target, beta):
    return rowwise([(input, "rows"), (target, "rows"), *scalars(3)], ["rows"])


@sharding("divergence_bwd")
def _(dloss, input, target, kind, log_target, beta, wrt_target):
    return rowwise([(dloss, "rows"), (input, "rows"), (target, "rows"), *scalars(4)], ["rows"])


@sharding("divergence_logits_")
def _(input, target, dloss, kind, log_target, beta, scale):
    return rowwise([(input, "rows"), (target, "rows"), (dloss, "rows"), *scalars(4)], ["rows"])


# --- autograd: input's gradient, and target's where it requires grad ---------------------


def _setup(ctx, inputs, output):
    input, target, *ctx.options = inputs
    ctx.save_for_backward(input, target)


def _backward(ctx, dloss):
    input, target = ctx.saved_tensors
    dinput = ops.divergence_bwd(dloss, input, target, *ctx.options, False) if ctx.needs_input_grad[0] else None
    dtarget = ops.divergence_bwd(dloss, input, target, *ctx.options, True) if ctx.needs_input_grad[1] else None
    return dinput, dtarget, None, None, None


torch.library.register_autograd("fuselet::divergence_fwd", _backward, setup_context=_setup)
