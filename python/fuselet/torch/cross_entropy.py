"""Cross-entropy loss for PyTorch: checked wrapper, fake impls, autograd, the fused fwd_bwd helper;
the per-token log-probabilities of a chunk of logits (logprobs_chunk, logprobs_chunk_grad_).

Math and shapes: csrc/core/include/fuselet/cross_entropy.h. logits [..., V] (float32, float16,
bfloat16), target logits.shape[:-1] (int64 or int32 class ids). Per token with
target != ignore_index: ce = (1 - ls) (lse - s_t) + ls (lse - mean(s)), loss = ce + z_loss lse^2,
s = softcap * tanh(logits / softcap) with a softcap, else the logits. Ignored tokens give 0 and
no gradient. Losses are float32; the forward keeps only a float32 lse per token for the backward.
The reduction ("mean" over the non-ignored tokens, "sum", "none") runs here, around the op.
"""

from __future__ import annotations

import torch

from fuselet.spec import cross_entropy as spec
from fuselet.torch import _vocab_parallel as vp
from fuselet.torch._args import check_dense, check_same_device, facts, op_tensors
from fuselet.torch._dtensor import check_dtensors, is_dtensor, placements, rowwise, scalars, sharding

ops = torch.ops.fuselet


def _check(logits, target, **options) -> spec.CrossEntropyOptions:
    for name, t in (("logits", logits), ("target", target)):
        check_dense(name, t)
    checked = spec.cross_entropy(facts(logits), facts(target), **options)
    check_same_device("logits", logits, target=target)
    return checked


def _reduce(v: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return v
    total = v.sum()
    if reduction == "sum":
        return total
    info = torch.iinfo(target.dtype)
    if not info.min <= ignore_index <= info.max:  # no target can equal it (torch would wrap it)
        return total / max(target.numel(), 1)
    return total / (target != ignore_index).sum().clamp(min=1)  # 0 tokens: 0, not NaN


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    reduction: str = "mean",
    return_z_loss: bool = False,
    inplace_backward: bool = False,
    process_group=None,
):
    """Cross-entropy of logits [..., V] against target (logits.shape[:-1]), reduced by `reduction`.

    z_loss adds z_loss * lse^2 per token; softcap first maps the logits to softcap * tanh(logits /
    softcap). return_z_loss=True returns (loss, z), z the z-loss part alone, reduced the same way
    (for logging: no gradient flows through it). inplace_backward=True writes the gradient into
    the logits' memory (the logits must not be used after the backward).

    Vocab-parallel (docs: Tensor parallel): with `process_group`, logits [..., V_r] are this
    rank's classes [offset_r, offset_r + V_r) (offset_r the classes of the ranks before it; the
    sizes may differ) of the same tokens on every rank, target the global class ids; the loss is
    the whole vocabulary's, alike on every rank, and the gradient of logits this rank's columns.
    Every rank of the group calls it (and runs the backward) with the same options. DTensor
    logits sharded on their last dim over a mesh dim are taken the same way, over that dim's
    group, without gathering them."""
    options = _check(
        logits,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        softcap=softcap,
        reduction=reduction,
        return_z_loss=return_z_loss,
    )
    inplace = spec.inplace_backward(inplace_backward)
    vp.check_group(process_group)
    check_dtensors(logits=logits, target=target)
    vocab_dim = _vocab_dim(logits)
    if process_group is not None and is_dtensor(logits):
        raise ValueError("process_group: expected None for DTensor inputs (the logits' device mesh gives the group)")
    if process_group is not None or vocab_dim is not None:
        if process_group is not None:
            loss, z = _plain_vocab_parallel(logits, target, process_group, options, inplace)
        else:
            loss, z = _dtensor_vocab_parallel(logits, target, options, inplace, vocab_dim)
    elif inplace:
        loss, z = _InplaceBackward.apply(logits, target, *options.op_args())
    else:
        loss, z, _ = ops.cross_entropy_fwd(logits, target, *options.op_args())
    loss = _reduce(loss, target, options.ignore_index, reduction)
    if not return_z_loss:
        return loss
    return loss, _reduce(z.detach(), target, options.ignore_index, reduction)


