"""One rank of tests/torch/test_vocab_parallel_logprobs.py: vocab-parallel fused_linear_logprobs
and fused_linear_grpo_loss with its entropies over WORLD_SIZE CPU processes (gloo), the head's
rows sharded over the ranks, through the process_group door and the DTensor door.

Every check runs the same call on one process over the whole head (on every rank alike) and
compares every output (log_probs, entropy, log_sum_sq_probs, mean_logits; is_top1 exactly) and
every gradient (hidden, this rank's rows of weight and bias) under an upstream gradient through
log_probs and entropy: the max over the tensors and the ranks of max|a - b| / max|b|. Rank 0
prints the results as one JSON line, last.

Run by the test as `python -m tests.torch.vocab_parallel_logprobs_child` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (VP_ONLY=<substring>: only the checks whose name has it).
"""

from __future__ import annotations

import fuselet.torch as ft
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from tests.torch.vocab_parallel_common import (
    counts,
    error_of,
    four_ranks,
    leaf,
    mesh_placements,
    my_share,
    rank_world,
    registry,
    rel,
    run_child,
    sizes_for,
)

CHECKS, check = registry()
N, H, V = 13, 8, 23  # 13 tokens in chunks of 5: a short last chunk; V = 23: uneven over 2 and 4
OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
VALUES = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits")
HEAD = ("weight", "bias")  # the rows sharded over the ranks
OPTIONS = {
    "plain": {},
    "scaled": {"temperature": 0.7, "logit_scale": 1.3},
    "softcap": {"softcap": 2.0, "temperature": 1.5},
    "ignore_index_in_range": {"ignore_index": 5},
    "log_probs_only": {"outputs": ()},
    "entropy_only": {"outputs": ("entropy",)},
    "stats_only": {"outputs": ("is_top1",)},
}


def data(vocab=V, ignore_index=-100, seed=31):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, vocab, (N,), generator=g)
    target[:2] = ignore_index
    return {
        "hidden": torch.randn(N, H, generator=g),
        "weight": torch.randn(vocab, H, generator=g) * 0.8,
        "bias": torch.randn(vocab, generator=g) * 0.1,
        "target": target,
        "dlogp": torch.randn(N, generator=g),
        "dentropy": torch.randn(N, generator=g),
    }


def _call(tensors, with_bias=True, entropy_grad=True, **kw):
    """(outputs, hidden's, weight's and bias' gradients) of fused_linear_logprobs under the upstream
    dlogp (and dentropy where the entropy is asked for and entropy_grad)."""
    kw = {"outputs": OUTPUTS, **kw}
    h, w, b = leaf(tensors["hidden"]), leaf(tensors["weight"]), leaf(tensors["bias"])
    out = ft.fused_linear_logprobs(h, w, tensors["target"], bias=b if with_bias else None, chunk_size=5, **kw)
    dlogp, dentropy = tensors["dlogp"], tensors["dentropy"]
    if isinstance(out.log_probs, DTensor):
        dlogp, dentropy = (distribute_tensor(g, out.log_probs.device_mesh, out.log_probs.placements) for g in (dlogp, dentropy))
    loss = (out.log_probs * dlogp).sum()
    if out.entropy is not None and entropy_grad:
        loss = loss + (out.entropy * dentropy).sum()
    loss.backward()
    return out, h, w, b


def _compare(ours, ref, rows, with_bias=True) -> dict:
    """The largest relative difference of the outputs and gradients; is_top1 equal (and how many
    tokens have it, in the reference)."""
    out, h, w, b = ours
    rout, rh, rw, rb = ref
    errors = [rel(getattr(out, n), getattr(rout, n)) for n in VALUES if getattr(rout, n) is not None]
    errors += [rel(h.grad, rh.grad), rel(w.grad, rw.grad[rows] if rows is not None else rw.grad)]
    if with_bias:
        errors.append(rel(b.grad, rb.grad[rows] if rows is not None else rb.grad))
    result = {"max_rel": max(errors)}
    if rout.is_top1 is not None:
        top1 = out.is_top1.full_tensor() if isinstance(out.is_top1, DTensor) else out.is_top1
        result["top1_equal"] = bool(torch.equal(top1, rout.is_top1))
        result["top1_count"] = int(rout.is_top1.sum())
    given = [n for n in ("log_probs", *OUTPUTS) if getattr(out, n) is not None]
    result["outputs"] = given
    return result


