"""Vocab-parallel fused_linear_logprobs: the head's rows (the classes) sharded over a
tensor-parallel process group, the tokens replicated across it (fuselet.torch._vocab_parallel's
Shard: rank r holds the classes [offset_r, offset_r + V_r), V_r may differ and may be 0).

Per chunk of n tokens each rank computes the logits of its own classes only, [n, V_r] (hidden and
bias already times logit_scale / temperature, the softcap divided by the temperature), and runs
fuselet's logprobs kernel on them (the target's local column where the rank holds the target,
else column 0: a stand-in). The kernel gives the statistics of the rank's own distribution p^r
(the softmax over its classes): lse_r, and as asked its entropy H_r, log sum (p^r)^2 and mean
logit. Then **one all-gather of [k, n] float32** (k = 2 + 1 with the entropy + 4 with the
statistics): lse_r, the target's soft-capped logit s_t (0 on the ranks that do not hold it), H_r,
log sum (p^r)^2, the sum of the rank's logits, its largest logit and whether its local argmax is
the target. Every rank computes from the same gathered values, in rank order (alike on every
rank), with w_r = exp(lse_r - lse) the share of rank r's classes in the softmax:

  lse              = logsumexp_r(lse_r)
  log_probs        = s_t - lse
  entropy          = sum_r w_r (H_r + lse - lse_r)      (H(p) = sum_r w_r H_r + H(w): no cancellation)
  log_sum_sq_probs = logsumexp_r(2 (lse_r - lse) + log sum (p^r)^2)
  mean_logits      = sum_r (sum of rank r's logits) / V
  is_top1          = the owner's local argmax is the target, every rank before it has a largest
                     logit < s_t and every rank after it <= s_t (ties to the lowest class)

0 (False) where the target is ignore_index. The backward of a chunk needs no collective: the
kernel's backward on the local logits with the global lse and entropy gives every entry of
dlogits but the local target column's (p_j = exp(s_j - lse) is the global softmax, the entropy's
term -h p_j ((s_j - lse) + entropy) too); that one entry per row (the target's, or the stand-in's,
which has no [j == t] term) is computed anew in float32 from its logit and written over the
kernel's. dhidden (each rank's dlogits_r @ weight_r) is all-reduced once per backward; dweight_r
and dbias_r stay the rank's own rows.
"""

from __future__ import annotations

import torch

from fuselet.spec import fused_linear_logprobs as spec
from fuselet.torch import _vocab_parallel as vp
from fuselet.torch._dtensor import is_dtensor
from fuselet.torch.fused_linear_cross_entropy import _chunks, _Logits, _vocab_dim, _vp_chunk, recomputed_backward

ops = torch.ops.fuselet

_STATS = ("log_sum_sq_probs", "mean_logits", "is_top1")


def _rows_of(asked) -> dict:
    """The gathered rows' indices: lse_r, s_t, and per asked output its own."""
    rows = ["lse", "s_t"]
    if "entropy" in asked:
        rows.append("entropy")
    if any(name in asked for name in _STATS):
        rows += ["log_sum_sq_probs", "sum", "max", "top1"]
    return {name: i for i, name in enumerate(rows)}


def _capped(x: torch.Tensor, softcap: float) -> torch.Tensor:
    return softcap * torch.tanh(x / softcap) if softcap else x