# --- vocab-parallel: the logits' classes sharded over a process group (fuselet.torch._vocab_parallel)


class _VocabParallel(torch.autograd.Function):
    """(loss, z) per row of this rank's logits [N, V_r]: one all-gather of [k, N] float32 in the
    forward, none in the backward (the gradient of logits is this rank's columns)."""

    @staticmethod
    def forward(ctx, logits, target, shard, op_args, inplace):
        rows = vp.Rows(target, shard, op_args[0])
        loss, z, lse = vp.combine(logits, rows, shard, op_args)
        ctx.shard, ctx.op_args, ctx.inplace = shard, op_args, inplace
        ctx.save_for_backward(logits, target, lse)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, dloss, _dz):
        logits, target, lse = ctx.saved_tensors
        shard, op_args = ctx.shard, ctx.op_args
        dlogits = logits if ctx.inplace else logits.clone(memory_format=torch.contiguous_format)
        g = dloss.to(torch.float32).contiguous()
        vp.dlogits_(dlogits, g, vp.Rows(target, shard, op_args[0]), lse, shard, op_args)
        return dlogits, None, None, None, None


def _vocab_parallel(logits, target, shard: vp.Shard, options, inplace: bool):
    """(loss, z) of target's shape: logits [..., V_r] this rank's classes, target alike on all ranks."""
    vp.check_targets(target, shard.vocab, options.ignore_index)
    n = target.numel()
    loss, z = _VocabParallel.apply(logits.reshape(n, logits.shape[-1]), target.reshape(n), shard, options.op_args(), inplace)
    return loss.reshape(target.shape), z.reshape(target.shape)


def _plain_vocab_parallel(logits, target, process_group, options, inplace: bool):
    fields = {
        "logits: the tokens (its rows), alike on every rank": target.numel(),
        "logits: its dtype": vp.DTYPES.index(logits.dtype),
        "ignore_index": int(options.ignore_index),
        "label_smoothing": float(options.label_smoothing),
        "z_loss": float(options.z_loss),
        "softcap": float(options.softcap or 0.0),
    }
    shard = vp.agree(process_group, logits.shape[-1], fields, logits.device)
    return _vocab_parallel(logits, target, shard, options, inplace)


def _vocab_dim(logits) -> int | None:
    """The mesh dim over which DTensor logits are sharded on their last dim (classes), or None."""
    if not is_dtensor(logits):
        return None
    _, Shard, _ = placements()
    last = logits.ndim - 1
    dims = [d for d, p in enumerate(logits.placements) if isinstance(p, Shard) and p.dim in (last, -1)]
    if len(dims) > 1:
        raise ValueError(
            f"logits: expected its last dim (the classes) sharded over at most one mesh dimension, "
            f"got placements {tuple(logits.placements)}"
        )
    return dims[0] if dims else None


def _dtensor_vocab_parallel(logits, target, options, inplace: bool, d: int):
    """DTensor logits sharded on their classes over mesh dim d: kept sharded (local_map over the
    plain door, group = the mesh's dim d). target is replicated over d; over the other dims a
    sharding of the tokens (the leading dims) is kept, and the per-token loss has it."""
    from torch.distributed.tensor.experimental import local_map

    Replicate, Shard, _ = placements()
    mesh, last = logits.device_mesh, logits.ndim - 1
    tokens = tuple(
        p if e != d and isinstance(p, Shard) and p.dim < last else Replicate() for e, p in enumerate(logits.placements)
    )
    classes = tuple(Shard(last) if e == d else p for e, p in enumerate(tokens))
    sizes = vp.even_sizes(logits.shape[-1], mesh.size(d))
    rank = mesh.get_local_rank(d)

    def local(lg, t):
        if lg.shape[-1] != sizes[rank]:
            raise ValueError(f"logits: expected {sizes[rank]} classes on rank {rank}, got {lg.shape[-1]}")
        return _vocab_parallel(lg, t, vp.Shard(mesh.get_group(d), rank, sizes), options, inplace)

    return local_map(
        local,
        out_placements=(tokens, tokens),  # a tuple: one placement list per output
        in_placements=(classes, tokens),
        in_grad_placements=(classes, tokens),
        device_mesh=mesh,
        redistribute_inputs=True,
    )(logits, target)


