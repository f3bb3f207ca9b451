"""Vocab-parallel cross-entropy: the classes (the head's rows, the logits' last dim) sharded over
a tensor-parallel process group, the tokens replicated across it.

Rank r of the group holds the classes [offset_r, offset_r + V_r) (V_r may differ between ranks,
and may be 0); V is their sum. Every rank runs fuselet's cross-entropy kernels on its own logits
[n, V_r] only and combines per-row float32 statistics with the others, so that no rank holds a
[tokens, V] tensor, and fused_linear_cross_entropy keeps one [chunk, V_r] buffer as it does on
one process.

Per chunk of n rows (per call of cross_entropy), the forward:
  1. the kernel's forward on the local logits, target the local class (the rank's own target
     where the row's target is in its shard, else class 0: a stand-in), gives lse_r, the
     local log-sum-exp, and with label smoothing the local sum of the (soft-capped) logits;
  2. one all-gather of [k, n] float32 per rank (k = 2, or 3 with label smoothing): lse_r, the
     target's soft-capped logit (0 on the ranks that do not hold it) and ls * sum_r(s);
  3. every rank computes, from the same gathered values in the same order (so bitwise alike on
     all ranks): lse = logsumexp_r(lse_r), s_t = sum_r, mean(s) = sum_r / V and the loss
     (1 - ls)(lse - s_t) + ls (lse - mean(s)) + zl lse^2, 0 where the target is ignore_index.
The backward of a chunk needs no collective: the kernel's backward on the local logits with the
global lse gives p_j = exp(s_j - lse) exactly; its label smoothing is given as ls * V_r / V, so
that its ls / V_r per class is the global ls / V; the one entry per row that then differs (the
target's, or the stand-in's) is computed anew from its logit, [n] values, and scattered. dhidden
(each rank's dlogits_r @ weight_r) is all-reduced once per call; dweight_r and dbias_r stay the
rank's own rows.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
import torch.distributed as dist

ops = torch.ops.fuselet

# the kernels' ignore_index on local targets (all in [0, V_r), or this for an ignored row)
_NO_CLASS = -1


@dataclass(frozen=True)
class Shard:
    """This rank's share of the classes: group, its rank in it, the per-rank sizes, offset, V."""

    group: object
    rank: int
    sizes: tuple
    chunk: int = 0  # tokens per chunk (fused_linear_cross_entropy), the same on every rank
    # hidden's gradient all-reduced here (False: left to the caller, each rank's share: DTensor's
    # reduce-scatter of a sequence-parallel hidden)
    reduce_hidden: bool = True

    @property
    def world(self) -> int:
        return len(self.sizes)

    @property
    def local(self) -> int:
        return self.sizes[self.rank]

    @property
    def offset(self) -> int:
        return sum(self.sizes[: self.rank])

    @property
    def vocab(self) -> int:
        return sum(self.sizes)

    def block(self, v0: int, v1: int) -> Shard:
        """The classes [v0, v1) of this rank's own (counted from its offset), as a shard of the
        same V that no group holds: what a loop over blocks of this rank's classes gives the
        per-chunk math below (dlogits_ and its kin need no collective)."""
        start = self.offset + v0
        return Shard(None, 1, (start, v1 - v0, self.vocab - start - (v1 - v0)), self.chunk, self.reduce_hidden)


def check_group(process_group) -> None:
    if process_group is None:
        return
    if not dist.is_available() or not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group: expected None or a torch.distributed ProcessGroup, got {type(process_group).__name__}")


# torch 2.13 names it all_gather_single (all_gather_into_tensor: deprecated, the same collective)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather(t: torch.Tensor, group, world: int) -> torch.Tensor:
    """[world, *t.shape]: t of every rank of group, in rank order (one all-gather, flat: gloo's)."""
    out = torch.empty(world * t.numel(), dtype=t.dtype, device=t.device)
    _all_gather(out, t.contiguous().reshape(-1), group=group)
    return out.reshape(world, *t.shape)


