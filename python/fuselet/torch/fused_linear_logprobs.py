"""Per-token log-probabilities of `hidden @ weight.T + bias` for PyTorch, and the entropy and
statistics of each token's distribution, without the [tokens, V] logits: what RL and preference
trainers need of the policy's head (TRL's `ChunkedLogProbFunction` computes the same outputs).

The tokens are taken chunk by chunk as in fused_linear_cross_entropy (its [chunk, V] buffer and
float32 dweight accumulator): each chunk's logits come from torch's matmul, fuselet's logprobs
kernel turns them into the per-token outputs, and the backward recomputes the logits (by chunks
of tokens or by blocks of classes: fused_linear_cross_entropy.recomputed_backward) from hidden,
weight and the forward's float32 lse (and entropy), turns them in place into dlogits (of the
log-probabilities and, when it has a gradient, of the entropy) and accumulates dhidden, dweight
and dbias.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fuselet.spec import fused_linear_logprobs as spec
from fuselet.spec.fused_linear_cross_entropy import vocab_block_for
from fuselet.torch import _vocab_parallel as vp
from fuselet.torch import _vocab_parallel_logprobs as vpl
from fuselet.torch._args import check_dense, check_same_device, facts, op_tensors
from fuselet.torch._dtensor import check_dtensors, rowwise, scalars, sharding
from fuselet.torch.cross_entropy import logprobs_chunk, logprobs_chunk_grad_
from fuselet.torch.fused_linear_cross_entropy import _chunks, _Logits, _resolve, _whole, recomputed_backward


class LogProbs(NamedTuple):
    """The per-token outputs, target's shape each (None where not asked for): log_probs and entropy
    float32 with gradients; log_sum_sq_probs (log sum_v p_v^2) and mean_logits float32, is_top1
    bool (whether the target is the argmax), without. 0 (False) where the target is ignore_index."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None


def _op_check(hidden, weight, bias, target, op_args, **tokens) -> spec.FusedLinearLogProbsOptions:
    """The checks of the ops below and of their fake impls (spec.op)."""
    op_tensors(("bias", "dlogp", "dentropy", "entropy"), hidden=hidden, weight=weight, bias=bias, target=target, **tokens)
    tokens = {n: facts(t) for n, t in tokens.items() if t is not None}
    return spec.op(facts(hidden), facts(weight), facts(bias), facts(target), op_args, tokens)


@torch.library.custom_op("fuselet::fused_linear_logprobs_fwd", mutates_args=())
def _fwd(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int,
    softcap: float,
    outputs: int,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_probs, lse, entropy, log_sum_sq_probs, mean_logits, is_top1) float32 per row of hidden
    [N, H] (is_top1 1.0 / 0.0); an output not in the `outputs` flags is empty."""
    options = _op_check(hidden, weight, bias, target, (ignore_index, softcap, outputs, chunk_size))
    n, chunk = hidden.shape[0], _resolve(chunk_size, hidden, weight)
    out = {name: _empty(hidden, n if name in options.outputs | {"lse"} else 0) for name in ("lse", *spec.OUTPUTS)}
    asked = options.outputs - {"log_probs"}
    logits_of = _Logits(hidden, weight, bias, chunk)
    for a, b in _chunks(n, chunk):
        stats = logprobs_chunk(
            logits_of(hidden[a:b]), target[a:b], ignore_index=ignore_index, softcap=softcap or None, outputs=asked
        )
        for name, value in stats.items():
            out[name][a:b] = value
    return out["log_probs"], out["lse"], *(out[name] for name in spec.OUTPUTS[1:])


def _empty(like, n):
    return torch.zeros(n, dtype=torch.float32, device=like.device)


@_fwd.register_fake
def _(hidden, weight, bias, target, ignore_index, softcap, outputs, chunk_size):
    options = _op_check(hidden, weight, bias, target, (ignore_index, softcap, outputs, chunk_size))
    n = hidden.shape[0]
    sizes = [n, n, *(n if name in options.outputs else 0 for name in spec.OUTPUTS[1:])]
    return tuple(hidden.new_empty(s, dtype=torch.float32) for s in sizes)


@torch.library.custom_op("fuselet::fused_linear_logprobs_bwd", mutates_args=())
def _bwd(
    dlogp: torch.Tensor | None,
    dentropy: torch.Tensor | None,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    ignore_index: int,
    softcap: float,
    outputs: int,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dhidden, dweight, dbias) from the float32 upstream gradients of log_probs and entropy [N]
    (None: 0; dentropy needs the forward's entropy); each chunk's logits are recomputed."""
    op_args = (ignore_index, softcap, outputs, chunk_size)
    _op_check(hidden, weight, bias, target, op_args, dlogp=dlogp, dentropy=dentropy, lse=lse, entropy=entropy)
    if dentropy is not None and entropy is None:
        raise ValueError("entropy: expected the forward's entropy [N] where dentropy is given, got None")
    whole = _whole(weight.shape[0], _resolve(chunk_size, hidden, weight))

    def dlogits_(logits, a, b, block):
        tokens = (lse[a:b], _part(entropy, a, b), _part(dlogp, a, b), _part(dentropy, a, b))
        if block is whole:  # every class: the kernel's own backward
            logprobs_chunk_grad_(logits, target[a:b], *tokens, ignore_index=ignore_index, softcap=softcap or None)
        else:
            vpl.chunk_grad_(logits, vp.Rows(target[a:b], block, ignore_index), *tokens, block, softcap)

    if vocab_block_for(hidden.shape[0], whole.vocab, whole.chunk):  # the kernel sees no target: checked here
        vp.check_targets(target, whole.vocab, ignore_index)
    return recomputed_backward(hidden, weight, bias, whole, dlogits_)


