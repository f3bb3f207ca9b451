"""One rank of tests/torch/test_dtensor.py: fuselet ops on DTensors over a 1-D mesh of 2 CPU
processes (gloo). Every check compares with the same op on the unsharded tensors and counts
the collectives DTensor issued (torch.distributed.tensor.debug.CommDebugMode); rank 0 prints
the results as one JSON line, last.

Run by the test as `python -m tests.torch.dtensor_child` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback

import fuselet.torch as ft
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

WORLD = 2
CHECKS = {}


def check(fn, name=None):
    CHECKS[name or fn.__name__] = fn
    return fn


class Comms:
    """Collectives issued inside `with comms:` as {name: count}, e.g. {"all_reduce": 1}."""

    def __enter__(self):
        self.mode = CommDebugMode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.counts = {
            str(op).split(".")[-1] if "." in str(op) else str(op): n for op, n in self.mode.get_comm_counts().items() if n
        }
        return False


def diff(a, b) -> float:
    a = a.full_tensor() if isinstance(a, DTensor) else a
    b = b.full_tensor() if isinstance(b, DTensor) else b
    return float((a.detach().double() - b.detach().double()).abs().max())


def names(placements) -> list:
    return [str(p) for p in placements]


def leaf(t):
    return t.detach().clone().requires_grad_()


def dleaf(t, mesh, placements):
    """t distributed over mesh, as a leaf that collects its gradient."""
    return distribute_tensor(t.detach().clone(), mesh, placements).requires_grad_()


def forward_backward(fn, args, dargs, grad):
    """{fwd, bwd counts, max_diff over outputs and gradients}: fn on the unsharded args vs on the
    DTensor args (same values); the gradient `grad` of the first output (a DTensor like it)."""
    out_ref = fn(*args)
    out_ref = out_ref if isinstance(out_ref, tuple) else (out_ref,)
    (out_ref[0] * grad).sum().backward()
    with Comms() as fwd:
        out = fn(*dargs)
    out = out if isinstance(out, tuple) else (out,)
    # a reduced loss: scaled by a number (a Partial loss stays Partial); else a DTensor like out[0]
    dgrad = float(grad) if grad.ndim == 0 else distribute_tensor(grad, out[0].device_mesh, out[0].placements)
    with Comms() as bwd:
        (out[0] * dgrad).sum().backward()  # a sum of a sharded DTensor: Partial, no collective
    diffs = [diff(o, r) for o, r in zip(out, out_ref)]
    diffs += [diff(d.grad, a.grad) for a, d in zip(args, dargs) if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = [names(d.grad.placements) for d in dargs if isinstance(d, DTensor) and d.requires_grad]
    return {"fwd": fwd.counts, "bwd": bwd.counts, "max_diff": max(diffs), "out": names(out[0].placements), "grads": grads}


# --- norms: SequenceParallel modules, and a sharded hidden dim --------------------------------


def _norm_module(cls, mesh, **kw):
    torch.manual_seed(1)
    ref = cls(16, **kw)
    for p in ref.parameters():
        p.data.uniform_(0.5, 1.5)
    sp = cls(16, **kw)
    sp.load_state_dict(ref.state_dict())
    x, g = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    xr = leaf(x)
    (ref(xr) * g).sum().backward()
    parallelize_module(sp, mesh, SequenceParallel())  # parameters: Replicate DTensors
    rank = dist.get_rank()
    xl = leaf(x.chunk(WORLD, 1)[rank])  # this rank's sequence shard; SequenceParallel wraps it
    with Comms() as fwd:
        y = sp(xl)
    with Comms() as bwd:
        (y.to_local() * g.chunk(WORLD, 1)[rank]).sum().backward()
    grads = {n: p.grad for n, p in sp.named_parameters()}
    placements = {n: names(t.placements) for n, t in grads.items()}
    with Comms() as reduce:  # what an optimizer step / grad clipping does with them
        full = {n: t.redistribute(placements=[Replicate()]) for n, t in grads.items()}
    diffs = [diff(y, ref(x)), diff(xl.grad, xr.grad.chunk(WORLD, 1)[rank])]
    diffs += [diff(full[n], p.grad) for n, p in ref.named_parameters()]
    return {
        "fwd": fwd.counts,
        "bwd": bwd.counts,
        "reduce": reduce.counts,
        "out": names(y.placements),
        "grads": placements,
        "max_diff": max(diffs),
    }


@check
def rms_norm_sequence_parallel(mesh):
    return _norm_module(ft.RMSNorm, mesh)


@check
def layer_norm_sequence_parallel(mesh):
    return _norm_module(ft.LayerNorm, mesh)


@check
def add_rms_norm_sequence_sharded(mesh):
    torch.manual_seed(2)
    x, res, w, g = torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.rand(16) + 0.5, torch.randn(2, 8, 16)
    args = [leaf(x), leaf(res), leaf(w)]
    dargs = [dleaf(x, mesh, [Shard(1)]), dleaf(res, mesh, [Shard(1)]), dleaf(w, mesh, [Replicate()])]
    return forward_backward(lambda a, b, c: ft.add_rms_norm(a, b, c), args, dargs, g)


@check
def gated_rms_norm_sequence_sharded(mesh):
    """Qwen3-Next's gated norm per head group, x and the gate z sharded on the sequence."""
    torch.manual_seed(4)
    x, z, w, g = torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.rand(16) + 0.5, torch.randn(2, 8, 16)
    args = [leaf(x), leaf(z), leaf(w)]
    dargs = [dleaf(x, mesh, [Shard(1)]), dleaf(z, mesh, [Shard(1)]), dleaf(w, mesh, [Replicate()])]
    return forward_backward(lambda a, b, c: ft.gated_rms_norm(a, b, c, group_size=4), args, dargs, g)