# the dtypes of the agree() fields "...: its dtype" (their index: one number every rank compares)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class MeshLayout:
    """A DTensor head Shard(0) on mesh dim d, and the tokens' placements that its losses keep
    (their local_map's in / out / gradient placements): the tokens are replicated over d; over the
    other dims their Shard(0) is kept (`split`: those dims; a sum over the tokens is then Partial
    there: `summed`). Tokens Shard(0) over d itself (sequence parallel) are gathered for the loss,
    and hidden's gradient goes back as each rank's share (Partial over d: `drows`), which DTensor
    reduce-scatters."""

    mesh: object
    d: int
    split: tuple
    sequence: bool
    rows: tuple
    drows: tuple
    head: tuple
    dhead: tuple
    summed: tuple
    sizes: tuple
    rank: int

    def shard(self, **heads) -> Shard:
        """This rank's Shard of the mesh dim's group, each local head of `heads` (name: tensor)
        checked to hold DTensor's split of the rows (refused rather than misplaced)."""
        mine = self.sizes[self.rank]
        for name, w in heads.items():
            if w.shape[0] != mine:
                raise ValueError(
                    f"{name}: expected {mine} rows on rank {self.rank} (Shard(0) of {sum(self.sizes)}), got {w.shape[0]}"
                )
        return Shard(self.mesh.get_group(self.d), self.rank, self.sizes, reduce_hidden=not self.sequence)


def mesh_layout(hidden, weight, d: int) -> MeshLayout:
    """The MeshLayout of DTensor `hidden` (tokens' rows leading) and head `weight` Shard(0) on dim d."""
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor import Shard as DShard

    mesh = weight.device_mesh
    dims = range(mesh.ndim)
    split = tuple(e != d and isinstance(p, DShard) and p.dim == 0 for e, p in zip(dims, hidden.placements))
    rows = tuple(DShard(0) if s else Replicate() for s in split)
    sequence = isinstance(hidden.placements[d], DShard) and hidden.placements[d].dim == 0
    return MeshLayout(
        mesh=mesh,
        d=d,
        split=split,
        sequence=sequence,
        rows=rows,
        drows=tuple(Partial() if e == d and sequence else p for e, p in zip(dims, rows)),
        head=tuple(DShard(0) if e == d else Replicate() for e in dims),
        dhead=tuple(DShard(0) if e == d else Partial() if split[e] else Replicate() for e in dims),
        summed=tuple(Partial() if s else Replicate() for s in split),
        sizes=even_sizes(weight.shape[0], mesh.size(d)),
        rank=mesh.get_local_rank(d),
    )


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def agree(group, local: int, fields: dict, device) -> Shard:
    """The shard of this rank: one all-gather of each rank's class count and call facts (int64),
    which must be alike on every rank (`fields`: {"argument: what": value}, ints or floats, or a
    tuple of ints of a length alike on every rank: a shape). Every rank sees the same gathered
    values, so a mismatch raises on all of them."""
    names, values = [], []
    for name, v in fields.items():
        for i, x in enumerate(v if isinstance(v, tuple) else (v,)):
            names.append((name, i))
            values.append(_bits(x) if isinstance(x, float) else int(x))
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = torch.tensor([local, *values], dtype=torch.int64, device=device)
    rows = gather(mine, group, world).cpu().tolist()
    for r, row in enumerate(rows):
        if row[1:] == rows[rank][1:]:
            continue
        for j, (name, _) in enumerate(names):
            if row[1 + j] != rows[rank][1 + j]:
                idx = [k for k, (n, _) in enumerate(names) if n == name]
                theirs, ours = _shown(fields[name], [row[1 + k] for k in idx]), fields[name]
                arg, _, what = name.partition(":")
                what = f" ({what.strip()})" if what else ""
                raise ValueError(
                    f"{arg}: expected the same on every rank of process_group{what}, got {ours} on rank {rank} "
                    f"and {theirs} on rank {r}"
                )
    return Shard(group, rank, tuple(row[0] for row in rows))


def _shown(mine, raw: list):
    """Another rank's values of a field, shown like this rank's."""
    if isinstance(mine, tuple):
        return tuple(raw)
    if isinstance(mine, float):
        return struct.unpack("<d", struct.pack("<q", raw[0]))[0]
    return raw[0]


