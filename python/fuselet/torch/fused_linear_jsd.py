"""The distillation loss fused with both LM heads, for PyTorch: the generalized JSD of a student's
and a teacher's token distributions from their last hidden states, without [tokens, V] logits.

fused_linear_jsd(student_hidden, student_weight, teacher_hidden, teacher_weight, labels) =
jsd(log_softmax(student_hidden @ student_weight.T / T), log_softmax(teacher_hidden @
teacher_weight.T / T), beta=beta, labels=labels), computed chunk by chunk over the tokens: each
chunk's logits of both models from torch's matmul (in the inputs' dtype), then one pass of
fuselet's divergence kernel over them (divergence_logits_: both log_softmaxes, the loss per token,
its gradient through the student's log_softmax and the temperature, written over the student's
logits), then the head's matmuls. The loss is a mean, so the gradients are computed during the
forward and kept instead of any logits; the backward scales them. Two [chunk, V] buffers in the
inputs' dtype exist, reused by every chunk; no [chunk, V] float32 tensor. Gradients flow to the
student (hidden and weight) only: the teacher is a constant. Rules: fuselet/spec/fused_linear_jsd.py.

On DTensors (the tokens of both hiddens sharded, the heads replicated) each rank runs the chunks
over its own tokens (fuselet.torch._dtensor.on_row_shards): the loss and dweight come out Partial,
dhidden keeps the tokens' sharding; the mean's count of kept tokens is the global one.
Vocab-parallel (heads Shard(0) over a mesh dim, or with process_group each rank's rows of both
heads): fuselet.torch._vocab_parallel_jsd, docs/tensor_parallel.md.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fuselet.spec import fused_linear_jsd as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for
from fuselet.torch import _vocab_parallel_jsd as vpj
from fuselet.torch._args import check_dense, check_same_device, facts
from fuselet.torch._dtensor import check_dtensors, is_dtensor, on_row_shards
from fuselet.torch.cross_entropy import logprobs_chunk
from fuselet.torch.fused_linear_cross_entropy import _Accumulator, _chunks, _Logits

ops = torch.ops.fuselet


class _FusedLinearJSD(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hs, ws, ht, wt, weight_of, options: spec.FusedLinearJSDOptions, chunk):
        n, inv_t = hs.shape[0], 1.0 / options.temperature
        jsd = options.divergence.op_args()
        loss = torch.zeros((), dtype=torch.float32, device=hs.device)
        dhs = torch.empty_like(hs)
        acc = _Accumulator(ws, None)
        student, teacher = _Logits(hs, ws, None, chunk), _Logits(ht, wt, None, chunk)
        common = torch.promote_types(hs.dtype, ht.dtype)  # the kernel's one dtype: both models' where they differ
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            g = weight_of[a:b]
            logits, teacher_logits = student(hs[a:b]).to(common), teacher(ht[a:b]).to(common)
            # one pass: both log_softmaxes, the divergence and its gradient through the student's
            # log_softmax and the temperature; logits then holds dlogits
            rows = ops.divergence_logits_(logits, teacher_logits, g, *jsd, inv_t)
            logits = logits.to(ws.dtype)
            loss += torch.where(g > 0, rows * g, 0.0).sum()
            torch.mm(logits, ws, out=dhs[a:b])
            acc.add(logits, hs[a:b])
        student = teacher = logits = None  # the chunk buffers go before dweight is converted
        ctx.save_for_backward(dhs, acc.results()[0])
        return loss

    @staticmethod
    def backward(ctx, g):
        dhs, dws = ctx.saved_tensors
        return dhs * g.to(dhs.dtype), dws * g.to(dws.dtype), None, None, None, None, None


def fused_linear_jsd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    process_group=None,
) -> torch.Tensor:
    """The generalized JSD (jsd's beta: 0 forward KL, 1 reverse KL) of the student's and the
    teacher's softmax(hidden @ weight.T / temperature), the mean over the tokens whose label is not
    ignore_index, without [tokens, V] logits. student_hidden [..., Hs], student_weight [V, Hs],
    teacher_hidden [..., Ht] (the same tokens; Ht may differ), teacher_weight [V, Ht], labels the
    tokens' shape or None. float32 loss; gradients to the student only.

    Vocab-parallel (docs/tensor_parallel.md): with process_group, student_weight and
    teacher_weight are this rank's rows of both heads (the same classes), the tokens alike on
    every rank; DTensor heads Shard(0) over a mesh dim are kept sharded the same way."""
    tensors = {
        "student_hidden": student_hidden,
        "student_weight": student_weight,
        "teacher_hidden": teacher_hidden,
        "teacher_weight": teacher_weight,
    }
    for name, t in tensors.items():
        check_dense(name, t)
    check_dense("labels", labels, optional=True)
    options = spec.fused_linear_jsd(
        *(facts(t) for t in tensors.values()),
        facts(labels),
        beta=beta,
        temperature=temperature,
        ignore_index=ignore_index,
        chunk_size=chunk_size,
    )
    check_same_device(
        "student_hidden", student_hidden, **{k: v for k, v in tensors.items() if k != "student_hidden"}, labels=labels
    )
    check_dtensors(**tensors, labels=labels)
    hs = student_hidden.reshape(-1, student_hidden.shape[-1])
    ht = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).detach()
    # each token's share of the mean: 1 / (kept tokens) where its label is kept, else 0 (on
    # DTensors: the global count, and the tokens' sharding)
    n = hs.shape[0]
    if labels is not None and torch.iinfo(labels.dtype).min <= ignore_index <= torch.iinfo(labels.dtype).max:
        keep = (labels.reshape(-1) != ignore_index).float()
        weight_of = keep / keep.sum().clamp(min=1)
    else:
        weight_of = torch.full_like(hs[:, 0], 1.0 / max(n, 1), dtype=torch.float32)
    chunk = chunk_size or chunk_size_for(n, hs.shape[1], student_weight.shape[0])

    if process_group is not None or (is_dtensor(student_weight) and vpj.vocab_dim(student_weight, teacher_weight) is not None):
        return vpj.fused_linear_jsd(hs, student_weight, ht, teacher_weight.detach(), weight_of, options, process_group)

    def loss_of(hs, ht, weight_of, ws, wt):
        return _FusedLinearJSD.apply(hs, ws, ht, wt, weight_of, options, chunk)

    if is_dtensor(hs):  # each rank its own tokens: the loss Partial, dweight Partial, dhidden sharded
        return on_row_shards(loss_of, (hs, ht, weight_of), (student_weight, teacher_weight.detach()))
    return loss_of(hs, ht, weight_of, student_weight, teacher_weight.detach())


class FusedLinearJSD(torch.nn.Module):
    """fused_linear_jsd as a module: the options (process_group included: vocab-parallel, the heads
    this rank's rows) at construction, forward(student_hidden, student_weight, teacher_hidden,
    teacher_weight, labels=None)."""

    def __init__(
        self,
        beta: float = 0.5,
        temperature: float = 1.0,
        ignore_index: int = -100,
        chunk_size: int | None = None,
        process_group=None,
    ):
        super().__init__()
        self.beta, self.temperature, self.ignore_index, self.chunk_size = beta, temperature, ignore_index, chunk_size
        self.process_group = process_group

    def forward(self, student_hidden, student_weight, teacher_hidden, teacher_weight, labels=None):
        return fused_linear_jsd(
            student_hidden,
            student_weight,
            teacher_hidden,
            teacher_weight,
            labels,
            beta=self.beta,
            temperature=self.temperature,
            ignore_index=self.ignore_index,
            chunk_size=self.chunk_size,
            process_group=self.process_group,
        )


# --- the per-token form (TRL's ChunkedDivergenceFunction's) ------------------------------------


class JSDPerToken(NamedTuple):
    """fused_linear_jsd_per_token's outputs, the tokens' shape each: divergence float32 with its
    gradient to the student; entropy (the student's, float32, no gradient) None unless asked for."""

    divergence: torch.Tensor
    entropy: torch.Tensor | None = None


def _capped_(logits: torch.Tensor, scale: float, cap: float | None, keep: torch.Tensor | None = None) -> torch.Tensor:
    """A chunk's logits y, in place, as the kernels take them: cap * tanh(scale * y / cap), or
    scale * y without a cap (FusedLinearJSDPerTokenOptions.logits). keep (like logits, with a cap)
    receives tanh(scale * y / cap), of which the backward's dz/dy is made."""
    if cap is None:
        return logits if scale == 1.0 else logits.mul_(scale)
    th = logits.mul_(scale / cap).tanh_()
    if keep is not None:
        keep.copy_(th)
    return th.mul_(cap)


class _FusedLinearJSDPerToken(torch.autograd.Function):
    """The divergence and the entropy per token; the backward recomputes each chunk's logits of both
    heads and runs the divergence kernel again with the upstream gradient (which the per-token
    outputs cannot know in the forward)."""

    @staticmethod
    def forward(ctx, hs, ws, bs, ht, wt, bt, options: spec.FusedLinearJSDPerTokenOptions, chunk):
        ctx.set_materialize_grads(False)
        n, device = hs.shape[0], hs.device
        jsd = options.divergence.op_args()
        (s_scale, s_cap), (t_scale, t_cap) = options.logits("student"), options.logits("teacher")
        divergence = torch.empty(n, dtype=torch.float32, device=device)
        entropy = torch.empty(n, dtype=torch.float32, device=device) if options.with_entropy else None
        student, teacher = _Logits(hs, ws, bs, chunk), _Logits(ht, wt, bt, chunk)
        common = torch.promote_types(hs.dtype, ht.dtype)  # the kernel's one dtype: both models' where they differ
        no_grad = torch.zeros(min(n, chunk), dtype=torch.float32, device=device)  # dloss 0: the rows alone
        ids = torch.zeros(min(n, chunk), dtype=torch.int64, device=device)
        for a, b in _chunks(n, chunk):
            z = _capped_(student(hs[a:b]), s_scale, s_cap).to(common)
            zt = _capped_(teacher(ht[a:b]), t_scale, t_cap).to(common)
            if entropy is not None:  # before the divergence kernel writes over z
                got = logprobs_chunk(z, ids[: b - a], ignore_index=-100, softcap=None, outputs=("entropy",))
                entropy[a:b] = got["entropy"]
            divergence[a:b] = ops.divergence_logits_(z, zt, no_grad[: b - a], *jsd, 1.0)
        ctx.save_for_backward(hs, ws, bs, ht, wt, bt)
        ctx.options, ctx.chunk = options, chunk
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return divergence, entropy

    @staticmethod
    def backward(ctx, g, _dentropy):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g is None or not (need_h or need_w or need_b):
            return (None,) * 8
        hs, ws, bs, ht, wt, bt = ctx.saved_tensors
        options, chunk, n = ctx.options, ctx.chunk, hs.shape[0]
        jsd = options.divergence.op_args()
        (s_scale, s_cap), (t_scale, t_cap) = options.logits("student"), options.logits("teacher")
        g = g.to(torch.float32).contiguous()
        dhs = torch.empty_like(hs) if need_h else None
        acc = _Accumulator(ws, bs if need_b else None) if need_w or need_b else None
        student, teacher = _Logits(hs, ws, bs, chunk), _Logits(ht, wt, bt, chunk)
        common = torch.promote_types(hs.dtype, ht.dtype)
        th = None if s_cap is None else torch.empty_like(student.buf)
        for a, b in _chunks(n, chunk):
            keep = None if th is None else th[: b - a]
            z = _capped_(student(hs[a:b]), s_scale, s_cap, keep).to(common)
            zt = _capped_(teacher(ht[a:b]), t_scale, t_cap).to(common)
            ops.divergence_logits_(z, zt, g[a:b], *jsd, 1.0)  # z now holds dz
            if keep is not None:  # dz/dy = scale (1 - tanh^2)
                z.mul_(keep.square_().neg_().add_(1).mul_(s_scale))
            elif s_scale != 1.0:
                z.mul_(s_scale)
            dlogits = z.to(ws.dtype)
            if dhs is not None:
                torch.mm(dlogits, ws, out=dhs[a:b])
            if acc is not None:
                acc.add(dlogits, hs[a:b])
        student = teacher = z = zt = dlogits = th = keep = None  # the chunk buffers go before dweight is converted
        dws, dbs = acc.results() if acc is not None else (None, None)
        return dhs, dws if need_w else None, dbs if need_b else None, None, None, None, None, None


def fused_linear_jsd_per_token(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    teacher_softcap: float | None = None,
    with_entropy: bool = False,
    chunk_size: int | None = None,
) -> JSDPerToken:
    """fused_linear_jsd per token, without [tokens, V] logits: each token's generalized JSD (beta 0
    forward KL(teacher || student), 1 reverse KL) of the student's and the teacher's softmax over
    `softcap(logit_scale * (hidden @ weight.T + bias)) / temperature` (softcap c: c * tanh(x / c);
    each model its own bias, logit_scale and softcap), and with_entropy the entropy of the
    student's. student_hidden [..., Hs], student_weight [V, Hs], teacher_hidden [..., Ht] (the same
    tokens), teacher_weight [V, Ht], each bias [V] or None. Returns JSDPerToken, float32, the tokens'
    shape each; gradients flow from the divergence to the student (hidden, weight, bias) only, the
    entropy has none. The backward computes both heads' logits again, chunk by chunk."""
    tensors = {
        "student_hidden": student_hidden,
        "student_weight": student_weight,
        "teacher_hidden": teacher_hidden,
        "teacher_weight": teacher_weight,
        "student_bias": student_bias,
        "teacher_bias": teacher_bias,
    }
    for name, t in tensors.items():
        check_dense(name, t, optional=name.endswith("bias"))
    options = spec.fused_linear_jsd_per_token(
        *(facts(t) for t in tensors.values()),
        beta=beta,
        temperature=temperature,
        student_logit_scale=student_logit_scale,
        teacher_logit_scale=teacher_logit_scale,
        student_softcap=student_softcap,
        teacher_softcap=teacher_softcap,
        with_entropy=with_entropy,
        chunk_size=chunk_size,
    )
    check_same_device("student_hidden", student_hidden, **{k: v for k, v in tensors.items() if k != "student_hidden"})
    for name, t in tensors.items():
        if t is not None and is_dtensor(t):
            raise TypeError(
                f"{name}: expected a torch.Tensor (fused_linear_jsd_per_token takes no DTensors; fused_linear_jsd "
                "does), got a DTensor"
            )
    shape = student_hidden.shape[:-1]
    hs = student_hidden.reshape(-1, student_hidden.shape[-1])
    ht = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).detach()
    n = hs.shape[0]
    chunk = chunk_size or chunk_size_for(n, hs.shape[1], student_weight.shape[0])
    divergence, entropy = _FusedLinearJSDPerToken.apply(
        hs,
        student_weight,
        student_bias,
        ht,
        teacher_weight.detach(),
        None if teacher_bias is None else teacher_bias.detach(),
        options,
        chunk,
    )
    return JSDPerToken(divergence.reshape(shape), None if entropy is None else entropy.reshape(shape))