def chunk_stats(logits, target, shard: vp.Shard, ignore_index: int, softcap: float, asked) -> dict:
    """{"log_probs", "lse", and the names of `asked`} per row [n] float32 (is_top1 1.0 / 0.0),
    alike on every rank: logits [n, V_r] this rank's (V_r may be 0), target [n] the global class
    ids. One all-gather of [k, n] float32."""
    rows = vp.Rows(target, shard, ignore_index)
    n = rows.col.shape[0]
    where = _rows_of(asked)
    stats = torch.zeros((len(where), n), dtype=torch.float32, device=rows.col.device)
    if shard.local > 0 and n > 0:
        with_stats = "max" in where
        kernel = ops.logprobs_fwd(logits, rows.col, vp._NO_CLASS, softcap, "entropy" in where, with_stats)
        _, lse_r, ent_r, lssp_r, mean_r, top1_r = kernel
        s_col = _capped(logits.gather(1, rows.col[:, None]).squeeze(1).float(), softcap)
        stats[where["lse"]] = lse_r
        stats[where["s_t"]] = torch.where(rows.owned, s_col, 0.0)
        if "entropy" in where:
            stats[where["entropy"]] = ent_r
        if with_stats:
            stats[where["log_sum_sq_probs"]] = lssp_r
            stats[where["sum"]] = mean_r * shard.local
            stats[where["max"]] = _capped(logits.amax(1).float(), softcap)
            stats[where["top1"]] = top1_r
    else:  # no classes here: no share of the softmax, no largest logit
        stats[where["lse"]] = -torch.inf
        if "max" in where:
            stats[where["log_sum_sq_probs"]] = -torch.inf
            stats[where["max"]] = -torch.inf
    gathered = vp.gather(stats, shard.group, shard.world) if shard.world > 1 and n > 0 else stats[None]
    lse_r = gathered[:, where["lse"]]
    lse = torch.logsumexp(lse_r, 0)
    s_t = gathered[:, where["s_t"]].sum(0)
    out = {"log_probs": s_t - lse, "lse": lse}
    log_w = lse_r - lse  # [world, n]: log of each rank's share of the softmax (-inf: none)
    if "entropy" in asked:
        w = log_w.exp()
        out["entropy"] = torch.where(w > 0, w * (gathered[:, where["entropy"]] - log_w), 0.0).sum(0)
    if "log_sum_sq_probs" in asked:
        out["log_sum_sq_probs"] = torch.logsumexp(2.0 * log_w + gathered[:, where["log_sum_sq_probs"]], 0)
    if "mean_logits" in asked:
        out["mean_logits"] = gathered[:, where["sum"]].sum(0) / shard.vocab
    if "is_top1" in asked:
        owner = torch.bucketize(target, torch.tensor(_ends(shard), device=rows.col.device), right=True)
        ranks = torch.arange(shard.world, device=rows.col.device)[:, None]
        m = gathered[:, where["max"]]
        beats = torch.where(ranks < owner, m < s_t, m <= s_t)
        beats = torch.where(ranks == owner, gathered[:, where["top1"]] > 0.5, beats)
        out["is_top1"] = beats.all(0).to(torch.float32)
    zero = torch.zeros((), dtype=torch.float32, device=rows.col.device)
    return {name: torch.where(rows.ignored, zero, v) for name, v in out.items()}


def _ends(shard: vp.Shard) -> list:
    """The end of each rank's classes (the owner of class t: the first rank whose end is > t)."""
    ends, total = [], 0
    for size in shard.sizes:
        total += size
        ends.append(total)
    return ends


def chunk_grad_(logits, rows: vp.Rows, lse, entropy, dlogp, dentropy, shard: vp.Shard, softcap: float) -> None:
    """logits [n, V_r] becomes, in place, the gradient of sum(dlogp * log_probs + dentropy *
    entropy) (dlogp, dentropy [n] float32 or None; lse, entropy the global ones of chunk_stats).
    No collective."""
    if shard.local == 0 or logits.shape[0] == 0:
        return
    s_col = _capped(logits.gather(1, rows.col[:, None]).squeeze(1).float(), softcap)  # before it is overwritten
    target = torch.where(rows.ignored, torch.full_like(rows.col, vp._NO_CLASS), rows.col)
    ops.logprobs_bwd_(logits, target, lse, entropy if dentropy is not None else None, dlogp, dentropy, vp._NO_CLASS, softcap)
    # the kernel took [j == t] at col, the target's where this rank holds it, a stand-in's (no
    # such term) elsewhere: the entry is written anew, in float32 from the logit read above
    p = torch.exp(s_col - lse)
    d = torch.zeros_like(p)
    if dlogp is not None:
        d = dlogp * (rows.owned.to(torch.float32) - p)
    if dentropy is not None:
        d = d - dentropy * p * ((s_col - lse) + entropy)
    if softcap:
        d = d * (1.0 - (s_col / softcap).square())
    d = torch.where(rows.ignored, 0.0, d)
    logits.scatter_(1, rows.col[:, None], d[:, None].to(logits.dtype))


