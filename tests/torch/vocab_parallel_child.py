"""One rank of tests/torch/test_vocab_parallel.py: vocab-parallel cross_entropy and
fused_linear_cross_entropy over WORLD_SIZE CPU processes (gloo), the head's rows (the logits'
classes) sharded over the ranks, through the process_group door and the DTensor door.

Every check runs the same loss on one process over the whole head (fuselet's own, on every rank
alike) and compares the loss and the gradients (hidden, this rank's rows of weight and bias, or
this rank's columns of the logits): the max over the tensors and the ranks of max|a - b| /
max|b|. Rank 0 prints the results as one JSON line, last (tests/torch/vocab_parallel_common.py).

Run by the test as `python -m tests.torch.vocab_parallel_child` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set.
"""

from __future__ import annotations

import fuselet.torch as ft
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from tests.torch.vocab_parallel_common import (
    counts,
    error_of,
    four_ranks,
    leaf,
    mesh_placements,
    my_rows,
    my_share,
    rank_world,
    registry,
    rel,
    run_child,
    sizes_for,
)

CHECKS, check = registry()
N, H = 13, 8  # 13 tokens in chunks of 5: a short last chunk
OPTIONS = {
    "plain": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 3.0},
    "ignore_index_in_range": {"ignore_index": 5},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 2.0},
}


def data(vocab: int, ignore_index=-100, seed=3):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g)
    weight = torch.randn(vocab, H, generator=g) * 0.5
    bias = torch.randn(vocab, generator=g) * 0.1
    target = torch.randint(0, vocab, (N,), generator=g)
    target[:2] = -100 if ignore_index == -100 else ignore_index  # ignored tokens
    grad = torch.randn(N, generator=g)
    return hidden, weight, bias, target, grad


def upstream(out, grad):
    """The gradient fed to a loss: grad for a per-token loss, 0.75 for a reduced one."""
    return (out * grad).sum() if out.ndim else out * 0.75


def _flce_reference(hidden, weight, bias, target, grad, reduction, with_bias, **kw):
    h, w, b = leaf(hidden), leaf(weight), leaf(bias)
    out = ft.fused_linear_cross_entropy(h, w, target, bias=b if with_bias else None, reduction=reduction, chunk_size=5, **kw)
    upstream(out, grad).backward()
    return out, h.grad, w.grad, b.grad


def flce_plain(reduction, options, even=False, with_bias=True, vocab=23):
    kw = OPTIONS[options]
    hidden, weight, bias, target, grad = data(vocab, kw.get("ignore_index", -100))
    ref, dh, dw, db = _flce_reference(hidden, weight, bias, target, grad, reduction, with_bias, **kw)
    sizes = sizes_for(vocab, even)
    rows = my_rows(sizes)
    h, w, b = leaf(hidden), leaf(weight[rows]), leaf(bias[rows])
    out = ft.fused_linear_cross_entropy(
        h, w, target, bias=b if with_bias else None, reduction=reduction, chunk_size=5, process_group=dist.group.WORLD, **kw
    )
    upstream(out, grad).backward()
    errors = [rel(out, ref), rel(h.grad, dh), rel(w.grad, dw[rows])]
    if with_bias:
        errors.append(rel(b.grad, db[rows]))
    return {"max_rel": max(errors), "sizes": sizes}


def flce_dtensor(reduction, vocab, options="all", mesh_shape=None, hidden_sharded=False):
    """weight / bias Shard(0) over the tensor-parallel mesh dim (the last), hidden / target
    replicated there (and, on a 2-D mesh, Shard(0) over the first: data parallel)."""
    _, world = rank_world()
    kw = OPTIONS[options]
    hidden, weight, bias, target, grad = data(vocab, kw.get("ignore_index", -100))
    ref, dh, dw, db = _flce_reference(hidden, weight, bias, target, grad, reduction, True, **kw)
    mesh = init_device_mesh("cpu", mesh_shape or (world,))
    rows, head = mesh_placements(mesh, hidden_sharded)
    if mesh.ndim == 2 or hidden_sharded:  # splits of the tokens: take 12 of them
        hidden, target, grad = hidden[:12], target[:12], grad[:12]
        ref, dh, dw, db = _flce_reference(hidden, weight, bias, target, grad, reduction, True, **kw)
    h = distribute_tensor(hidden, mesh, rows).requires_grad_()
    w = distribute_tensor(weight, mesh, head).requires_grad_()
    b = distribute_tensor(bias, mesh, head).requires_grad_()
    t = distribute_tensor(target, mesh, rows)
    with CommDebugMode() as fwd:
        out = ft.fused_linear_cross_entropy(h, w, t, bias=b, reduction=reduction, chunk_size=5, **kw)
    g = distribute_tensor(grad, mesh, out.placements) if out.ndim else None
    with CommDebugMode() as bwd:
        upstream(out, g).backward()
    errors = [rel(out, ref), rel(h.grad, dh), rel(w.grad, dw), rel(b.grad, db)]
    return {
        "max_rel": max(errors),
        "local_rows": w.to_local().shape[0],
        "grads": [str(p) for p in (*h.grad.placements, *w.grad.placements)],
        "fwd": counts(fwd),
        "bwd": counts(bwd),
    }