def plain(options, even=False, with_bias=True, vocab=V, tensors=None, entropy_grad=True):
    """The process_group door: this rank's rows of the head (sizes that differ per rank)."""
    kw = OPTIONS[options]
    tensors = tensors or data(vocab, kw.get("ignore_index", -100))
    ref = _call(tensors, with_bias, entropy_grad, **kw)
    sizes = sizes_for(vocab, even)
    mine, rows = my_share(tensors, sizes, HEAD)
    ours = _call(mine, with_bias, entropy_grad, process_group=dist.group.WORLD, **kw)
    return {**_compare(ours, ref, rows, with_bias), "sizes": sizes}


for _o in OPTIONS:
    check(f"plain_{_o}")(lambda o=_o: plain(o))
check("plain_even")(lambda: plain("softcap", even=True, vocab=24))
check("plain_no_bias")(lambda: plain("scaled", with_bias=False))
check("plain_log_probs_grad_only")(lambda: plain("plain", entropy_grad=False))
check("plain_wide")(lambda: plain("softcap", vocab=230))  # 230 classes: each rank's backward by blocks


@check("plain_top1_ties")
def plain_top1_ties():
    """Equal largest logits on two ranks (rows 3 and 20 of the head alike and dominant) and on one
    (rows 3 and 5), the target any of them or another class: is_top1 is True for class 3 alone
    (ties go to the lowest index), as on one process, the comparison crossing the ranks. Small
    integers everywhere, so that every rank's matmul gives the one process's logits exactly."""
    g = torch.Generator().manual_seed(5)
    tensors = data()
    hidden = torch.randint(-2, 3, (N, H), generator=g).float()
    weight = torch.randint(-2, 3, (V, H), generator=g).float()
    weight[20] = weight[5] = weight[3]
    weight[:, 0] = 0.0
    weight[[3, 5, 20], 0] = 100.0
    hidden[2:, 0] = 1.0
    tensors.update(hidden=hidden, weight=weight, bias=torch.zeros(V))
    tensors["target"][2:] = torch.tensor([3, 20, 5, 20, 7, 3, 20, 0, 22, 3, 5])
    return plain("plain", tensors=tensors)


def _dtensor_case(vocab, mesh_shape=None, hidden_sharded=False, options="softcap"):
    """The head (weight, bias) Shard(0) over the mesh's last dim, the tokens replicated there
    (Shard(0) over the first dim of a 2-D mesh; or over the last itself: sequence parallel)."""
    _, world = rank_world()
    kw = OPTIONS[options]
    tensors = data(vocab)
    if mesh_shape or hidden_sharded:  # splits of the tokens: 12 of them
        tensors = {n: t if n in HEAD else t[:12] for n, t in tensors.items()}
    ref = _call(tensors, **kw)
    mesh = init_device_mesh("cpu", mesh_shape or (world,))
    rows, head = mesh_placements(mesh, hidden_sharded)
    dts = {n: distribute_tensor(t, mesh, head if n in HEAD else rows) for n, t in tensors.items()}
    with CommDebugMode() as fwd:
        h, w, b = leaf(dts["hidden"]), leaf(dts["weight"]), leaf(dts["bias"])
        out = ft.fused_linear_logprobs(h, w, dts["target"], bias=b, outputs=OUTPUTS, chunk_size=5, **kw)
    with CommDebugMode() as bwd:
        ((out.log_probs * dts["dlogp"]).sum() + (out.entropy * dts["dentropy"]).sum()).backward()
    result = _compare((out, h, w, b), ref, None)
    return {
        **result,
        "grads": [str(p) for p in (*h.grad.placements, *w.grad.placements)],
        "out": [str(p) for p in out.log_probs.placements],
        "fwd": counts(fwd),
        "bwd": counts(bwd),
    }


