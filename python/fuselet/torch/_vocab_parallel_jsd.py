"""Vocab-parallel fused_linear_jsd: the student's and the teacher's heads both sharded by rows (the
classes) over a tensor-parallel process group, the tokens replicated across it.

Rank r of the group holds the classes [offset_r, offset_r + V_r) of both heads (V_r may differ
between ranks, and may be 0; the student's and the teacher's shards cover the same classes). Per
chunk of n tokens each rank computes the logits of its own classes only, [n, V_r] for each
model, and the ranks exchange [2, n] float32 twice:

  1. the local log-sum-exps of the student's and the teacher's logits (times 1 / temperature):
     one all-gather of [2, n]; every rank then computes the global ones (logsumexp over the
     ranks, in rank order: alike on every rank), so that x = s / T - lse_s and t = u / T - lse_t
     are the global log-probabilities log Q and log P of its classes;
  2. the local sums over its classes of the divergence's terms (with beta in (0, 1) those of the
     mixture M = beta P + (1 - beta) Q, whose log is per class) and of d term / dx: one
     all-gather of [2, n]; their sums over the ranks are the row's loss and S = sum_k dx_k.

The chunk's student dlogits are then g / T (dx_j - Q_j S) on every rank's own classes (the
gradient through the global log_softmax), with no further collective; the teacher gets none.
hidden's gradient (each rank's dlogits_r @ weight_r) is all-reduced once per call; the student
weight's gradient stays the rank's own rows. The math is fuselet/divergence.h's (its forms at
beta 0 and 1, every weight-0 term 0), in float32 on [n, V_r] temporaries (four, five with beta in
(0, 1)): the kernel over logits normalizes over the classes it is given, which here are one
rank's share. So the default chunk_size is chunk_size_for(N, H, V) of the whole V (one process's):
each rank's [chunk, V_r] buffers are then 1 / ranks of one process's chunk buffers, times the
temporaries.
"""

from __future__ import annotations

import torch

from fuselet.spec import fused_linear_jsd as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for
from fuselet.torch import _vocab_parallel as vp
from fuselet.torch._dtensor import is_dtensor, placements