def ce_plain(reduction, options, even=False, vocab=23):
    kw = OPTIONS[options]
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5, vocab, generator=g) * 2
    target = torch.randint(0, vocab, (3, 5), generator=g)
    target[0, :2] = kw.get("ignore_index", -100)
    grad = torch.randn(3, 5, generator=g)
    ref_in = leaf(logits)
    ref = ft.cross_entropy(ref_in, target, reduction=reduction, **kw)
    upstream(ref, grad).backward()
    sizes = sizes_for(vocab, even)
    cols = my_rows(sizes)
    x = leaf(logits[..., cols])
    out = ft.cross_entropy(x, target, reduction=reduction, process_group=dist.group.WORLD, **kw)
    upstream(out, grad).backward()
    return {"max_rel": max(rel(out, ref), rel(x.grad, ref_in.grad[..., cols])), "sizes": sizes}


def ce_dtensor(reduction, vocab, target_placement):
    _, world = rank_world()
    kw = OPTIONS["all"]
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 8, vocab, generator=g) * 2
    target = torch.randint(0, vocab, (2, 8), generator=g)
    target[0, :3] = -100
    grad = torch.randn(2, 8, generator=g)
    ref_in = leaf(logits)
    ref = ft.cross_entropy(ref_in, target, reduction=reduction, **kw)
    upstream(ref, grad).backward()
    mesh = init_device_mesh("cpu", (world,))
    x = distribute_tensor(logits, mesh, [Shard(2)]).requires_grad_()
    t = distribute_tensor(target, mesh, [target_placement])
    with CommDebugMode() as fwd:
        out = ft.cross_entropy(x, t, reduction=reduction, **kw)
    gd = distribute_tensor(grad, mesh, out.placements) if out.ndim else None
    with CommDebugMode() as bwd:
        upstream(out, gd).backward()
    return {
        "max_rel": max(rel(out, ref), rel(x.grad, ref_in.grad)),
        "grads": [str(p) for p in x.grad.placements],
        "out": [str(p) for p in out.placements],
        "fwd": counts(fwd),
        "bwd": counts(bwd),
    }


for reduction in ("mean", "sum", "none"):
    for options in OPTIONS:
        check(f"flce_plain_{reduction}_{options}")(lambda r=reduction, o=options: flce_plain(r, o))
        check(f"ce_plain_{reduction}_{options}")(lambda r=reduction, o=options: ce_plain(r, o))
    check(f"flce_plain_{reduction}_even")(lambda r=reduction: flce_plain(r, "all", even=True, vocab=24))
    check(f"flce_plain_{reduction}_no_bias")(lambda r=reduction: flce_plain(r, "all", with_bias=False))
    check(f"ce_plain_{reduction}_even")(lambda r=reduction: ce_plain(r, "all", even=True, vocab=24))
    for vocab in (24, 23, 5):  # even, uneven, uneven with an empty last shard at 4 ranks
        check(f"flce_dtensor_{reduction}_v{vocab}")(lambda r=reduction, v=vocab: flce_dtensor(r, v))
        check(f"ce_dtensor_{reduction}_v{vocab}")(lambda r=reduction, v=vocab: ce_dtensor(r, v, Replicate()))
    check(f"flce_dtensor_{reduction}_hidden_sharded")(lambda r=reduction: flce_dtensor(r, 23, hidden_sharded=True))
    check(f"ce_dtensor_{reduction}_target_sharded")(lambda r=reduction: ce_dtensor(r, 23, Shard(1)))
