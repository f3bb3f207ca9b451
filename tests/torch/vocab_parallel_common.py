"""What the vocab-parallel children share (tests/torch/vocab_parallel_child.py and
tests/torch/vocab_parallel_logprobs_child.py): the checks by name, this rank's rows of a head,
the relative difference, the collectives counted, the refusal caught, and the run of every check
on every rank, rank 0 printing the results as one JSON line, last.

A child declares its checks with the `check` of its own `registry()` and ends with
`run_child(CHECKS)` under `if __name__ == "__main__"`; RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set (VP_ONLY=<substring>: only the checks whose name has it).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard


def registry():
    """A child's checks by name (in the order declared), and the decorator that declares one."""
    checks = {}

    def check(name):
        def declare(fn):
            checks[name] = fn
            return fn

        return declare

    return checks, check


def rank_world():
    return dist.get_rank(), dist.get_world_size()


def rel(a, b) -> float:
    """max|a - b| / max|b| (DTensors gathered whole); 0 for empty tensors, inf for NaN."""
    a = a.full_tensor() if isinstance(a, DTensor) else a
    b = b.full_tensor() if isinstance(b, DTensor) else b
    a, b = a.detach().double(), b.detach().double()
    if b.numel() == 0:
        return 0.0
    value = float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
    return math.inf if math.isnan(value) else value  # NaN would be dropped by max() over the cases


def sizes_for(vocab: int, even: bool) -> list:
    """Per-rank rows: an even split, or one that differs between ranks (sums to vocab)."""
    _, world = rank_world()
    if even:
        return [vocab // world] * world
    base = [vocab // world] * world
    base[0] += vocab - sum(base)  # the remainder on rank 0
    if world > 1:
        base[0] += 1
        base[-1] -= 1
    return base


def my_rows(sizes) -> slice:
    """This rank's rows of the head under the per-rank sizes."""
    rank, _ = rank_world()
    a = sum(sizes[:rank])
    return slice(a, a + sizes[rank])


def my_share(tensors: dict, sizes, heads) -> tuple:
    """(tensors, those named in heads cut to this rank's rows under the per-rank sizes; the rows)."""
    rows = my_rows(sizes)
    return {n: t[rows] if n in heads else t for n, t in tensors.items()}, rows


def mesh_placements(mesh, hidden_sharded=False):
    """(the tokens', the head's) placements on mesh: the head Shard(0) over the last (tensor
    parallel) dim, the tokens replicated there (or Shard(0): sequence parallel); on a 2-D mesh
    the tokens Shard(0) over the first (data parallel) dim, the head replicated there."""
    tokens = [Shard(0)] * (mesh.ndim - 1) + [Shard(0) if hidden_sharded else Replicate()]
    head = [Replicate()] * (mesh.ndim - 1) + [Shard(0)]
    return tokens, head


def four_ranks(fn):
    """fn run at 4 ranks alone (a 2 x 2 mesh); at any other count a skip."""

    @functools.wraps(fn)
    def at_four(*args, **kwargs):
        if dist.get_world_size() != 4:
            return {"max_rel": 0.0, "skipped": True}
        return fn(*args, **kwargs)

    return at_four


def leaf(t):
    return t.detach().clone().requires_grad_()


def counts(mode) -> dict:
    """The collectives a CommDebugMode saw, by name, those that ran."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items() if n}


def error_of(fn) -> str:
    """The TypeError or ValueError fn raises, as "Type: message"; "ran" if none."""
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "ran"


def run_checks(checks: dict) -> None:
    """Every check on every rank (an exception: the check's "error"), each result's errors the
    worst rank's (max_rel, bf16_rel: the bfloat16 check's; top1_equal where a check has it: true
    on every rank); rank 0 prints the results as one JSON line."""
    dist.init_process_group("gloo")
    only = os.environ.get("VP_ONLY")
    results = {}
    for name, fn in checks.items():
        if only and only not in name:
            continue
        try:
            r = fn()
        except Exception:  # reported per check; the test fails on it with the traceback
            r = {"error": traceback.format_exc()[-3000:]}
        worst = torch.tensor(
            [r.get("max_rel", float("inf")), r.get("bf16_rel", 0.0), 0.0 if r.get("top1_equal", True) else 1.0],
            dtype=torch.float64,
        )
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        r["max_rel"], r["bf16_rel"] = worst.tolist()[:2]
        if "top1_equal" in r:
            r["top1_equal"] = worst[2].item() == 0.0
        results[name] = r
        dist.barrier()
    if dist.get_rank() == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def run_child(checks: dict) -> None:
    """A child's main: run_checks on one thread, then leave without the interpreter's exit-time
    destructors (gloo's teardown there may abort a rank after its results are out:
    tests/torch/dtensor_child.py)."""
    torch.set_num_threads(1)
    run_checks(checks)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