def even_sizes(vocab: int, world: int) -> tuple:
    """DTensor's Shard(0) split of vocab rows over world ranks (torch.chunk's: ceil(V / world)
    each, the last ones smaller, possibly 0)."""
    per = -(-vocab // world)
    return tuple(max(0, min(per, vocab - r * per)) for r in range(world))


# --- the per-chunk math ---------------------------------------------------------------------------


class Rows:
    """The rows' targets as this rank sees them: owned (the target is one of its classes), ignored
    (target == ignore_index), col (the local class the kernels read: the target's, or 0)."""

    def __init__(self, target: torch.Tensor, shard: Shard, ignore_index: int):
        local = target - shard.offset
        self.ignored = target == ignore_index
        self.owned = (local >= 0) & (local < shard.local) & ~self.ignored
        self.col = torch.where(self.owned, local, torch.zeros_like(local))


def check_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Every target a class id in [0, V) or ignore_index (no rank would hold it otherwise)."""
    bad = ((target < 0) | (target >= vocab)) & (target != ignore_index)
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        raise ValueError(
            f"target: expected class ids in [0, {vocab}) (V, the classes of all ranks) or ignore_index "
            f"{ignore_index}, got {int(target.reshape(-1)[i])} at index {i}"
        )


def _capped(x: torch.Tensor, softcap: float) -> torch.Tensor:
    return softcap * torch.tanh(x / softcap) if softcap else x


def combine(logits, rows: Rows, shard: Shard, op_args) -> tuple:
    """(loss, z, lse) of the rows [n], float32, alike on every rank: logits [n, V_r] this rank's
    (n may be 0; V_r may be 0, logits then None). One all-gather of [k, n] float32."""
    ignore_index, ls, zl, cap = op_args
    n = rows.col.shape[0]
    k = 3 if ls > 0 else 2
    device = rows.col.device
    stats = torch.zeros((k, n), dtype=torch.float32, device=device)
    if shard.local > 0 and n > 0:
        loss_r, _, lse_r = ops.cross_entropy_fwd(logits, rows.col, _NO_CLASS, ls, 0.0, cap)
        s_col = _capped(logits.gather(1, rows.col[:, None]).squeeze(1).float(), cap)
        stats[0] = lse_r
        stats[1] = torch.where(rows.owned, s_col, 0.0)
        if ls > 0:  # the kernel's (1 - ls)(lse_r - s_col) + ls (lse_r - sum_r / V_r), solved for ls sum_r
            stats[2] = shard.local * (lse_r - loss_r - (1.0 - ls) * s_col)
    else:
        stats[0] = -math.inf
    # n is alike on every rank (the tokens are): no rank gathers 0 rows
    gathered = gather(stats, shard.group, shard.world) if shard.world > 1 and n > 0 else stats[None]
    lse = torch.logsumexp(gathered[:, 0], 0)
    s_t = gathered[:, 1].sum(0)
    ce = lse - s_t if ls == 0 else (1.0 - ls) * (lse - s_t) + (ls * lse - gathered[:, 2].sum(0) / shard.vocab)
    z = zl * lse * lse
    zero = torch.zeros((), dtype=torch.float32, device=device)
    keep = ~rows.ignored
    return torch.where(keep, ce + z, zero), torch.where(keep, z, zero), torch.where(keep, lse, zero)


def dlogits_(logits, g, rows: Rows, lse, shard: Shard, op_args) -> None:
    """logits [n, V_r] becomes, in place, g * d loss_row / d logits (g [n] float32, the global
    lse [n] of combine()). No collective."""
    if shard.local == 0 or logits.shape[0] == 0:
        return
    _, ls, zl, cap = op_args
    s_col = _capped(logits.gather(1, rows.col[:, None]).squeeze(1).float(), cap)  # before it is overwritten
    target = torch.where(rows.ignored, torch.full_like(rows.col, _NO_CLASS), rows.col)
    ops.cross_entropy_bwd_(g, logits, target, lse, _NO_CLASS, ls * shard.local / shard.vocab, zl, cap)
    # The kernel's label smoothing ls_r = ls V_r / V gives every entry its global ls / V, but it
    # took -(1 - ls_r) at col, where the target's is -(1 - ls) and a stand-in's 0: that entry is
    # written anew, in float32 from the logit read above (adding the difference to it would
    # cancel: p_col - 1 + 1 in bfloat16 keeps about 2^-9 of p_col).
    a = g * (1.0 + 2.0 * zl * lse)
    d = a * torch.exp(s_col - lse) - g * (ls / shard.vocab) - torch.where(rows.owned, g * (1.0 - ls), 0.0)
    if cap:
        d = d * (1.0 - (s_col / cap).square())
    d = torch.where(rows.ignored, 0.0, d)
    logits.scatter_(1, rows.col[:, None], d[:, None].to(logits.dtype))


def all_reduce_(t: torch.Tensor, shard: Shard) -> torch.Tensor:
    """hidden's gradient: the sum of the ranks' shares (unless shard.reduce_hidden is False)."""
    if shard.world > 1 and shard.reduce_hidden:
        dist.all_reduce(t, group=shard.group)
    return t