# 230 classes beside 13 tokens: every rank's backward by blocks of its classes (a reduced loss's
# gradients too, made in its forward after the per-token pass)
for reduction in ("mean", "sum", "none"):
    check(f"flce_plain_{reduction}_wide")(lambda r=reduction: flce_plain(r, "all", vocab=230))


@four_ranks
def ce_dtensor_2d(reduction):
    """logits [4, 8, V] (Shard(0) over dp, Shard(2) over tp) on a 2 x 2 mesh: the batch stays
    split over dp, the classes over tp."""
    kw = OPTIONS["all"]
    g = torch.Generator().manual_seed(7)
    logits, target = torch.randn(4, 8, 23, generator=g) * 2, torch.randint(0, 23, (4, 8), generator=g)
    target[0, :3] = -100
    grad = torch.randn(4, 8, generator=g)
    ref_in = leaf(logits)
    ref = ft.cross_entropy(ref_in, target, reduction=reduction, **kw)
    upstream(ref, grad).backward()
    mesh = init_device_mesh("cpu", (2, 2))
    x = distribute_tensor(logits, mesh, [Shard(0), Shard(2)]).requires_grad_()
    t = distribute_tensor(target, mesh, [Shard(0), Replicate()])
    with CommDebugMode() as fwd:
        out = ft.cross_entropy(x, t, reduction=reduction, **kw)
    gd = distribute_tensor(grad, mesh, out.placements) if out.ndim else None
    upstream(out, gd).backward()
    return {
        "max_rel": max(rel(out, ref), rel(x.grad, ref_in.grad)),
        "out": [str(p) for p in out.placements],
        "grads": [str(p) for p in x.grad.placements],
        "fwd": counts(fwd),
    }


for reduction in ("mean", "sum", "none"):
    check(f"ce_dtensor_{reduction}_2d_mesh")(lambda r=reduction: ce_dtensor_2d(r))


@four_ranks
def _mesh_2d(reduction):
    return flce_dtensor(reduction, 23, mesh_shape=(2, 2))


for reduction in ("mean", "sum", "none"):
    check(f"flce_dtensor_{reduction}_2d_mesh")(lambda r=reduction: _mesh_2d(r))


POST_GRADS, POST_HEADS = ("hidden", "weight", "bias"), ("weight", "bias", "ref_weight")


def post_training_case(loss, **grpo_kw):
    """A post-training loss's inputs (a head of 23 rows and its bias; the reference model's hidden
    and head for DPO and KTO; 16 tokens, some ignored), the loss as a function of them (grpo_kw:
    GRPO's further options), and its one-process result, (loss * 0.75) backpropagated to the
    leaves POST_GRADS of args: (tensors, fn, args, ref)."""
    g = torch.Generator().manual_seed(12)
    vocab = 23
    target = torch.randint(0, vocab, (4, 4), generator=g)
    target[:, 0] = -100
    target[1, -1] = -100
    tensors = {
        "hidden": torch.randn(4, 4, 8, generator=g) * 0.5,
        "weight": torch.randn(vocab, 8, generator=g) * 0.3,
        "bias": torch.randn(vocab, generator=g) * 0.1,
        "target": target,
    }
    if loss in ("dpo", "kto"):
        tensors["ref_hidden"] = torch.randn(4, 4, 6, generator=g) * 0.5
        tensors["ref_weight"] = torch.randn(vocab, 6, generator=g) * 0.3
    if loss == "kto":
        tensors["preference_labels"] = torch.tensor([True, False, False, True])
        fn = lambda **a: ft.fused_linear_kto_loss(kl=torch.tensor(0.1), chunk_size=5, **a)  # noqa: E731
    elif loss == "grpo":
        tensors["advantages"] = torch.tensor([0.5, -1.0, 1.5, 0.25])
        tensors["old_logps"] = -torch.rand(4, 4, generator=g) * 3
        tensors["ref_logps"] = -torch.rand(4, 4, generator=g) * 3
        fn = lambda **a: ft.fused_linear_grpo_loss(beta=0.1, chunk_size=5, **grpo_kw, **a)  # noqa: E731
    else:
        fn = lambda **a: ft.fused_linear_preference_loss(loss=loss, label_smoothing=0.1, chunk_size=5, **a)  # noqa: E731
    args = {n: leaf(t) if n in POST_GRADS else t for n, t in tensors.items()}
    ref = fn(**args)
    (ref * 0.75).backward()
    return tensors, fn, args, ref