def _lse(a: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, -inf for a rank with no classes (an empty dim)."""
    if a.shape[-1] == 0:
        return torch.full(a.shape[:-1], -torch.inf, dtype=a.dtype, device=a.device)
    return torch.logsumexp(a, -1)


def _terms_(x, q, t, p, beta: float):
    """(term, dx) per class of fuselet/divergence.h's JSD (DivergenceMath.term_dx), computed over
    the buffers of x and t (the log-probabilities; q, p their exponentials, p consumed): every
    weight-0 term selected to 0. At most one more [n, V_r] float32 buffer (the mixture's log)."""
    if beta == 0.0:  # forward KL(P || Q): p (t - x), -p
        term = t.sub_(x).mul_(p).masked_fill_(p == 0, 0.0)
        return term, p.neg_()
    if beta == 1.0:  # reverse KL(Q || P): q (x - t), q (x - t + 1)
        dx = x.sub_(t)
        term = torch.mul(dx, q, out=t).masked_fill_(q == 0, 0.0)
        return term, dx.add_(1.0).mul_(q).masked_fill_(q == 0, 0.0)
    lm = torch.mul(p, beta).add_(q, alpha=1.0 - beta).log_()  # log M
    term = t.sub_(lm).mul_(p).mul_(beta).masked_fill_(p == 0, 0.0)
    dx = x.sub_(lm).mul_(q).mul_(1.0 - beta).masked_fill_(q == 0, 0.0)
    return term.add_(dx), dx


def _combine(stats: torch.Tensor, shard: vp.Shard) -> torch.Tensor:
    """[world, 2, n]: every rank's [2, n] (one all-gather), or this rank's alone."""
    return vp.gather(stats, shard.group, shard.world) if shard.world > 1 else stats[None]


def jsd_chunk_(student, teacher, g, shard: vp.Shard, beta: float, inv_t: float) -> torch.Tensor:
    """The rows' divergences [n] float32, alike on every rank; student [n, V_r] (this rank's
    logits) becomes, in place, g * d row / d student (g [n] float32). Two all-gathers of [2, n]."""
    x = student.float() * inv_t
    t = teacher.float() * inv_t
    lse = _combine(torch.stack([_lse(x), _lse(t)]), shard)
    lse = torch.logsumexp(lse, 0)  # [2, n]: the global log-sum-exps of the student's and the teacher's
    x.sub_(lse[0, :, None])
    t.sub_(lse[1, :, None])
    q = x.exp()
    term, dx = _terms_(x, q, t, t.exp(), beta)
    sums = _combine(torch.stack([term.sum(-1), dx.sum(-1)]), shard).sum(0)
    del term, x, t
    # the gradient through the global log_softmax: g / T (dx_j - Q_j S)
    student.copy_(dx.sub_(q.mul_(sums[1, :, None])).mul_((g * inv_t)[:, None]))
    return sums[0]


class _VocabParallelJSD(torch.autograd.Function):
    """The loss sum_rows g * row over this rank's classes; the student's gradients are computed
    here, chunk by chunk, and kept (scaled by dloss in the backward)."""

    @staticmethod
    def forward(ctx, hs, ws, ht, wt, weight_of, shard: vp.Shard, beta: float, inv_t: float):
        from fuselet.torch.fused_linear_cross_entropy import _Accumulator, _chunks, _Logits

        loss = torch.zeros((), dtype=torch.float32, device=hs.device)
        dhs = torch.empty_like(hs)
        acc = _Accumulator(ws, None)
        student, teacher = _Logits(hs, ws, None, shard.chunk), _Logits(ht, wt, None, shard.chunk)
        for a, b in _chunks(hs.shape[0], shard.chunk):
            g = weight_of[a:b].to(torch.float32)
            logits = student(hs[a:b])
            rows = jsd_chunk_(logits, teacher(ht[a:b]), g, shard, beta, inv_t)
            loss += torch.where(g > 0, rows * g, 0.0).sum()
            torch.mm(logits, ws, out=dhs[a:b])
            acc.add(logits, hs[a:b])
        student = teacher = logits = None
        vp.all_reduce_(dhs, shard)
        ctx.save_for_backward(dhs, acc.results()[0])
        return loss

    @staticmethod
    def backward(ctx, g):
        dhs, dws = ctx.saved_tensors
        return dhs * g.to(dhs.dtype), dws * g.to(dws.dtype), None, None, None, None, None, None


def _local(hs, ws, ht, wt, weight_of, shard: vp.Shard, options: spec.FusedLinearJSDOptions):
    """This rank's loss (the sum over its tokens of weight_of times the row's divergence)."""
    chunk = options.chunk_size or chunk_size_for(hs.shape[0], hs.shape[1], max(shard.vocab, 1))
    shard = vp.Shard(shard.group, shard.rank, shard.sizes, chunk, shard.reduce_hidden)
    return _VocabParallelJSD.apply(hs, ws, ht, wt, weight_of, shard, float(options.beta), 1.0 / options.temperature)


def vocab_dim(student_weight, teacher_weight) -> int | None:
    """The mesh dim over which the DTensor heads are Shard(0) (either of them; the other is
    resharded to it), or None."""
    _, Shard, _ = placements()
    dims = set()
    for name, w in (("student_weight", student_weight), ("teacher_weight", teacher_weight)):
        if not is_dtensor(w):
            continue
        on = [d for d, p in enumerate(w.placements) if isinstance(p, Shard) and p.dim == 0]
        if len(on) > 1:
            raise ValueError(
                f"{name}: expected Shard(0) on at most one mesh dimension (the tensor-parallel one), "
                f"got placements {tuple(w.placements)}"
            )
        dims.update(on)
    if len(dims) > 1:
        raise ValueError(
            f"teacher_weight: expected Shard(0) on the mesh dimension of student_weight's (the classes of both heads "
            f"alike), got placements {tuple(teacher_weight.placements)} and {tuple(student_weight.placements)}"
        )
    return dims.pop() if dims else None


def plain(hs, ws, ht, wt, weight_of, process_group, options: spec.FusedLinearJSDOptions):
    """The process_group door: this rank's rows of both heads, the tokens alike on every rank."""
    fields = {
        "student_hidden: the tokens [N, H], alike on every rank": tuple(hs.shape),
        "student_hidden: its dtype": vp.DTYPES.index(hs.dtype),
        "teacher_hidden: the tokens [N, H], alike on every rank": tuple(ht.shape),
        "teacher_hidden: its dtype": vp.DTYPES.index(ht.dtype),
        "beta": float(options.beta),
        "temperature": float(options.temperature),
        "ignore_index": int(options.ignore_index),
        "chunk_size": options.chunk_size or 0,
    }
    shard = vp.agree(process_group, ws.shape[0], fields, hs.device)
    return _local(hs, ws, ht, wt, weight_of, shard, options)


def dtensor(hs, ws, ht, wt, weight_of, options: spec.FusedLinearJSDOptions, d: int):
    """DTensor heads Shard(0) on mesh dim d: kept sharded (local_map over the plain door, group =
    the mesh's dim d). The tokens (both hiddens, weight_of) are replicated over d; over the other
    dims their Shard(0) is kept (the loss and dweight are then Partial there). Tokens Shard(0)
    over d itself (sequence parallel) are gathered for the loss, and student_hidden's gradient
    goes back as each rank's share (Partial over d), which DTensor reduce-scatters."""
    from torch.distributed.tensor.experimental import local_map

    lay = vp.mesh_layout(hs, ws, d)

    def local(hs, ws, ht, wt, weight_of):
        return _local(hs, ws, ht, wt, weight_of, lay.shard(student_weight=ws, teacher_weight=wt), options)

    return local_map(
        local,
        out_placements=[*lay.summed],  # a list: one output
        in_placements=(lay.rows, lay.head, lay.rows, lay.head, lay.rows),
        in_grad_placements=(lay.drows, lay.dhead, lay.rows, lay.head, lay.rows),
        device_mesh=lay.mesh,
        redistribute_inputs=True,
    )(hs, ws, ht, wt, weight_of)


def fused_linear_jsd(hs, ws, ht, wt, weight_of, options: spec.FusedLinearJSDOptions, process_group):
    """fused_linear_jsd's loss over vocab-sharded heads (hs [N, Hs], ht [N, Ht] the tokens,
    weight_of [N] each token's share of the mean): with process_group this rank's rows of both
    heads, else DTensor heads Shard(0) over a mesh dim."""
    vp.check_group(process_group)
    if process_group is not None:
        if is_dtensor(ws):
            raise ValueError("process_group: expected None for DTensor inputs (the weights' device mesh gives the group)")
        return plain(hs, ws, ht, wt, weight_of, process_group, options)
    return dtensor(hs, ws, ht, wt, weight_of, options, vocab_dim(ws, wt))