def fwd_bwd(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    grad_scale: float = 1.0,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z, dlogits) in one pass, no autograd: the per-token float32 loss and z-loss part
    (target's shape, 0 where ignored) and dlogits = grad_scale * d loss_token / d logits in
    logits' dtype. inplace=True writes dlogits into logits and returns logits as dlogits."""
    options = _check(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap)
    scale = spec.grad_scale(grad_scale)
    if inplace and (is_dtensor(logits) or is_dtensor(target)):
        # DTensor runs an op whose name ends in "_" as an in-place op that returns its first
        # argument; cross_entropy_fwd_bwd_ returns (loss, z) (torch 2.13).
        raise ValueError(
            "inplace: expected False for DTensor logits / target (DTensor cannot run the "
            "in-place fwd_bwd op); inplace=False returns the same (loss, z, dlogits)"
        )
    if inplace:
        loss, z = ops.cross_entropy_fwd_bwd_(logits, target, *options.op_args(), scale)
        return loss, z, logits
    return ops.cross_entropy_fwd_bwd(logits, target, *options.op_args(), scale)


# --- fake (meta) implementations: shapes only, for torch.compile and FakeTensor ---------


def _tokens(logits):
    return logits.new_empty(logits.shape[:-1], dtype=torch.float32)


def _fake_check(logits, target, op_args, grad_scale=None, **tokens):
    """The op's checks (spec.op): logits [..., V], target (its rows' class ids, any shape), the
    options, grad_scale, and per-token float32 `tokens` (dloss, lse)."""
    op_tensors(logits=logits, target=target, **tokens)
    spec.op(facts(logits), facts(target), op_args, grad_scale, {n: facts(t) for n, t in tokens.items()})


@torch.library.register_fake("fuselet::cross_entropy_fwd")
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap):
    _fake_check(logits, target, (ignore_index, label_smoothing, z_loss, softcap))
    return _tokens(logits), _tokens(logits), _tokens(logits)


@torch.library.register_fake("fuselet::cross_entropy_bwd")
def _(dloss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap):
    _fake_check(logits, target, (ignore_index, label_smoothing, z_loss, softcap), dloss=dloss, lse=lse)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.register_fake("fuselet::cross_entropy_bwd_")
def _(dloss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap):
    _fake_check(logits, target, (ignore_index, label_smoothing, z_loss, softcap), dloss=dloss, lse=lse)
    return None


@torch.library.register_fake("fuselet::cross_entropy_fwd_bwd")
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, grad_scale):
    _fake_check(logits, target, (ignore_index, label_smoothing, z_loss, softcap), grad_scale)
    return _tokens(logits), _tokens(logits), torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.register_fake("fuselet::cross_entropy_fwd_bwd_")
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, grad_scale):
    _fake_check(logits, target, (ignore_index, label_smoothing, z_loss, softcap), grad_scale)
    return _tokens(logits), _tokens(logits)


# --- DTensor sharding (fuselet.torch._dtensor): tokens (logits' leading dims, target's dims)
# keep their sharding, the vocabulary dim V is whole (a vocab-sharded logits is redistributed).
# The per-token outputs are sharded like the tokens; a "sum" / "mean" over sharded tokens is
# then Partial (sum) and reduced by DTensor when needed.


@sharding("cross_entropy_fwd")
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap):
    return rowwise([(logits, "rows"), (target, "rows"), *scalars(4)], ["rows"] * 3)