def post_training(loss):
    """The post-training losses over a vocab-sharded head (weight, bias and the reference model's
    weight Shard(0), everything else replicated): their per-token log-probabilities are
    fused_linear_cross_entropy's, so they run vocab-parallel with no gathered head."""
    _, world = rank_world()
    mesh = init_device_mesh("cpu", (world,))
    tensors, fn, args, ref = post_training_case(loss)
    dargs = {}
    for n, t in tensors.items():
        d = distribute_tensor(t, mesh, [Shard(0) if n in POST_HEADS else Replicate()])
        dargs[n] = d.requires_grad_() if n in POST_GRADS else d
    with CommDebugMode() as fwd:
        out = fn(**dargs)
    (out * 0.75).backward()
    errors = [rel(out, ref)] + [rel(dargs[n].grad, args[n].grad) for n in POST_GRADS]
    return {"max_rel": max(errors), "fwd": counts(fwd), "grads": [str(dargs[n].grad.placements[0]) for n in POST_GRADS]}


for _loss in ("dpo", "orpo", "simpo", "kto", "grpo"):
    check(f"post_training_{_loss}_head_sharded")(lambda loss=_loss: post_training(loss))


@check("no_tokens")
def no_tokens():
    """0 tokens on every rank: the one-process results (0, or empty), gradients included."""
    rank, _ = rank_world()
    out = {}
    for reduction in ("mean", "sum", "none"):
        h, w = torch.zeros(0, H, requires_grad=True), torch.randn(4 + rank, H, requires_grad=True)
        t = torch.zeros(0, dtype=torch.long)
        loss = ft.fused_linear_cross_entropy(h, w, t, reduction=reduction, process_group=dist.group.WORLD)
        loss.sum().backward()
        x = torch.randn(0, 4 + rank, requires_grad=True)
        ce = ft.cross_entropy(x, t, reduction=reduction, process_group=dist.group.WORLD)
        ce.sum().backward()
        out[reduction] = [float(loss.sum()), float(ce.sum()), list(h.grad.shape), float(w.grad.abs().sum()), list(x.grad.shape)]
    return {"max_rel": 0.0, "results": out}


@check("refusals")
def refusals():
    rank, world = rank_world()
    hidden, weight, bias, target, _ = data(8 * world)
    w = weight[:8].clone()
    group = dist.group.WORLD
    flce = ft.fused_linear_cross_entropy
    mesh = init_device_mesh("cpu", (world,))
    errors = {
        # rank 0 has one token fewer than the others
        "hidden_shape": error_of(lambda: flce(hidden[: N - (rank == 0)], w, target[: N - (rank == 0)], process_group=group)),
        "label_smoothing": error_of(lambda: flce(hidden, w, target, label_smoothing=0.1 * rank, process_group=group)),
        "ce_logits_rows": error_of(
            lambda: ft.cross_entropy(torch.randn(4 + rank, 3), torch.zeros(4 + rank, dtype=torch.long), process_group=group)
        ),
        "target_range": error_of(lambda: flce(hidden, w, torch.full((N,), 8 * world), process_group=group)),
        "group_type": error_of(lambda: flce(hidden, w, target, process_group="tp")),
        "dtensor_and_group": error_of(
            lambda: flce(
                distribute_tensor(hidden, mesh, [Replicate()]),
                distribute_tensor(weight, mesh, [Shard(0)]),
                distribute_tensor(target, mesh, [Replicate()]),
                process_group=group,
            )
        ),
        "mixed": error_of(lambda: flce(hidden, distribute_tensor(weight, mesh, [Shard(0)]), target)),
    }
    if world == 4:  # a 2 x 2 mesh: the head (the logits' classes) split over both dims
        mesh2 = init_device_mesh("cpu", (2, 2))
        errors["weight_two_dims"] = error_of(
            lambda: flce(
                distribute_tensor(hidden, mesh2, [Replicate(), Replicate()]),
                distribute_tensor(weight, mesh2, [Shard(0), Shard(0)]),
                distribute_tensor(target, mesh2, [Replicate(), Replicate()]),
            )
        )
        logits = torch.randn(N, 8 * world)
        errors["logits_two_dims"] = error_of(
            lambda: ft.cross_entropy(
                distribute_tensor(logits, mesh2, [Shard(1), Shard(1)]),
                distribute_tensor(target, mesh2, [Replicate(), Replicate()]),
            )
        )
    return {"max_rel": 0.0, "errors": errors}