for _v in (24, 23, 5):  # even, uneven, uneven with an empty last shard at 4 ranks
    check(f"dtensor_v{_v}")(lambda v=_v: _dtensor_case(v))
check("dtensor_hidden_sharded")(lambda: _dtensor_case(23, hidden_sharded=True))


@check("dtensor_2d_mesh")
@four_ranks
def dtensor_2d_mesh():
    return _dtensor_case(23, mesh_shape=(2, 2))


# --- GRPO with the entropies ---------------------------------------------------------------------

GRPO_OPTIONS = {
    "entropy_coef": {"entropy_coef": 0.05},
    "top_entropy_quantile": {"top_entropy_quantile": 0.4},
    "both": {"entropy_coef": 0.1, "top_entropy_quantile": 0.6, "temperature": 0.8, "beta": 0.1},
    "return_per_token": {"return_per_token": True, "temperature": 1.2},
}


def grpo_data(seed=41):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, V, (4, 4), generator=g)
    target[:, 0] = -100
    target[1, -1] = -100
    return {
        "hidden": torch.randn(4, 4, H, generator=g) * 0.7,
        "weight": torch.randn(V, H, generator=g) * 0.5,
        "bias": torch.randn(V, generator=g) * 0.1,
        "target": target,
        "advantages": torch.tensor([0.5, -1.0, 1.5, 0.25]),
        "old_logps": -torch.rand(4, 4, generator=g) * 3,
        "ref_logps": -torch.rand(4, 4, generator=g) * 3,
    }


def _grpo(tensors, **kw):
    """(loss, per-token LogProbs or None, and the leaves hidden, weight, bias) of the GRPO loss * 0.75."""
    grads = ("hidden", "weight", "bias")
    args = {n: leaf(t) if n in grads else t for n, t in tensors.items()}
    out = ft.fused_linear_grpo_loss(chunk_size=5, **args, **kw)
    loss, per_token = out if isinstance(out, tuple) else (out, None)
    (loss * 0.75).backward()
    return loss, per_token, [args[n] for n in grads]


def _grpo_errors(ours, ref, rows) -> list:
    loss, per_token, leaves = ours
    rloss, rper, rleaves = ref
    errors = [rel(loss, rloss)]
    for x, y, name in zip(leaves, rleaves, ("hidden", "weight", "bias")):
        errors.append(rel(x.grad, y.grad[rows] if rows is not None and name != "hidden" else y.grad))
    if rper is not None:
        errors += [rel(per_token.log_probs, rper.log_probs), rel(per_token.entropy, rper.entropy)]
    return errors


def grpo_plain(options):
    """fused_linear_grpo_loss with process_group: this rank's rows of the head and its bias."""
    kw = GRPO_OPTIONS[options]
    tensors = grpo_data()
    ref = _grpo(tensors, **kw)
    sizes = sizes_for(V, even=False)
    mine, rows = my_share(tensors, sizes, HEAD)
    ours = _grpo(mine, process_group=dist.group.WORLD, **kw)
    return {"max_rel": max(_grpo_errors(ours, ref, rows)), "sizes": sizes, "loss": float(ref[0].detach())}


def grpo_dtensor(options):
    """fused_linear_grpo_loss over a head Shard(0) (everything else replicated): its entropies
    from the vocab-parallel fused_linear_logprobs, no gathered head."""
    _, world = rank_world()
    kw = GRPO_OPTIONS[options]
    tensors = grpo_data()
    ref = _grpo(tensors, **kw)
    mesh = init_device_mesh("cpu", (world,))
    dts = {n: distribute_tensor(t, mesh, [Shard(0) if n in HEAD else Replicate()]) for n, t in tensors.items()}
    with CommDebugMode() as comms:  # the forward and the backward
        ours = _grpo(dts, **kw)
    return {
        "max_rel": max(_grpo_errors(ours, ref, None)),
        "fwd_bwd": counts(comms),
        "grads": [str(x.grad.placements[0]) for x in ours[2]],
    }