@sharding("cross_entropy_bwd")
def _(dloss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap):
    return rowwise([(dloss, "rows"), (logits, "rows"), (target, "rows"), (lse, "rows"), *scalars(4)], ["rows"])


@sharding("cross_entropy_bwd_")
def _(dloss, logits, target, lse, ignore_index, label_smoothing, z_loss, softcap):
    # logits is written in place, so it keeps its placement (DTensor's in-place check guards
    # argument 0 only, here dloss: a redistributed logits would take the gradient in a copy).
    strategies = rowwise([(dloss, "rows"), (logits, "rows"), (target, "rows"), (lse, "rows"), *scalars(4)], [])
    kept = [s for s in strategies if s[1][1] in logits.placements]
    if not kept:
        raise ValueError(
            f"logits: the in-place backward needs logits sharded on token dims or replicated, "
            f"got placements {tuple(logits.placements)}"
        )
    return kept


@sharding("cross_entropy_fwd_bwd")
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, grad_scale):
    return rowwise([(logits, "rows"), (target, "rows"), *scalars(5)], ["rows"] * 3)


# Declared for completeness: DTensor's dispatch (torch 2.13) expects an op named "..._" to
# return its first argument, so fwd_bwd(inplace=True) refuses DTensors before calling it.
@sharding("cross_entropy_fwd_bwd_")
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, grad_scale):
    return rowwise([(logits, "rows"), (target, "rows"), *scalars(5)], ["rows"] * 2)


# --- autograd: the gradient of logits only, through the per-token loss ------------------


def _setup(ctx, inputs, output):
    logits, target, *ctx.options = inputs
    ctx.save_for_backward(logits, target, output[2])


def _backward(ctx, dloss, _dz, _dlse):
    logits, target, lse = ctx.saved_tensors
    dlogits = None if dloss is None else ops.cross_entropy_bwd(dloss, logits, target, lse, *ctx.options)
    return dlogits, None, None, None, None, None


torch.library.register_autograd("fuselet::cross_entropy_fwd", _backward, setup_context=_setup)


class _InplaceBackward(torch.autograd.Function):
    """cross_entropy_fwd whose backward overwrites the saved logits with their gradient
    (cross_entropy_bwd_, a mutating op: functionalization and torch.compile see the write)."""

    @staticmethod
    def forward(ctx, logits, target, *op_args):
        """op_args: CrossEntropyOptions.op_args() (spec/cross_entropy.py)."""
        loss, z, lse = ops.cross_entropy_fwd(logits, target, *op_args)
        ctx.options = op_args
        ctx.save_for_backward(logits, target, lse)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, dloss, _dz):
        logits, target, lse = ctx.saved_tensors
        none = (None,) * (1 + len(ctx.options))  # target's and the options'
        if dloss is None:
            return None, *none
        if is_dtensor(logits):  # DTensor and ops that write into their second argument: see _sharding
            return ops.cross_entropy_bwd(dloss, logits, target, lse, *ctx.options), *none
        ops.cross_entropy_bwd_(dloss, logits, target, lse, *ctx.options)
        return logits, *none


# --- the log-probabilities of a chunk of logits (fuselet_logprobs_*): no autograd, called chunk
# by chunk by the fused-linear log-probabilities ----------------------------------------------


def logprobs_chunk(logits, target, *, ignore_index, softcap, outputs) -> dict:
    """Per-token log-probabilities of logits [..., V] at target (logits.shape[:-1]), no autograd:
    {"log_probs": s_t - lse, "lse": lse} (float32, target's shape; 0 where target ==
    ignore_index), plus the names of `outputs` asked for among "entropy" (lse - sum p s),
    "log_sum_sq_probs" (log sum p^2), "mean_logits" (mean s) (float32) and "is_top1" (bool:
    target is the argmax of s, ties to the lowest index). s = softcap * tanh(logits / softcap)
    with a softcap, else the logits; p = softmax(s). lse and entropy are the inputs of
    logprobs_chunk_grad_."""
    for name, t in (("logits", logits), ("target", target)):
        check_dense(name, t)
    options = spec.logprobs(facts(logits), facts(target), ignore_index=ignore_index, softcap=softcap, outputs=outputs)
    check_same_device("logits", logits, target=target)
    logp, lse, entropy, lssp, mean, top1 = ops.logprobs_fwd(logits, target, *options.op_args())
    result = {"log_probs": logp, "lse": lse}
    for name, value in (("entropy", entropy), ("log_sum_sq_probs", lssp), ("mean_logits", mean), ("is_top1", top1 != 0)):
        if name in options.outputs:
            result[name] = value
    return result