@check("bfloat16")
def bfloat16():
    """bfloat16 hidden / head through the process_group door and on one process, each against
    float32 on the same (bfloat16-rounded) values: the logits, dlogits and gradients are rounded
    to bfloat16 on both, and hidden's gradient is summed from the ranks' bfloat16 shares (each
    rounded at its own size, which may exceed the sum's), so its error may grow with the ranks."""
    kw = OPTIONS["all"]
    hidden, weight, bias, target, grad = data(23)
    hidden, weight, bias = (t.to(torch.bfloat16) for t in (hidden, weight, bias))
    truth = _flce_reference(hidden.float(), weight.float(), bias.float(), target, grad, "none", True, **kw)
    one = _flce_reference(hidden, weight, bias, target, grad, "none", True, **kw)
    sizes = sizes_for(23, even=False)
    rows = my_rows(sizes)
    h, w, b = leaf(hidden), leaf(weight[rows]), leaf(bias[rows])
    out = ft.fused_linear_cross_entropy(
        h, w, target, bias=b, reduction="none", chunk_size=5, process_group=dist.group.WORLD, **kw
    )
    upstream(out, grad).backward()
    ours = (out, h.grad, w.grad, b.grad)
    sliced = lambda r: (r[0], r[1], r[2][rows], r[3][rows])  # noqa: E731
    return {
        "max_rel": 0.0,
        "bf16_rel": max(rel(x, y) for x, y in zip(ours, sliced(truth))),
        "one_process": [rel(x, y) for x, y in zip(sliced(one), sliced(truth))],
        "vocab_parallel": [rel(x, y) for x, y in zip(ours, sliced(truth))],
        "dtypes": [str(t.grad.dtype) for t in (h, w, b)],
    }


# --- fused_linear_jsd over vocab-sharded student and teacher heads ------------------------------

JSD_OPTIONS = {
    "beta0": {"beta": 0.0},
    "beta03": {"beta": 0.3, "temperature": 2.0},
    "beta1": {"beta": 1.0, "temperature": 0.7},
}
JSD_HEADS = ("student_weight", "teacher_weight")


def jsd_data(vocab: int, seed=21):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (N,), generator=g)
    labels[3:5] = -100
    return {
        "student_hidden": torch.randn(N, H, generator=g),
        "student_weight": torch.randn(vocab, H, generator=g) * 0.5,
        "teacher_hidden": torch.randn(N, 6, generator=g),
        "teacher_weight": torch.randn(vocab, 6, generator=g) * 0.5,
        "labels": labels,
    }


def _jsd(tensors, labels=True, **kw):
    """(loss, student_hidden's and student_weight's gradients) of fused_linear_jsd (loss * 0.75)."""
    hs, ws = leaf(tensors["student_hidden"]), leaf(tensors["student_weight"])
    out = ft.fused_linear_jsd(
        hs,
        ws,
        tensors["teacher_hidden"],
        tensors["teacher_weight"],
        tensors["labels"] if labels else None,
        chunk_size=5,
        **kw,
    )
    (out * 0.75).backward()
    return out, hs, ws


def jsd_plain(options, labels=True, even=False, vocab=23, dtype=torch.float32):
    """The process_group door: this rank's rows of both heads (sizes that differ per rank)."""
    kw = JSD_OPTIONS[options]
    tensors = {n: t.to(dtype) if t.is_floating_point() else t for n, t in jsd_data(vocab).items()}
    ref, rh, rw = _jsd(tensors, labels, **kw)
    sizes = sizes_for(vocab, even)
    mine, rows = my_share(tensors, sizes, JSD_HEADS)
    out, hs, ws = _jsd(mine, labels, process_group=dist.group.WORLD, **kw)
    return {"max_rel": max(rel(out, ref), rel(hs.grad, rh.grad), rel(ws.grad, rw.grad[rows])), "sizes": sizes}