class _VocabParallelLogProbs(torch.autograd.Function):
    """(log_probs, *the asked outputs in spec.OUTPUTS' order) per row of hidden [N, H] through this
    rank's rows of the head; the forward keeps the global lse (and entropy) [N], the backward
    recomputes each chunk's local logits."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, shard: vp.Shard, ignore_index: int, softcap: float, asked):
        n = hidden.shape[0]
        names = ("log_probs", "lse", *asked)
        out = {name: torch.zeros(n, dtype=torch.float32, device=hidden.device) for name in names}
        logits_of = _Logits(hidden, weight, bias, shard.chunk)
        for a, b in _chunks(n, shard.chunk):
            for name, value in chunk_stats(logits_of(hidden[a:b]), target[a:b], shard, ignore_index, softcap, asked).items():
                out[name][a:b] = value
        logits_of = None
        ctx.shard, ctx.ignore_index, ctx.softcap, ctx.asked = shard, ignore_index, softcap, asked
        ctx.has_bias = bias is not None
        ctx.save_for_backward(hidden, weight, bias, target, out["lse"], out.get("entropy"))
        results = tuple(out[name] for name in ("log_probs", *asked))
        ctx.mark_non_differentiable(*(out[name] for name in asked if name in _STATS))
        return results

    @staticmethod
    def backward(ctx, dlogp, *rest):
        dentropy = rest[ctx.asked.index("entropy")] if "entropy" in ctx.asked else None
        if dlogp is None and dentropy is None:
            return (None,) * 8
        hidden, weight, bias, target, lse, entropy = ctx.saved_tensors
        shard, softcap = ctx.shard, ctx.softcap
        dlogp, dentropy = (None if g is None else g.to(torch.float32).contiguous() for g in (dlogp, dentropy))

        def part(t, a, b):
            return None if t is None else t[a:b]

        def dlogits_(logits, a, b, block):
            rows = vp.Rows(target[a:b], block, ctx.ignore_index)
            chunk_grad_(logits, rows, lse[a:b], part(entropy, a, b), part(dlogp, a, b), part(dentropy, a, b), block, softcap)

        dhidden, dweight, dbias = recomputed_backward(hidden, weight, bias, shard, dlogits_)
        vp.all_reduce_(dhidden, shard)
        return dhidden, dweight, dbias if ctx.has_bias else None, None, None, None, None, None


def _local(h2, weight, bias, t1, shard: vp.Shard, options: spec.FusedLinearLogProbsOptions) -> dict:
    """{name: [N] float32} of this rank's tensors (h2, bias already scaled): log_probs and the
    asked outputs (is_top1 1.0 / 0.0)."""
    ignore_index, softcap, _, _ = options.op_args()
    vp.check_targets(t1, shard.vocab, ignore_index)
    shard = _vp_chunk(shard, h2.shape[0], h2.shape[1], options.chunk_size)
    asked = tuple(name for name in spec.OUTPUTS[1:] if name in options.outputs)
    values = _VocabParallelLogProbs.apply(h2, weight, bias, t1, shard, ignore_index, float(softcap), asked)
    return dict(zip(("log_probs", *asked), values))


def plain(h2, weight, bias, t1, process_group, options: spec.FusedLinearLogProbsOptions) -> dict:
    """The process_group door: this rank's rows of the head, the tokens alike on every rank."""
    fields = {
        "hidden: the tokens [N, H], alike on every rank": tuple(h2.shape),
        "hidden: its dtype": vp.DTYPES.index(h2.dtype),
        "bias: given or None": bias is not None,
        "chunk_size": options.chunk_size or 0,
        "ignore_index": int(options.ignore_index),
        "temperature": float(options.temperature),
        "logit_scale": float(options.logit_scale),
        "softcap": float(options.softcap or 0.0),
        "outputs": spec.flags(options.outputs),
    }
    shard = vp.agree(process_group, weight.shape[0], fields, h2.device)
    return _local(h2, weight, bias, t1, shard, options)


def dtensor(h2, weight, bias, t1, options: spec.FusedLinearLogProbsOptions, d: int) -> dict:
    """DTensor inputs with the head Shard(0) on mesh dim d: kept sharded (local_map over the plain
    door, group = the mesh's dim d), as fused_linear_cross_entropy's reduction="none": hidden /
    target replicated over d (Shard(0) over d itself, sequence parallel: gathered, hidden's
    gradient reduce-scattered back), their Shard(0) over the other dims kept, and so the outputs'."""
    from torch.distributed.tensor.experimental import local_map

    lay = vp.mesh_layout(h2, weight, d)
    asked = tuple(name for name in spec.OUTPUTS[1:] if name in options.outputs)

    def local(h, w, t, b=None):
        got = _local(h, w, b, t, lay.shard(weight=w), options)
        return tuple(got[name] for name in ("log_probs", *asked))

    args = (h2, weight, t1) + (() if bias is None else (bias,))
    values = local_map(
        local,
        out_placements=(lay.rows,) * (1 + len(asked)),  # a tuple: one placement list per output
        in_placements=(lay.rows, lay.head, lay.rows) + (() if bias is None else (lay.head,)),
        in_grad_placements=(lay.drows, lay.dhead, lay.rows) + (() if bias is None else (lay.dhead,)),
        device_mesh=lay.mesh,
        redistribute_inputs=True,
    )(*args)
    return dict(zip(("log_probs", *asked), values))


def vocab_dim(weight) -> int | None:
    """The mesh dim over which a DTensor head is Shard(0) (fused_linear_cross_entropy's rule)."""
    return _vocab_dim(weight) if is_dtensor(weight) else None


def fused_linear_logprobs(h2, weight, bias, t1, options: spec.FusedLinearLogProbsOptions, process_group, d) -> dict:
    """fused_linear_logprobs' outputs {name: [N]} over a vocab-sharded head (h2 [N, H] and bias
    already times logit_scale / temperature): with process_group this rank's rows, else a
    DTensor head Shard(0) over mesh dim d."""
    if process_group is not None:
        if is_dtensor(weight):
            raise ValueError("process_group: expected None for DTensor inputs (the weight's device mesh gives the group)")
        return plain(h2, weight, bias, t1, process_group, options)
    return dtensor(h2, weight, bias, t1, options, d)
