"""Rotary position embedding for PyTorch: checked wrapper, fake impls, autograd.

Math and shapes: csrc/core/include/fuselet/rope.h. x is [B, S, N, D] (layout="bshd") or
[B, N, S, D] (layout="bhsd", transformers' q / k after the head transpose), B optional; cos and
sin are [S, R] or [B, S, R], float32 or x's dtype. The first R features of each head rotate
(interleaved=False: i pairs with i + R/2, transformers' rotate_half; True: 2j with 2j+1,
GPT-J), the rest pass through. y has x's shape and dtype. x is read in place through its
strides (a transposed view needs no copy). Only x gets a gradient; cos and sin get None.

pair_table=True: cos and sin hold one angle per rotating pair, [S, R/2] or [B, S, R/2] (Llama4's
complex freqs_cis as its .real and .imag, GLM's and GPT-OSS's half tables): no full-width copy.
sections=(s_0, ..., s_{K-1}): cos and sin are K tables [K, S, R'] or [K, B, S, R'] (multimodal
rope: Qwen2-VL's temporal, height and width positions), pair j reading the table of its section
(contiguous; interleaved_sections=True: Qwen3-VL's interleaved rule): no recomposed copy.
"""

from __future__ import annotations

import torch

from fuselet.spec import rope as spec
from fuselet.torch._args import check_dense, check_same_device, facts, op_tensors
from fuselet.torch._dtensor import placements, sharding

ops = torch.ops.fuselet


def rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "bshd",
    interleaved: bool = False,
    pair_table: bool = False,
    sections: tuple[int, ...] | None = None,
    interleaved_sections: bool = False,
) -> torch.Tensor:
    """y[..., i] = x[..., i] * cos[i] + rot(x)[..., i] * sin[i] for i < R; x[..., i] beyond
    (cos[i], sin[i]: feature i's angle, from its pair's column with pair_table and from its
    pair's table with sections: fuselet/rope.h)."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        check_dense(name, t)
    check_same_device("x", x, cos=cos, sin=sin)
    options = spec.rope(facts(x), facts(cos), facts(sin), layout, interleaved, pair_table, sections, interleaved_sections)
    return ops.rope_fwd(x, cos, sin, *options.op_args())


def _fake_check(name, x, cos, sin, *scalars):
    """The op's checks of x (the forward) or dy (the backward: reported under its own name)."""
    op_tensors(**{name: x}, cos=cos, sin=sin)
    spec.op(name, facts(x), facts(cos), facts(sin), *scalars)


@torch.library.register_fake("fuselet::rope_fwd")
def _(x, cos, sin, bhsd=False, interleaved=False, pair_table=False, sections=None, interleaved_sections=False):
    _fake_check("x", x, cos, sin, bhsd, interleaved, pair_table, sections, interleaved_sections)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("fuselet::rope_bwd")
def _(dy, cos, sin, bhsd=False, interleaved=False, pair_table=False, sections=None, interleaved_sections=False):
    _fake_check("dy", dy, cos, sin, bhsd, interleaved, pair_table, sections, interleaved_sections)
    return torch.empty(dy.shape, dtype=dy.dtype, device=dy.device)


# --- DTensor sharding (fuselet.torch._dtensor): x's batch, sequence and head dims keep their
# sharding; cos / sin follow x's batch and sequence sharding and are replicated otherwise; the
# head dim D (rotated pairs) is whole. Which dim of x is the sequence depends on bhsd.


def _rope_sharding(x, cos, bhsd, sections):
    Replicate, Shard, _ = placements()
    has_b = x.ndim == 4
    s_dim = (1 if has_b else 0) + (1 if bhsd else 0)
    kd = 1 if sections else 0  # cos / sin: a leading dim of K tables, never sharded
    table_s = cos.ndim - 2  # cos / sin: [K,] [S, R] or [K,] [B, S, R]
    scalars = [None] * 5  # bhsd, interleaved, pair_table, sections, interleaved_sections
    strategies = [([Replicate()], [Replicate()] * 3 + scalars)]
    for d in range(x.ndim - 1):
        if d == s_dim:
            table = Shard(table_s)
        elif has_b and d == 0 and cos.ndim == 3 + kd:
            table = Shard(kd)
        else:
            table = Replicate()
        strategies.append(([Shard(d)], [Shard(d), table, table, *scalars]))
    return strategies


@sharding("rope_fwd", static_argnum=3)
def _(x, cos, sin, bhsd=False, interleaved=False, pair_table=False, sections=None, interleaved_sections=False):
    return _rope_sharding(x, cos, bhsd, sections)


@sharding("rope_bwd", static_argnum=3)
def _(dy, cos, sin, bhsd=False, interleaved=False, pair_table=False, sections=None, interleaved_sections=False):
    return _rope_sharding(dy, cos, bhsd, sections)


def _setup(ctx, inputs, output):
    _, cos, sin, *ctx.scalars = inputs
    ctx.save_for_backward(cos, sin)


def _backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return ops.rope_bwd(dy, cos, sin, *ctx.scalars), None, None, *([None] * len(ctx.scalars))


torch.library.register_autograd("fuselet::rope_fwd", _backward, setup_context=_setup)