@check("jsd_module_process_group")
def jsd_module():
    """FusedLinearJSD(process_group=WORLD): this rank's rows of both heads (sizes that differ per
    rank), against the function on one process over the whole heads."""
    kw = JSD_OPTIONS["beta03"]
    tensors = jsd_data(23)
    ref, rh, rw = _jsd(tensors, **kw)
    sizes = sizes_for(23, even=False)
    rows = my_rows(sizes)
    hs, ws = leaf(tensors["student_hidden"]), leaf(tensors["student_weight"][rows])
    module = ft.FusedLinearJSD(chunk_size=5, process_group=dist.group.WORLD, **kw)
    out = module(hs, ws, tensors["teacher_hidden"], tensors["teacher_weight"][rows], tensors["labels"])
    (out * 0.75).backward()
    return {"max_rel": max(rel(out, ref), rel(hs.grad, rh.grad), rel(ws.grad, rw.grad[rows])), "sizes": sizes}


def jsd_dtensor(vocab, mesh_shape=None, hidden_sharded=False, teacher_replicated=False):
    """Both heads Shard(0) over the mesh's last dim (the teacher's replicated: resharded to it),
    the tokens replicated there (Shard(0) over the first dim of a 2-D mesh: data parallel; or over
    the tensor-parallel dim itself: sequence parallel)."""
    _, world = rank_world()
    kw = JSD_OPTIONS["beta03"]
    tensors = jsd_data(vocab)
    if mesh_shape or hidden_sharded:  # splits of the tokens: 12 of them
        tensors = {n: t if n.endswith("weight") else t[:12] for n, t in tensors.items()}
    ref, rh, rw = _jsd(tensors, **kw)
    mesh = init_device_mesh("cpu", mesh_shape or (world,))
    rows, head = mesh_placements(mesh, hidden_sharded)
    dts = {}
    for n, t in tensors.items():
        placement = rows if not n.endswith("weight") else head
        if n == "teacher_weight" and teacher_replicated:
            placement = [Replicate()] * mesh.ndim
        dts[n] = distribute_tensor(t, mesh, placement)
    with CommDebugMode() as fwd:
        out, hs, ws = _jsd(dts, **kw)
    return {
        "max_rel": max(rel(out, ref), rel(hs.grad, rh.grad), rel(ws.grad, rw.grad)),
        "grads": [str(p) for p in (*hs.grad.placements, *ws.grad.placements)],
        "out": [str(p) for p in out.placements],
        "fwd": counts(fwd),
    }


for _o in JSD_OPTIONS:
    check(f"jsd_plain_{_o}")(lambda o=_o: jsd_plain(o))
check("jsd_plain_no_labels")(lambda: jsd_plain("beta03", labels=False))
check("jsd_plain_even")(lambda: jsd_plain("beta03", even=True, vocab=24))
for _v in (24, 23, 5):  # even, uneven, uneven with an empty last shard at 4 ranks
    check(f"jsd_dtensor_v{_v}")(lambda v=_v: jsd_dtensor(v))
check("jsd_dtensor_teacher_replicated")(lambda: jsd_dtensor(23, teacher_replicated=True))
check("jsd_dtensor_hidden_sharded")(lambda: jsd_dtensor(23, hidden_sharded=True))


@check("jsd_dtensor_2d_mesh")
@four_ranks
def jsd_dtensor_2d_mesh():
    return jsd_dtensor(23, mesh_shape=(2, 2))


@check("jsd_bfloat16")
def jsd_bfloat16():
    """bfloat16 heads through the process_group door against float32 on the same values."""
    tensors = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in jsd_data(23).items()}
    truth = _jsd({n: t.float() if t.is_floating_point() else t for n, t in tensors.items()}, beta=0.3)
    sizes = sizes_for(23, even=False)
    mine, rows = my_share(tensors, sizes, JSD_HEADS)
    out, hs, ws = _jsd(mine, beta=0.3, process_group=dist.group.WORLD)
    one = _jsd(tensors, beta=0.3)
    errors = [rel(out, truth[0]), rel(hs.grad, truth[1].grad), rel(ws.grad, truth[2].grad[rows])]
    one_process = [rel(one[0], truth[0]), rel(one[1].grad, truth[1].grad), rel(one[2].grad[rows], truth[2].grad[rows])]
    return {
        "max_rel": 0.0,
        "bf16_rel": max(errors),
        "vocab_parallel": errors,
        "one_process": one_process,
        "dtypes": [str(t.grad.dtype) for t in (hs, ws)],
    }