@check
def rms_norm_hidden_sharded(mesh):
    """x sharded on H (the normalized dim): redistributed, same values."""
    torch.manual_seed(3)
    x, w, g = torch.randn(4, 16), torch.rand(16) + 0.5, torch.randn(4, 16)
    return forward_backward(ft.rms_norm, [leaf(x), leaf(w)], [dleaf(x, mesh, [Shard(1)]), dleaf(w, mesh, [Replicate()])], g)


# --- MLP: gate / up Linears colwise, swiglu on the local halves, down Linear rowwise ----------


class MLP(torch.nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, ffn, bias=False)
        self.up = torch.nn.Linear(hidden, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        # Colwise gate and up give each rank the same F/2 columns of both: [gate_r, up_r] is the
        # [gate, up] of this rank's columns, so ft.swiglu pairs them right.
        return self.down(ft.swiglu(torch.cat([self.gate(x), self.up(x)], dim=-1)))


@check
def swiglu_mlp_tensor_parallel(mesh):
    torch.manual_seed(4)
    ref = MLP(16, 32)
    tp = MLP(16, 32)
    tp.load_state_dict(ref.state_dict())
    x, g = torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    xr, xt = leaf(x), leaf(x)
    (ref(xr) * g).sum().backward()
    parallelize_module(tp, mesh, {"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
    with Comms() as fwd:
        y = tp(xt)
    with Comms() as bwd:
        (y * g).sum().backward()
    diffs = [diff(y, ref(x)), diff(xt.grad, xr.grad)]
    diffs += [diff(dict(tp.named_parameters())[n].grad, p.grad) for n, p in ref.named_parameters()]
    return {"fwd": fwd.counts, "bwd": bwd.counts, "max_diff": max(diffs), "out": str(type(y).__name__)}


@check
def swiglu_sequence_sharded(mesh):
    torch.manual_seed(5)
    x, g = torch.randn(2, 8, 32), torch.randn(2, 8, 16)
    return forward_backward(ft.swiglu, [leaf(x)], [dleaf(x, mesh, [Shard(1)])], g)


@check
def geglu_gated_dim_sharded(mesh):
    """x sharded on [gate, up]: redistributed (the halves must pair), same values."""
    torch.manual_seed(6)
    x, g = torch.randn(4, 32), torch.randn(4, 16)
    return forward_backward(lambda t: ft.geglu(t, "tanh"), [leaf(x)], [dleaf(x, mesh, [Shard(1)])], g)


# --- softmax ---------------------------------------------------------------------------------


def _softmax(mesh, placement, causal):
    torch.manual_seed(7)
    x, g = torch.randn(2, 2, 8, 8), torch.randn(2, 2, 8, 8)
    return forward_backward(lambda t: ft.softmax(t, 0.5, causal), [leaf(x)], [dleaf(x, mesh, [placement])], g)


@check
def softmax_batch_sharded(mesh):
    return _softmax(mesh, Shard(0), False)


@check
def softmax_queries_sharded(mesh):
    return _softmax(mesh, Shard(2), False)


@check
def softmax_causal_queries_sharded(mesh):
    """causal: the queries (dim -2) are whole, so Shard(2) is redistributed; same values."""
    return _softmax(mesh, Shard(2), True)


@check
def softmax_keys_sharded(mesh):
    return _softmax(mesh, Shard(3), False)


# --- rope --------------------------------------------------------------------------------------


def _rope(mesh, layout, x_dim, table_placement, tables=(4, 6), **options):
    # S == N: the bshd and bhsd calls have the same shapes and placements, only the layout
    # tells which dim the sequence is (and so whether cos / sin are sharded with it).
    torch.manual_seed(8)
    x, g = torch.randn(2, 4, 4, 8), torch.randn(2, 4, 4, 8)
    cos, sin = torch.randn(*tables), torch.randn(*tables)
    return forward_backward(
        lambda t, c, s: ft.rope(t, c, s, layout=layout, **options),
        [leaf(x), cos, sin],
        [
            dleaf(x, mesh, [Shard(x_dim)]),
            distribute_tensor(cos, mesh, [table_placement]),
            distribute_tensor(sin, mesh, [table_placement]),
        ],
        g,
    )


@check
def rope_sequence_sharded(mesh):
    return _rope(mesh, "bshd", 1, Shard(0))


@check
def rope_sequence_sharded_replicated_tables(mesh):
    """cos / sin replicated, x sequence-sharded: each rank takes its rows of the tables, locally."""
    return _rope(mesh, "bshd", 1, Replicate())


@check
def rope_heads_sharded_bhsd(mesh):
    """bhsd x sharded on dim 1 (heads): the tables stay replicated (same shapes as the bshd case)."""
    return _rope(mesh, "bhsd", 1, Replicate())


@check
def rope_sequence_sharded_bhsd(mesh):
    return _rope(mesh, "bhsd", 2, Shard(0))


@check
def rope_pair_table_sequence_sharded(mesh):
    """A pair table [S, R/2] sharded with the sequence."""
    return _rope(mesh, "bshd", 1, Shard(0), (4, 3), pair_table=True)


@check
def rope_sections_sequence_sharded(mesh):
    """K = 2 section tables [K, S, R/2]: sharded on their S dim (1) with x's sequence, K whole."""
    return _rope(mesh, "bshd", 1, Shard(1), (2, 4, 3), pair_table=True, sections=(2, 1), interleaved_sections=True)


# --- cross-entropy ---------------------------------------------------------------------------


def _ce(mesh, logits_placement, reduction, **kw):
    torch.manual_seed(9)
    logits, target = torch.randn(2, 8, 24), torch.randint(0, 24, (2, 8))
    target[0, :3] = -100  # ignored tokens, all on rank 0's shard
    g = torch.randn(2, 8) if reduction == "none" else torch.tensor(1.5)
    args = [leaf(logits), target]
    dargs = [dleaf(logits, mesh, [logits_placement]), distribute_tensor(target, mesh, [Shard(1)])]
    r = forward_backward(lambda lg, t: ft.cross_entropy(lg, t, reduction=reduction, **kw), args, dargs, g)
    return r


@check
def cross_entropy_sequence_sharded_none(mesh):
    return _ce(mesh, Shard(1), "none", label_smoothing=0.1, z_loss=1e-3)


@check
def cross_entropy_sequence_sharded_sum(mesh):
    return _ce(mesh, Shard(1), "sum", softcap=5.0)


@check
def cross_entropy_sequence_sharded_mean(mesh):
    return _ce(mesh, Shard(1), "mean")


@check
def cross_entropy_inplace_backward(mesh):
    torch.manual_seed(9)
    logits, target = torch.randn(2, 8, 24), torch.randint(0, 24, (2, 8))
    ref = leaf(logits)
    ft.cross_entropy(ref * 1, target, reduction="sum").backward()
    d, dt = dleaf(logits, mesh, [Shard(1)]), distribute_tensor(target, mesh, [Shard(1)])
    with Comms() as fwd:
        loss = ft.cross_entropy(d * 1, dt, reduction="sum", inplace_backward=True)
    with Comms() as bwd:
        loss.backward()
    # The in-place op itself, called on DTensors: logits keeps its placement and takes dlogits.
    torch.manual_seed(11)
    logits2, dloss = torch.randn(2, 8, 24), torch.randn(2, 8)
    _, _, lse = torch.ops.fuselet.cross_entropy_fwd(logits2, target, -100, 0.0, 0.0, 0.0)
    expected = torch.ops.fuselet.cross_entropy_bwd(dloss, logits2, target, lse, -100, 0.0, 0.0, 0.0)
    dl2 = distribute_tensor(logits2, mesh, [Shard(1)])
    dloss_r, lse_s = distribute_tensor(dloss, mesh, [Replicate()]), distribute_tensor(lse, mesh, [Shard(1)])
    try:
        torch.ops.fuselet.cross_entropy_bwd_(dloss_r, dl2.clone(), dt, lse_s, -100, 0.0, 0.0, 0.0)
        op_replicated_dloss = "ran"
    except RuntimeError as e:  # dloss (argument 0) would need a redistribution: DTensor refuses
        op_replicated_dloss = str(e)[:200]
    dloss_s = distribute_tensor(dloss, mesh, [Shard(1)])
    with Comms() as op:
        torch.ops.fuselet.cross_entropy_bwd_(dloss_s, dl2, dt, lse_s, -100, 0.0, 0.0, 0.0)
    return {
        "fwd": fwd.counts,
        "bwd": bwd.counts,
        "max_diff": max(diff(d.grad, ref.grad), diff(dl2, expected)),
        "out": names(loss.placements),
        "op": op.counts,
        "op_placements": names(dl2.placements),
        "op_replicated_dloss": op_replicated_dloss,
    }


@check
def cross_entropy_fwd_bwd(mesh):
    torch.manual_seed(9)
    logits, target = torch.randn(2, 8, 24), torch.randint(0, 24, (2, 8))
    ref = ft.cross_entropy.fwd_bwd(logits.clone(), target, grad_scale=0.25)
    dl, dt = distribute_tensor(logits, mesh, [Shard(1)]), distribute_tensor(target, mesh, [Shard(1)])
    with Comms() as fwd:
        out = ft.cross_entropy.fwd_bwd(dl, dt, grad_scale=0.25)
    try:
        ft.cross_entropy.fwd_bwd(dl.clone(), dt, inplace=True)
        inplace_error = None
    except ValueError as e:
        inplace_error = str(e)
    return {
        "fwd": fwd.counts,
        "max_diff": max(diff(a, b) for a, b in zip(out, ref)),
        "out": names(out[2].placements),
        "inplace_error": inplace_error,
    }


@check
def cross_entropy_vocab_sharded(mesh):
    """logits sharded on V: kept sharded (vocab-parallel), the tokens' target gathered; same values."""
    return _ce(mesh, Shard(2), "none")


# --- fused linear cross-entropy -----------------------------------------------------------------


def _flce(mesh, reduction):
    torch.manual_seed(10)
    hidden, weight, bias = torch.randn(16, 8), torch.randn(24, 8) * 0.3, torch.randn(24) * 0.1
    target = torch.randint(0, 24, (16,))
    target[:3] = -100
    g = torch.randn(16) if reduction == "none" else torch.tensor(0.75)
    args = [leaf(hidden), leaf(weight), leaf(bias), target]
    dargs = [
        dleaf(hidden, mesh, [Shard(0)]),
        dleaf(weight, mesh, [Replicate()]),
        dleaf(bias, mesh, [Replicate()]),
        distribute_tensor(target, mesh, [Shard(0)]),
    ]
    return forward_backward(
        lambda h, w, b, t: ft.fused_linear_cross_entropy(h, w, t, bias=b, reduction=reduction, chunk_size=3), args, dargs, g
    )


@check
def fused_linear_cross_entropy_rows_sharded_sum(mesh):
    return _flce(mesh, "sum")


@check
def fused_linear_cross_entropy_rows_sharded_mean(mesh):
    return _flce(mesh, "mean")


@check
def fused_linear_cross_entropy_rows_sharded_none(mesh):
    return _flce(mesh, "none")


@check
def fused_linear_logprobs_rows_sharded(mesh):
    """The per-token log-probabilities and entropies (both differentiated), the mean logits."""
    torch.manual_seed(11)
    hidden, weight, bias = torch.randn(16, 8), torch.randn(24, 8) * 0.3, torch.randn(24) * 0.1
    target = torch.randint(0, 24, (16,))
    target[:3] = -100
    args = [leaf(hidden), leaf(weight), leaf(bias), target]
    dargs = [
        dleaf(hidden, mesh, [Shard(0)]),
        dleaf(weight, mesh, [Replicate()]),
        dleaf(bias, mesh, [Replicate()]),
        distribute_tensor(target, mesh, [Shard(0)]),
    ]

    def fn(h, w, b, t):
        out = ft.fused_linear_logprobs(h, w, t, bias=b, temperature=0.8, outputs=("entropy", "mean_logits"), chunk_size=3)
        return out.log_probs + 0.5 * out.entropy, out.mean_logits

    return forward_backward(fn, args, dargs, torch.randn(16))


# --- the post-training losses and the divergences: rows (sequences, tokens) sharded ----------


def _loss_case(mesh, fn, tensors, sharded, grads=("hidden", "weight", "bias")):
    """fn(**tensors) against fn on DTensors: the tensors named in `sharded` Shard(0) (their rows:
    sequences or tokens), the others Replicate; those named in `grads` collect gradients."""
    args = [leaf(t) if n in grads else t for n, t in tensors.items()]
    dargs = [
        (dleaf if n in grads else distribute_tensor)(t, mesh, [Shard(0) if n in sharded else Replicate()])
        for n, t in tensors.items()
    ]
    return forward_backward(lambda *a: fn(**dict(zip(tensors, a))), args, dargs, torch.tensor(0.75))


def _sequences(seed=12, **extra):
    """[4, 4, 8] hidden through a [24, 8] head (bias too), target with a prompt and padding."""
    torch.manual_seed(seed)
    target = torch.randint(0, 24, (4, 4))
    target[:, 0] = -100
    target[1, -1] = -100
    tensors = {"hidden": torch.randn(4, 4, 8) * 0.5, "weight": torch.randn(24, 8) * 0.3, "bias": torch.randn(24) * 0.1}
    return {**tensors, "target": target, **extra}


def _reference():
    return {"ref_hidden": torch.randn(4, 4, 6) * 0.5, "ref_weight": torch.randn(24, 6) * 0.3}


def _preference(mesh, loss):
    """Rows sharded: rank 0 holds the 2 chosen sequences, rank 1 the 2 rejected ones."""
    tensors = _sequences(**(_reference() if loss in ("dpo", "hinge", "ipo") else {}))
    fn = lambda **a: ft.fused_linear_preference_loss(loss=loss, label_smoothing=0.1, chunk_size=5, **a)  # noqa: E731
    return _loss_case(mesh, fn, tensors, ("hidden", "target", "ref_hidden"))


for _loss in ("dpo", "hinge", "ipo", "simpo", "cpo", "orpo"):
    check(functools.partial(_preference, loss=_loss), f"preference_{_loss}_rows_sharded")

# DPO's other loss types, summed, with their options (sorting over the pairs: aot, aot_unpaired;
# LD-DPO's split of each pair at its shorter completion: ld_alpha)
DPO_MIXES = {
    "mpo": dict(loss=["aot", "nca_pair", "sft", "sigmoid_norm"], loss_weights=[1.0, 0.5, 0.2, 1.0]),
    "ld_alpha": dict(loss=["aot_unpaired", "apo_down", "bco_pair"], ld_alpha=0.5),
    "f_divergence": dict(loss=["robust", "discopop", "ipo"], f_divergence_type="js_divergence", label_smoothing=0.1),
}


def _dpo_mix(mesh, options):
    tensors = _sequences(**_reference())
    fn = lambda **a: ft.fused_linear_preference_loss(chunk_size=5, **options, **a)  # noqa: E731
    return _loss_case(mesh, fn, tensors, ("hidden", "target", "ref_hidden"))


for _name, _options in DPO_MIXES.items():
    check(functools.partial(_dpo_mix, options=_options), f"preference_{_name}_rows_sharded")


@check
def kto_rows_sharded(mesh):
    tensors = _sequences(**_reference(), preference_labels=torch.tensor([True, False, False, True]))
    fn = lambda **a: ft.fused_linear_kto_loss(kl=torch.tensor(0.1), chunk_size=5, **a)  # noqa: E731
    return _loss_case(mesh, fn, tensors, ("hidden", "target", "ref_hidden", "preference_labels"))


def _grpo(mesh, loss_type):
    old, ref = -torch.rand(4, 4) * 3, -torch.rand(4, 4) * 3
    tensors = _sequences(advantages=torch.tensor([0.5, -1.0, 1.5, 0.25]), old_logps=old, ref_logps=ref)
    fn = lambda **a: ft.fused_linear_grpo_loss(loss_type=loss_type, beta=0.1, chunk_size=5, **a)  # noqa: E731
    return _loss_case(mesh, fn, tensors, ("hidden", "target", "advantages", "old_logps", "ref_logps"))


for _loss in ("grpo", "bnpo", "dr_grpo"):
    check(functools.partial(_grpo, loss_type=_loss), f"grpo_{_loss}_rows_sharded")


def _linear_jsd(mesh, labels):
    torch.manual_seed(13)
    tensors = {
        "student_hidden": torch.randn(4, 4, 8),
        "student_weight": torch.randn(24, 8) * 0.3,
        "teacher_hidden": torch.randn(4, 4, 6),
        "teacher_weight": torch.randn(24, 6) * 0.3,
    }
    if labels:
        tensors["labels"] = torch.randint(0, 24, (4, 4))
        tensors["labels"][0, :3] = -100  # ignored tokens, all on rank 0's rows
    fn = lambda **a: ft.fused_linear_jsd(beta=0.3, temperature=2.0, chunk_size=5, **a)  # noqa: E731
    sharded = ("student_hidden", "teacher_hidden", "labels")
    return _loss_case(mesh, fn, tensors, sharded, grads=("student_hidden", "student_weight"))


check(functools.partial(_linear_jsd, labels=True), "fused_linear_jsd_rows_sharded")
check(functools.partial(_linear_jsd, labels=False), "fused_linear_jsd_rows_sharded_no_labels")


def _divergence(mesh, fn, labels=False, shape=(8, 24)):
    torch.manual_seed(14)
    tensors = {"input": torch.randn(shape).log_softmax(-1), "target": torch.randn(shape).log_softmax(-1)}
    if labels:
        tensors["labels"] = torch.randint(0, 24, shape[:-1])
        tensors["labels"][:3] = -100
    return _loss_case(mesh, fn, tensors, ("input", "target", "labels"), grads=("input", "target"))


@check
def kl_div_rows_sharded_batchmean(mesh):
    return _divergence(mesh, lambda **a: ft.kl_div(log_target=True, **a))


@check
def kl_div_rows_sharded_mean(mesh):
    return _divergence(mesh, lambda **a: ft.kl_div(reduction="mean", **a), shape=(4, 2, 24))


@check
def kl_div_rows_sharded_none(mesh):
    return _divergence(mesh, lambda **a: ft.kl_div(reduction="none", log_target=True, **a))


@check
def jsd_rows_sharded(mesh):
    return _divergence(mesh, lambda **a: ft.jsd(beta=0.3, **a), labels=True)


@check
def tvd_rows_sharded(mesh):
    return _divergence(mesh, lambda **a: ft.tvd(**a), labels=True, shape=(4, 2, 24))


@check
def losses_refuse_mixed_tensors(mesh):
    """A torch.Tensor beside DTensors: refused, naming it (fused_linear_jsd would otherwise take
    it as this rank's share)."""
    t = _sequences()
    hidden, target = (distribute_tensor(t[n], mesh, [Shard(0)]) for n in ("hidden", "target"))
    weight = distribute_tensor(t["weight"], mesh, [Replicate()])
    calls = {
        "preference": lambda: ft.fused_linear_preference_loss(hidden, weight, t["target"]),
        "kto": lambda: ft.fused_linear_kto_loss(hidden, weight, target, torch.tensor([True, False, False, True])),
        "grpo": lambda: ft.fused_linear_grpo_loss(hidden, weight, target, torch.ones(4)),
        "jsd": lambda: ft.fused_linear_jsd(hidden, t["weight"], hidden, weight),
        "jsd_per_token": lambda: ft.fused_linear_jsd_per_token(hidden, weight, hidden, weight),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
            errors[name] = "ran"
        except TypeError as e:
            errors[name] = str(e)
    return {"max_diff": 0.0, "errors": errors}


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (WORLD,))
    results = {}
    for name, fn in CHECKS.items():
        try:
            results[name] = fn(mesh)
        except Exception:  # reported per check; the test fails on it with the traceback
            results[name] = {"error": traceback.format_exc()[-3000:]}
        dist.barrier()
    if dist.get_rank() == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    assert int(os.environ["WORLD_SIZE"]) == WORLD
    main()
    # Leave without the interpreter's exit-time destructors: torch's gloo teardown there may
    # abort a rank ("terminate called without an active exception", seen 1 run in 4 under torch
    # 2.13) after its results are out. Every check above has run and reported by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