def logprobs_chunk_grad_(logits, target, lse, entropy, dlogp, dentropy, *, ignore_index, softcap):
    """The gradient of logits of sum(dlogp * log_probs + dentropy * entropy) (logprobs_chunk's),
    written into logits (which is returned): dlogp, dentropy per token (target's shape; None for
    0), lse and entropy logprobs_chunk's (entropy needed with dentropy, else may be None)."""
    check_dense("logits", logits)
    check_dense("target", target)
    options = spec.logprobs(facts(logits), facts(target), ignore_index=ignore_index, softcap=softcap)
    f32 = [None if t is None else t.to(torch.float32) for t in (dlogp, dentropy)]
    ops.logprobs_bwd_(logits, target, lse, entropy, *f32, *options.op_args()[:2])
    return logits


@torch.library.register_fake("fuselet::logprobs_fwd")
def _(logits, target, ignore_index, softcap, with_entropy, with_stats):
    op_tensors(logits=logits, target=target)
    spec.logprobs_op(facts(logits), facts(target), (ignore_index, softcap))

    def out(asked):
        return _tokens(logits) if asked else logits.new_empty((0,), dtype=torch.float32)

    return out(True), out(True), out(with_entropy), out(with_stats), out(with_stats), out(with_stats)


@torch.library.register_fake("fuselet::logprobs_bwd_")
def _(logits, target, lse, entropy, dlogp, dentropy, ignore_index, softcap):
    tokens = {"lse": lse, "entropy": entropy, "dlogp": dlogp, "dentropy": dentropy}
    op_tensors(optional=("entropy", "dlogp", "dentropy"), logits=logits, target=target, **tokens)
    given = {n: facts(t) for n, t in tokens.items() if t is not None}
    spec.logprobs_op(facts(logits), facts(target), (ignore_index, softcap), given)
    return None


@sharding("logprobs_fwd")
def _(logits, target, ignore_index, softcap, with_entropy, with_stats):
    def out(asked):
        return "rows" if asked else ("sum", None)  # not asked for: an empty tensor, replicated

    outs = [out(True), out(True), out(with_entropy), *[out(with_stats)] * 3]
    return rowwise([(logits, "rows"), (target, "rows"), *scalars(4)], outs)


@sharding("logprobs_bwd_")
def _(logits, target, lse, entropy, dlogp, dentropy, ignore_index, softcap):
    # logits is written in place (argument 0), so it keeps its placement.
    tokens = [(t, "rows") for t in (lse, entropy, dlogp, dentropy)]
    strategies = rowwise([(logits, "rows"), (target, "rows"), *tokens, *scalars(2)], [])
    kept = [s for s in strategies if s[1][0] in logits.placements]
    if not kept:
        raise ValueError(
            f"logits: the in-place backward needs logits sharded on token dims or replicated, "
            f"got placements {tuple(logits.placements)}"
        )
    return kept


# fuselet.<layer>.cross_entropy is the function above (the package exports it over this
# module's name): the helpers are reachable as fuselet.<layer>.cross_entropy.fwd_bwd (and
# .logprobs_chunk, .logprobs_chunk_grad_) too.
cross_entropy.fwd_bwd = fwd_bwd
cross_entropy.logprobs_chunk = logprobs_chunk
cross_entropy.logprobs_chunk_grad_ = logprobs_chunk_grad_