@check("process_group_refusals")
def process_group_refusals():
    """fused_linear_jsd's process_group door."""
    rank, world = rank_world()
    t = jsd_data(8 * world)
    group = dist.group.WORLD
    ws, wt = t["student_weight"][:8], t["teacher_weight"][:8]
    mesh = init_device_mesh("cpu", (world,))
    jsd = ft.fused_linear_jsd
    n = N - (rank == 0)  # rank 0 has one token fewer than the others
    errors = {
        "beta": error_of(lambda: jsd(t["student_hidden"], ws, t["teacher_hidden"], wt, beta=0.1 * rank, process_group=group)),
        "tokens": error_of(lambda: jsd(t["student_hidden"][:n], ws, t["teacher_hidden"][:n], wt, process_group=group)),
        "group_type": error_of(lambda: jsd(t["student_hidden"], ws, t["teacher_hidden"], wt, process_group="tp")),
        "dtensor_and_group": error_of(
            lambda: jsd(
                distribute_tensor(t["student_hidden"], mesh, [Replicate()]),
                distribute_tensor(t["student_weight"], mesh, [Shard(0)]),
                distribute_tensor(t["teacher_hidden"], mesh, [Replicate()]),
                distribute_tensor(t["teacher_weight"], mesh, [Shard(0)]),
                process_group=group,
            )
        ),
    }
    return {"max_rel": 0.0, "errors": errors}


# --- the post-training losses through the process_group door -----------------------------------


def post_training_plain(loss, module=False):
    """post_training's losses with plain tensors: this rank's rows of the head, its bias and the
    reference head (sizes that differ per rank), process_group=WORLD (module: to the loss's module
    at construction)."""
    tensors, fn, args, ref = post_training_case(loss, temperature=0.8)
    sizes = sizes_for(23, even=False)
    mine, rows = my_share(tensors, sizes, POST_HEADS)
    mine = {n: leaf(t) if n in POST_GRADS else t for n, t in mine.items()}
    if module:
        out = _module_call(loss, mine)
    else:
        out = fn(**mine, process_group=dist.group.WORLD)
    (out * 0.75).backward()
    errors = [rel(out, ref)] + [rel(mine[n].grad, args[n].grad[rows] if n in POST_HEADS else args[n].grad) for n in POST_GRADS]
    return {"max_rel": max(errors), "sizes": sizes}


def _module_call(loss, t):
    """post_training_plain's loss through its module, process_group=WORLD at construction."""
    group = dist.group.WORLD
    if loss == "kto":
        module = ft.FusedLinearKTOLoss(chunk_size=5, process_group=group)
        refs = {n: t[n] for n in ("bias", "ref_hidden", "ref_weight")}
        return module(t["hidden"], t["weight"], t["target"], t["preference_labels"], kl=torch.tensor(0.1), **refs)
    if loss == "grpo":
        module = ft.FusedLinearGRPOLoss(beta=0.1, temperature=0.8, chunk_size=5, process_group=group)
        logps = {n: t[n] for n in ("old_logps", "ref_logps", "bias")}
        return module(t["hidden"], t["weight"], t["target"], t["advantages"], **logps)
    module = ft.FusedLinearPreferenceLoss(loss, label_smoothing=0.1, chunk_size=5, process_group=group)
    refs = {n: t.get(n) for n in ("bias", "ref_hidden", "ref_weight")}
    return module(t["hidden"], t["weight"], t["target"], **refs)


for _loss in ("dpo", "orpo", "simpo", "kto", "grpo"):
    check(f"post_training_{_loss}_process_group")(lambda loss=_loss: post_training_plain(loss))
for _loss in ("dpo", "kto", "grpo"):
    check(f"post_training_{_loss}_module_process_group")(lambda loss=_loss: post_training_plain(loss, module=True))


if __name__ == "__main__":
    run_child(CHECKS)
