"""Per-rank peak memory of a vocab-parallel LM-head loss (tensor parallel, the head's rows sharded
over the ranks), one training step's loss (forward + backward to hidden and the head), at 2 and 4
ranks on the CPU (gloo, one process per rank, loopback):

  gathered head    every rank all-gathers the head [V, H] and runs fuselet's fused linear
                   cross-entropy over all of it (what fuselet did with a vocab-sharded head
                   before), keeping its rows of the head's gradient (a reduce-scatter's share)
  sharded head     fuselet.torch.fused_linear_cross_entropy(process_group=...): each rank its
                   own rows [V / ranks, H] and one [chunk, V / ranks] logits buffer
  loss_parallel    torch's: the logits hidden @ weight.T as a DTensor sharded on V (each rank
                   [N, V / ranks]) and F.cross_entropy under torch.distributed.tensor.parallel's
                   loss_parallel()

With --loss jsd, the loss is fused_linear_jsd of a student and a teacher head (both [V, H], both
sharded; the teacher's hidden [N, H] alike on every rank): "gathered head" all-gathers both heads,
"sharded head" passes process_group; loss_parallel has no counterpart (torch's loss_parallel() is
cross-entropy's alone).

The hidden [N, H] and the target are the same on every rank; the head's shard is allocated before
the step. Peak: the resident set's peak during the step above what the process held before it
(glibc mapping each allocation of 128 KiB or more on its own), after one warm-up step; the table
gives the largest over the ranks (they differ by a few KiB). Sizes are counted, not timed: every
run gives about the same table.

    python benchmarks/bench_vocab_parallel.py [--tokens N --hidden H --vocab V] [--dtype float32]
                                              [--loss cross_entropy|jsd] [--ranks 2,4] [--methods ...]
                                              [--output PATH|none]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import common

METHODS = ("gathered head", "sharded head", "loss_parallel")
JSD_METHODS = ("gathered head", "sharded head")
RESULTS = Path(__file__).resolve().parent / "results"


def _step(method, dtype, n, h, v, loss_name="cross_entropy"):
    import fuselet.torch as ft
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, h, generator=g) * 0.5).to(dt).requires_grad_(True)
    rows = v // world
    full = torch.randn(v, h, generator=g) * h**-0.5  # the same head at any number of ranks
    weight = full[rank * rows : (rank + 1) * rows].to(dt).clone().requires_grad_(True)
    del full
    target = torch.randint(0, v, (n,), generator=g)

    def gathered():
        full = torch.empty(v, h, dtype=dt)
        dist.all_gather_into_tensor(full, weight.detach())
        full.requires_grad_(True)
        loss = ft.fused_linear_cross_entropy(hidden, full, target)
        loss.backward()
        weight.grad = full.grad[rank * rows : (rank + 1) * rows].clone()
        return loss

    def sharded():
        loss = ft.fused_linear_cross_entropy(hidden, weight, target, process_group=dist.group.WORLD)
        loss.backward()
        return loss

    def parallel():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard
        from torch.distributed.tensor.parallel import loss_parallel

        mesh = init_device_mesh("cpu", (world,))
        w = DTensor.from_local(weight, mesh, [Shard(0)])
        x = DTensor.from_local(hidden, mesh, [Replicate()])
        logits = x @ w.t()  # Shard(1): each rank [N, V / ranks]
        with loss_parallel():
            loss = F.cross_entropy(logits, DTensor.from_local(target, mesh, [Replicate()]))
            loss.backward()
        return loss.full_tensor()

    fn = {"gathered head": gathered, "sharded head": sharded, "loss_parallel": parallel}[method]
    if loss_name == "jsd":
        teacher = (torch.randn(v, h, generator=g) * h**-0.5)[rank * rows : (rank + 1) * rows].to(dt).clone()
        teacher_hidden = (torch.randn(n, h, generator=g) * 0.5).to(dt)

        def jsd_gathered():
            full, full_t = torch.empty(v, h, dtype=dt), torch.empty(v, h, dtype=dt)
            dist.all_gather_into_tensor(full, weight.detach())
            dist.all_gather_into_tensor(full_t, teacher)
            full.requires_grad_(True)
            loss = ft.fused_linear_jsd(hidden, full, teacher_hidden, full_t)
            loss.backward()
            weight.grad = full.grad[rank * rows : (rank + 1) * rows].clone()
            return loss

        def jsd_sharded():
            loss = ft.fused_linear_jsd(hidden, weight, teacher_hidden, teacher, process_group=dist.group.WORLD)
            loss.backward()
            return loss

        fn = {"gathered head": jsd_gathered, "sharded head": jsd_sharded}[method]

    def reset():
        hidden.grad = weight.grad = None

    def step():
        reset()
        return float(fn())

    return step, reset


def child(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    step, reset = _step(args.method, args.dtype, args.tokens, args.hidden, args.vocab, args.loss)
    loss = step()  # warm-up
    reset()  # its gradients go before the measured step starts
    dist.barrier()
    common.isolate_allocations()
    peak = common.peak_rss(step)
    dist.barrier()
    print(json.dumps({"peak_bytes": peak, "loss": loss}), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(method: str, world: int, sizes: list) -> list[dict]:
    """Every rank's {peak_bytes, loss}."""
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        MALLOC_MMAP_THRESHOLD_="131072",
    )
    cmd = [sys.executable, "-W", "ignore", __file__, "--child", "--method", method, *sizes]
    procs = [
        subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{method} at {world} ranks failed (rc {p.returncode}):\n{err[-3000:]}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--loss", choices=("cross_entropy", "jsd"), default="cross_entropy")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--methods", default=None, help="default: every method of --loss")
    p.add_argument(
        "--output",
        default=None,
        help="the table's file (default benchmarks/results/bench_vocab_parallel-cpu.txt, with --loss jsd "
        "bench_vocab_parallel_jsd-cpu.txt; none: print only)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    sizes = ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--vocab", str(args.vocab), "--dtype", args.dtype]
    sizes += ["--loss", args.loss]
    nbytes = {"float32": 4, "bfloat16": 2}[args.dtype]
    what = "LM-head loss" if args.loss == "cross_entropy" else "fused_linear_jsd (student and teacher heads)"
    lines = [
        f"vocab-parallel {what}, one step (forward + backward): N {args.tokens}, H {args.hidden}, "
        f"V {args.vocab}, {args.dtype} on the CPU (gloo); peak MiB per rank above the step's start (the largest rank's)",
        f"the whole head is {args.vocab * args.hidden * nbytes / 2**20:.0f} MiB, the whole logits "
        f"{args.tokens * args.vocab * 4 / 2**20:.0f} MiB in float32",
    ]
    head = f"{'ranks':<7}{'head rows/rank':>15}{'gathered head':>16}{'sharded head':>15}{'loss_parallel':>16}"
    head += f"{'sharded/gathered':>18}{'loss':>9}"
    lines += [head, "-" * len(head)]
    default = METHODS if args.loss == "cross_entropy" else JSD_METHODS
    methods = [m for m in (args.methods or ",".join(default)).split(",") if m]
    for world in (int(w) for w in args.ranks.split(",")):
        if args.vocab % world:
            p.error(f"--vocab: expected a multiple of every --ranks value, got {args.vocab} and {world}")
        peaks, loss = {}, None
        for m in methods:
            ranks = run(m, world, sizes)
            peaks[m] = max(r["peak_bytes"] for r in ranks) / 2**20
            loss = ranks[0]["loss"]
            print(f"{m} at {world} ranks: {peaks[m]:.1f} MiB, loss {loss:.4f}", flush=True)
        cell = {m: f"{peaks[m]:.1f}" if m in peaks else "-" for m in METHODS}
        ratio = (
            f"{peaks['sharded head'] / peaks['gathered head']:.1%}" if {"sharded head", "gathered head"} <= set(peaks) else "-"
        )
        lines.append(
            f"{world:<7}{args.vocab // world:>15}{cell['gathered head']:>16}{cell['sharded head']:>15}"
            f"{cell['loss_parallel']:>16}{ratio:>18}{loss:>9.4f}"
        )
    name = "bench_vocab_parallel-cpu.txt" if args.loss == "cross_entropy" else "bench_vocab_parallel_jsd-cpu.txt"
    common.write_table("\n".join(lines), args.output, RESULTS / name, "bench_vocab_parallel.py", "sizes measured, not timed")


if __name__ == "__main__":
    main()
