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

import torch

from fuselet.spec import fused_linear_jsd as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for
from fuselet.torch import _vocab_parallel_jsd as vpj
from fuselet.torch._args import check_dense, check_same_device, facts
from fuselet.torch._dtensor import check_dtensors, is_dtensor, on_row_shards
from fuselet.torch.fused_linear_cross_entropy import _Accumulator, _Logits

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
    """fused_linear_jsd as a module: forward(student_hidden, student_weight, teacher_hidden,
    teacher_weight, labels=None)."""

    def __init__(self, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = -100, chunk_size: int | None = None):
        super().__init__()
        self.beta, self.temperature, self.ignore_index, self.chunk_size = beta, temperature, ignore_index, chunk_size

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
        )