for _o in GRPO_OPTIONS:
    check(f"grpo_plain_{_o}")(lambda o=_o: grpo_plain(o))
    check(f"grpo_dtensor_{_o}")(lambda o=_o: grpo_dtensor(o))


@check("bfloat16")
def bfloat16():
    """bfloat16 hidden / head through the process_group door and on one process, each against
    float32 on the same (bfloat16-rounded) values."""
    tensors = data()
    low = {n: t.to(torch.bfloat16) if n in ("hidden", "weight", "bias") else t for n, t in tensors.items()}
    truth = _call({n: t.float() if t.is_floating_point() else t for n, t in low.items()})
    one = _call(low)
    sizes = sizes_for(V, even=False)
    mine, rows = my_share(low, sizes, HEAD)
    ours = _call(mine, process_group=dist.group.WORLD)

    tout, th, tw, tb = truth

    def errors(out, dh, dw, db):
        values = [rel(getattr(out, n), getattr(tout, n)) for n in VALUES]
        return values + [rel(dh, th.grad), rel(dw, tw.grad[rows]), rel(db, tb.grad[rows])]

    one_errors = errors(one[0], one[1].grad, one[2].grad[rows], one[3].grad[rows])
    ours_errors = errors(ours[0], *(t.grad for t in ours[1:]))
    return {
        "max_rel": 0.0,
        "bf16_rel": max(ours_errors),
        "one_process": one_errors,
        "vocab_parallel": ours_errors,
        "dtypes": [str(t.grad.dtype) for t in ours[1:]],
    }


@check("refusals")
def refusals():
    rank, world = rank_world()
    tensors = data(8 * world)
    h, w, t = tensors["hidden"], tensors["weight"][:8], tensors["target"]
    group = dist.group.WORLD
    flp = ft.fused_linear_logprobs
    mesh = init_device_mesh("cpu", (world,))
    errors = {
        "outputs": error_of(lambda: flp(h, w, t, outputs=("entropy",) if rank else (), process_group=group)),
        "temperature": error_of(lambda: flp(h, w, t, temperature=1.0 + rank, process_group=group)),
        "tokens": error_of(lambda: flp(h[: N - (rank == 0)], w, t[: N - (rank == 0)], process_group=group)),
        "target_range": error_of(lambda: flp(h, w, torch.full((N,), 8 * world), process_group=group)),
        "group_type": error_of(lambda: flp(h, w, t, process_group="tp")),
        "dtensor_and_group": error_of(
            lambda: flp(
                distribute_tensor(h, mesh, [Replicate()]),
                distribute_tensor(tensors["weight"], mesh, [Shard(0)]),
                distribute_tensor(t, mesh, [Replicate()]),
                process_group=group,
            )
        ),
    }
    return {"max_rel": 0.0, "errors": errors}


@check("no_tokens")
def no_tokens():
    """0 tokens on every rank: empty outputs, no collective of 0 rows, empty / zero gradients."""
    rank, _ = rank_world()
    h, w = torch.zeros(0, H, requires_grad=True), torch.randn(4 + rank, H, requires_grad=True)
    out = ft.fused_linear_logprobs(h, w, torch.zeros(0, dtype=torch.long), outputs=OUTPUTS, process_group=dist.group.WORLD)
    (out.log_probs.sum() + out.entropy.sum()).backward()
    shapes = [list(getattr(out, n).shape) for n in ("log_probs", *OUTPUTS)]
    return {"max_rel": 0.0, "shapes": shapes, "grads": [list(h.grad.shape), float(w.grad.abs().sum())]}


if __name__ == "__main__":
    run_child(CHECKS)