def _part(t, a, b):
    return None if t is None else t[a:b]


@_bwd.register_fake
def _(dlogp, dentropy, hidden, weight, bias, target, lse, entropy, ignore_index, softcap, outputs, chunk_size):
    op_args = (ignore_index, softcap, outputs, chunk_size)
    _op_check(hidden, weight, bias, target, op_args, dlogp=dlogp, dentropy=dentropy, lse=lse, entropy=entropy)
    dbias = hidden.new_empty(0) if bias is None else torch.empty_like(bias)
    return torch.empty_like(hidden), torch.empty_like(weight), dbias


def _setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    hidden, weight, bias, target, *ctx.op_args = inputs
    ctx.has_bias = bias is not None
    entropy = output[2] if output[2].numel() else None
    ctx.save_for_backward(hidden, weight, bias, target, output[1], entropy)


def _backward(ctx, dlogp, _dlse, dentropy, *_stats):
    if dlogp is None and dentropy is None:
        return (None,) * 8
    hidden, weight, bias, target, lse, entropy = ctx.saved_tensors
    as32 = [None if g is None else g.to(torch.float32).contiguous() for g in (dlogp, dentropy)]
    dhidden, dweight, dbias = _bwd(*as32, hidden, weight, bias, target, lse, entropy, *ctx.op_args)
    return dhidden, dweight, dbias if ctx.has_bias else None, None, None, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup)


# --- DTensor sharding: tokens keep their sharding, weight and bias replicated (gathered) --------


@sharding("fused_linear_logprobs_fwd")
def _(hidden, weight, bias, target, ignore_index, softcap, outputs, chunk_size):
    return rowwise([(hidden, "rows"), (weight, "param"), (bias, "param"), (target, "rows"), *scalars(4)], ["rows"] * 6)


@sharding("fused_linear_logprobs_bwd")
def _(dlogp, dentropy, hidden, weight, bias, target, lse, entropy, ignore_index, softcap, outputs, chunk_size):
    tokens = [(dlogp, "rows"), (dentropy, "rows"), (hidden, "rows"), (weight, "param"), (bias, "param"), (target, "rows")]
    return rowwise([*tokens, (lse, "rows"), (entropy, "rows"), *scalars(4)], ["rows", ("sum", weight), ("sum", bias)])


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    outputs: tuple[str, ...] = ("log_probs",),
    chunk_size: int | None = None,
    process_group=None,
) -> LogProbs:
    """The log-probability of each target token under the logits
    `softcap(logit_scale * (hidden @ weight.T + bias)) / temperature` (softcap c: c * tanh(x / c)),
    without materializing them, and the other per-token `outputs`: "entropy" (of the token's
    distribution, with its gradient), "log_sum_sq_probs", "mean_logits" (of those logits),
    "is_top1"; log_probs always. hidden [..., H], weight [V, H], bias [V] or None, one float dtype;
    target hidden.shape[:-1] of class ids. Returns LogProbs, each output target's shape, 0 where
    the target is ignore_index. chunk_size: tokens per chunk (None: chunk_size_for(N, H, V)).

    hidden and bias are multiplied by logit_scale / temperature before the matmul (no [tokens, V]
    copy), which rounds them once to their dtype where it is not float32.

    Vocab-parallel (docs/tensor_parallel.md): with `process_group`, weight [V_r, H] and bias [V_r]
    are this rank's rows of the classes [offset_r, offset_r + V_r) (sizes may differ per rank),
    hidden and target (global class ids) alike on every rank; the outputs are the whole head's,
    alike on every rank, hidden's gradient whole, the head's this rank's rows. Every rank of the
    group calls it (and runs the backward) with the same options. A DTensor head Shard(0) over a
    mesh dim is taken the same way, over that dim's group, without gathering it."""
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias), ("target", target)):
        check_dense(name, t, optional=name == "bias")
    options = spec.fused_linear_logprobs(
        facts(hidden),
        facts(weight),
        facts(bias),
        facts(target),
        temperature=temperature,
        logit_scale=logit_scale,
        softcap=softcap,
        ignore_index=ignore_index,
        outputs=outputs,
        chunk_size=chunk_size,
    )
    check_same_device("hidden", hidden, weight=weight, bias=bias, target=target)
    vp.check_group(process_group)
    check_dtensors(hidden=hidden, weight=weight, bias=bias, target=target)
    vocab_dim = vpl.vocab_dim(weight)
    shape, h_dim = target.shape, hidden.shape[-1]
    h2 = hidden.reshape(-1, h_dim)
    if options.scale != 1.0:
        h2, bias = h2 * options.scale, None if bias is None else bias * options.scale
    h2, weight = h2.contiguous(), weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    if process_group is not None or vocab_dim is not None:  # the head's rows sharded: kept so
        values = vpl.fused_linear_logprobs(h2, weight, bias, target.reshape(-1).contiguous(), options, process_group, vocab_dim)
    else:
        log_probs, _lse, *rest = _fwd(h2, weight, bias, target.reshape(-1).contiguous(), *options.op_args())
        values = {"log_probs": log_probs, **dict(zip(spec.OUTPUTS[1:], rest))}
    got = {}
    for name, value in values.items():
        if name in options.outputs:
            value = value.reshape(shape)
            got[name] = value if name in ("log_probs", "entropy") else value.detach()
    if "is_top1" in got:
        got["is_top1"] = got["is_top1"] > 0.5
    return LogProbs(**got)
