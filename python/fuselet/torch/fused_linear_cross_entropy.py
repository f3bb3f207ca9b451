"""Fused linear cross-entropy for PyTorch: the loss of `hidden @ weight.T + bias` without the
[tokens, V] logits.

The tokens are taken chunk by chunk: each chunk's logits come from torch's own matmul, fuselet's
cross-entropy kernel turns them into the loss and, in the same pass and in place, into dlogits;
the chunk's dhidden and its share of dweight / dbias are accumulated at once. So at most one
chunk of logits exists at a time.

- reduction "mean" / "sum": the gradients are computed during the forward (the upstream gradient
  of a reduced loss is one number, applied in the backward); the forward returns them to
  autograd, which keeps them instead of the logits. One pass over the chunks, or, where the
  tokens are few beside the classes (spec.one_pass_for), the per-token pass and then the
  backward below inside the forward.
- reduction "none": the per-token upstream gradient is known only in the backward, which
  recomputes the logits (one more matmul of the head) from hidden, weight and the float32
  per-token lse the forward kept: chunk by chunk, or, where the tokens are few beside the
  classes, block of classes by block over all the tokens (recomputed_backward).

One [chunk, V] buffer holds each chunk's logits and then its dlogits; dweight / dbias are
accumulated in float32 (per vocabulary block, so that no [V, H] temporary of the matmul's dtype
is needed) and returned in the parameters' dtypes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fuselet.spec import fused_linear_cross_entropy as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for
from fuselet.torch import _vocab_parallel as vp
from fuselet.torch._args import check_dense, check_same_device, facts, op_tensors
from fuselet.torch._dtensor import check_dtensors, is_dtensor, placements, rowwise, scalars, sharding

ops = torch.ops.fuselet

# dweight is accumulated over vocabulary blocks of this many rows (the temporary of one
# block's matmul is [block, H] in the weight's dtype).
_VOCAB_BLOCK = 4096


def _resolve(chunk_size: int, hidden, weight) -> int:
    """The ops' chunk_size 0 is the default, chunk_size_for(N, H, V), decided inside the op from the
    real sizes: under torch.compile a symbolic N stays symbolic (no guard on its value, so no
    recompilation for every new token count)."""
    return chunk_size or chunk_size_for(hidden.shape[0], hidden.shape[1], weight.shape[0])


def _counted(target, ignore_index: int):
    """What the mean divides by: the tokens whose target is not ignore_index, at least 1."""
    info = torch.iinfo(target.dtype)
    if not info.min <= ignore_index <= info.max:  # no target can equal it
        return max(1, target.shape[0])
    return (target != ignore_index).sum().clamp(min=1)


def _chunks(n: int, chunk: int):
    return ((a, min(n, a + chunk)) for a in range(0, n, chunk))


class _Logits:
    """One [chunk, V] buffer, reused by every chunk: the logits of h, then (in place) dlogits."""

    def __init__(self, hidden, weight, bias, chunk):
        self.weight, self.bias = weight, bias
        self.buf = hidden.new_empty((min(chunk, hidden.shape[0]), weight.shape[0]))

    def __call__(self, h):
        out = self.buf[: h.shape[0]]
        if self.bias is None:
            return torch.mm(h, self.weight.t(), out=out)
        return torch.addmm(self.bias, h, self.weight.t(), out=out)


class _Accumulator:
    """dweight / dbias in float32, added to chunk by chunk from (dlogits, h). dweight is held as
    float32 blocks of _VOCAB_BLOCK rows: each chunk's share is one matmul per block in the
    weight's dtype into a block-sized temporary, and the result is converted block by block,
    each float32 block freed as soon as it is converted. The blocks start as the first chunk's
    products (no zero-filled accumulator read back once)."""

    def __init__(self, weight, bias):
        self.weight, self.bias = weight, bias
        vocab, hidden = weight.shape
        self.rows = [(v0, min(vocab, v0 + _VOCAB_BLOCK)) for v0 in range(0, vocab, _VOCAB_BLOCK)]
        self.blocks: list[torch.Tensor] = []  # made by the first add
        self.dbias = None
        self.tmp = None if weight.dtype == torch.float32 else weight.new_empty((min(vocab, _VOCAB_BLOCK), hidden))

    def add(self, dlogits, h):
        first = not self.blocks
        for i, (v0, v1) in enumerate(self.rows):
            part = dlogits[:, v0:v1].t()
            if first:  # the products in float32 (a 16-bit weight's converted)
                product = torch.mm(part, h) if self.tmp is None else torch.mm(part, h, out=self.tmp[: v1 - v0])
                self.blocks.append(product.float())
            elif self.tmp is None:  # float32: straight into the accumulator
                self.blocks[i].addmm_(part, h)
            else:
                self.blocks[i].add_(torch.mm(part, h, out=self.tmp[: v1 - v0]))
        if self.bias is not None:
            db = dlogits.sum(0, dtype=torch.float32)
            self.dbias = db if self.dbias is None else self.dbias.add_(db)

    def results(self):
        self.tmp = None
        no_bias = self.weight.new_empty(0)
        if not self.blocks:  # no chunk: no token
            return torch.zeros_like(self.weight), no_bias if self.bias is None else torch.zeros_like(self.bias)
        dweight = torch.empty_like(self.weight)
        for v0, v1 in self.rows:
            dweight[v0:v1].copy_(self.blocks.pop(0))
        return dweight, no_bias if self.bias is None else self.dbias.to(self.bias.dtype)


def recomputed_backward(hidden, weight, bias, shard: vp.Shard, dlogits_) -> tuple:
    """(dhidden, dweight, dbias or an empty tensor) of a loss whose dlogits need the statistics of
    its whole forward (reduction="none", the log-probabilities), its logits recomputed from hidden
    [N, H] and weight [V_r, H] (this rank's classes of `shard`, all of them on one process).
    dlogits_(logits, a, b, block) turns the logits of the tokens a:b and of the classes of `block`
    (a vp.Shard) into their dlogits in place. dhidden is this rank's share (a vocab-parallel caller
    all-reduces it).

    spec.vocab_block_for decides the walk: chunks of shard.chunk tokens (block: shard itself), each
    chunk's share of dweight added to the float32 _Accumulator; or blocks of classes over all the
    tokens, each block's rows of dweight one matmul in the weight's dtype (one rounding, no [V, H]
    float32 buffer, nothing added) and its share of dhidden added into a float32 [N, H] sum."""
    n, vocab = hidden.shape[0], weight.shape[0]
    block = spec.vocab_block_for(n, vocab, shard.chunk)
    if not block:
        dhidden = torch.empty_like(hidden)
        acc, logits_of = _Accumulator(weight, bias), _Logits(hidden, weight, bias, shard.chunk)
        for a, b in _chunks(n, shard.chunk):
            h = hidden[a:b]
            logits = logits_of(h)
            dlogits_(logits, a, b, shard)
            torch.mm(logits, weight, out=dhidden[a:b])
            acc.add(logits, h)
        logits = logits_of = None
        return (dhidden, *acc.results())
    dweight = torch.empty_like(weight)
    dbias = None if bias is None else torch.empty(vocab, dtype=torch.float32, device=bias.device)
    buf = hidden.new_empty((n, min(block, vocab)))
    tmp = None if hidden.dtype == torch.float32 else torch.empty_like(hidden)
    # dweight's rows of a block as hidden.T @ dlogits [H, block], then copied transposed: a CPU
    # matmul of the transposed dlogits (dlogits.T @ hidden) took 1.7x as long (bf16, 4096 tokens)
    hidden_t, dweight_t = hidden.t().contiguous(), weight.new_empty((weight.shape[1], buf.shape[1]))
    dhidden = None  # float32, made by the first block
    for v0, v1 in _chunks(vocab, block):
        w, logits = weight[v0:v1], buf[:, : v1 - v0]
        if bias is None:
            torch.mm(hidden, w.t(), out=logits)
        else:
            torch.addmm(bias[v0:v1], hidden, w.t(), out=logits)
        dlogits_(logits, 0, n, shard.block(v0, v1))
        dweight[v0:v1] = torch.mm(hidden_t, logits, out=dweight_t[:, : v1 - v0]).t()
        if dbias is not None:
            dbias[v0:v1] = logits.sum(0, dtype=torch.float32)
        if dhidden is None:
            dhidden = torch.mm(logits, w).float() if tmp is None else torch.mm(logits, w, out=tmp).float()
        elif tmp is None:
            dhidden.addmm_(logits, w)
        else:
            dhidden.add_(torch.mm(logits, w, out=tmp))
    buf = tmp = hidden_t = dweight_t = None
    no_bias = weight.new_empty(0) if bias is None else dbias.to(bias.dtype)
    return dhidden.to(hidden.dtype), dweight, no_bias


def _whole(vocab: int, chunk: int) -> vp.Shard:
    """One process's classes, all V of them, as recomputed_backward takes them."""
    return vp.Shard(None, 0, (vocab,), chunk)


def _op_check(hidden, weight, bias, target, op_args, chunk_size, **tokens) -> spec.FusedLinearCrossEntropyOptions:
    """The checks of the ops below (and of their fake impls): spec.op of hidden [N, H], weight
    [V, H], bias [V] or None, target [N] (class ids), the cross-entropy options (op_args: softcap
    0.0 none), chunk_size (0: the default) and per-token `tokens` [N] (dloss: any float dtype;
    lse: float32)."""
    op_tensors(("bias",), hidden=hidden, weight=weight, bias=bias, target=target, **tokens)
    tokens = {n: facts(t) for n, t in tokens.items()}
    return spec.op(facts(hidden), facts(weight), facts(bias), facts(target), op_args, chunk_size, tokens)


@torch.library.custom_op("fuselet::fused_linear_cross_entropy_reduced", mutates_args=())
def _reduced(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float,
    mean: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z, dhidden, dweight, dbias) of the summed (mean=False) or mean loss over hidden [N, H]."""
    options = _op_check(hidden, weight, bias, target, (ignore_index, label_smoothing, z_loss, softcap), chunk_size)
    ce = options.cross_entropy
    ce_args = ce.op_args()
    n, chunk_size = hidden.shape[0], _resolve(chunk_size, hidden, weight)
    scale = 1.0 / int(_counted(target, options.cross_entropy.ignore_index)) if mean else 1.0
    if not spec.one_pass_for(n, weight.shape[0], chunk_size):  # the forward, then the backward by blocks
        token_loss, token_z, lse = _token_losses(hidden, weight, bias, target, ce, chunk_size)
        g = torch.full((n,), scale, dtype=torch.float32, device=hidden.device)
        grads = _token_losses_backward(g, hidden, weight, bias, target, lse, ce, chunk_size)
        return (token_loss.sum() * scale, token_z.sum() * scale, *grads)
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    z = torch.zeros((), dtype=torch.float32, device=hidden.device)
    dhidden = torch.empty_like(hidden)
    acc, logits_of = _Accumulator(weight, bias), _Logits(hidden, weight, bias, chunk_size)
    for a, b in _chunks(n, chunk_size):
        h = hidden[a:b]
        logits = logits_of(h)
        loss_c, z_c = ops.cross_entropy_fwd_bwd_(logits, target[a:b], *ce_args, scale)
        loss += loss_c.sum()
        z += z_c.sum()
        torch.mm(logits, weight, out=dhidden[a:b])  # logits now holds dlogits
        acc.add(logits, h)
    logits = logits_of = None  # the chunk buffer goes before dweight is converted
    return (loss * scale, z * scale, dhidden, *acc.results())


@_reduced.register_fake
def _(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, mean, chunk_size):
    _op_check(hidden, weight, bias, target, (ignore_index, label_smoothing, z_loss, softcap), chunk_size)
    scalar = hidden.new_empty((), dtype=torch.float32)
    dbias = hidden.new_empty(0) if bias is None else torch.empty_like(bias)
    return scalar, torch.empty_like(scalar), torch.empty_like(hidden), torch.empty_like(weight), dbias


def _reduced_setup(ctx, inputs, output):
    # Gradients arrive for `loss` only: no zero-filled [N, H] / [V, H] stand-ins for the others.
    ctx.set_materialize_grads(False)
    ctx.has_bias = inputs[2] is not None
    ctx.save_for_backward(*output[2:])


def _scaled_gradients(ctx, dloss, inputs: int) -> tuple:
    """The gradients of a reduced loss, computed in its forward (ctx.saved_tensors: dhidden,
    dweight, dbias), times dloss; None for the other inputs of its `inputs`."""
    dhidden, dweight, dbias = ctx.saved_tensors
    return (
        dhidden * dloss.to(dhidden.dtype),
        dweight * dloss.to(dweight.dtype),
        dbias * dloss.to(dbias.dtype) if ctx.has_bias else None,
        *(None,) * (inputs - 3),
    )


def _reduced_backward(ctx, dloss, _dz, _dh, _dw, _db):
    if dloss is None:  # only z (no gradient) or the gradient outputs were used
        return (None,) * 10
    return _scaled_gradients(ctx, dloss, 10)


_reduced.register_autograd(_reduced_backward, setup_context=_reduced_setup)


@torch.library.custom_op("fuselet::fused_linear_cross_entropy_none", mutates_args=())
def _per_token(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z, lse): float32 per token of hidden [N, H]."""
    options = _op_check(hidden, weight, bias, target, (ignore_index, label_smoothing, z_loss, softcap), chunk_size)
    return _token_losses(hidden, weight, bias, target, options.cross_entropy, _resolve(chunk_size, hidden, weight))


def _token_losses(hidden, weight, bias, target, ce, chunk: int) -> tuple:
    """(loss, z, lse) float32 per row of hidden [N, H], chunk by chunk."""
    n = hidden.shape[0]
    out = [torch.empty(n, dtype=torch.float32, device=hidden.device) for _ in range(3)]
    logits_of = _Logits(hidden, weight, bias, chunk)
    for a, b in _chunks(n, chunk):
        for o, r in zip(out, ops.cross_entropy_fwd(logits_of(hidden[a:b]), target[a:b], *ce.op_args())):
            o[a:b] = r
    return tuple(out)


def _token_losses_backward(dloss, hidden, weight, bias, target, lse, ce, chunk: int) -> tuple:
    """(dhidden, dweight, dbias or an empty tensor) of sum(dloss * the per-row losses), dloss [N]
    float32, from the forward's lse (recomputed_backward)."""
    whole = _whole(weight.shape[0], chunk)

    def dlogits_(logits, a, b, block):
        if block is whole:  # every class: the kernel's own backward
            ops.cross_entropy_bwd_(dloss[a:b], logits, target[a:b], lse[a:b], *ce.op_args())
        else:
            vp.dlogits_(logits, dloss[a:b], vp.Rows(target[a:b], block, ce.ignore_index), lse[a:b], block, ce.op_args())

    if spec.vocab_block_for(hidden.shape[0], whole.vocab, whole.chunk):  # the kernel sees no target: checked here
        vp.check_targets(target, whole.vocab, ce.ignore_index)
    return recomputed_backward(hidden, weight, bias, whole, dlogits_)


@_per_token.register_fake
def _(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, chunk_size):
    _op_check(hidden, weight, bias, target, (ignore_index, label_smoothing, z_loss, softcap), chunk_size)
    return tuple(hidden.new_empty(hidden.shape[0], dtype=torch.float32) for _ in range(3))


@torch.library.custom_op("fuselet::fused_linear_cross_entropy_none_bwd", mutates_args=())
def _per_token_bwd(
    dloss: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dhidden, dweight, dbias) from the per-token upstream gradient dloss [N] (logits recomputed)."""
    options = _op_check(
        hidden, weight, bias, target, (ignore_index, label_smoothing, z_loss, softcap), chunk_size, dloss=dloss, lse=lse
    )
    dloss = dloss.to(torch.float32).contiguous()
    chunk = _resolve(chunk_size, hidden, weight)
    return _token_losses_backward(dloss, hidden, weight, bias, target, lse, options.cross_entropy, chunk)


@_per_token_bwd.register_fake
def _(dloss, hidden, weight, bias, target, lse, ignore_index, label_smoothing, z_loss, softcap, chunk_size):
    op_args = (ignore_index, label_smoothing, z_loss, softcap)
    _op_check(hidden, weight, bias, target, op_args, chunk_size, dloss=dloss, lse=lse)
    dbias = hidden.new_empty(0) if bias is None else torch.empty_like(bias)
    return torch.empty_like(hidden), torch.empty_like(weight), dbias


def _per_token_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    hidden, weight, bias, target, *ctx.options = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(hidden, weight, bias, target, output[2])


def _per_token_backward(ctx, dloss, _dz, _dlse):
    if dloss is None:
        return (None,) * 9
    hidden, weight, bias, target, lse = ctx.saved_tensors
    dhidden, dweight, dbias = _per_token_bwd(dloss, hidden, weight, bias, target, lse, *ctx.options)
    return dhidden, dweight, dbias if ctx.has_bias else None, None, None, None, None, None, None


_per_token.register_autograd(_per_token_backward, setup_context=_per_token_setup)


# --- one pass for a loss of the per-token log-probabilities whose every token's gradient depends
# on that token's own log-probability alone (spec.losses.GRPOOptions.token_separable): each
# chunk's gradient is known as soon as its log-probabilities are, so the chunk's logits become its
# dlogits in the same buffer (no second matmul of the logits in a backward, as reduction="none"
# takes). Eager only: it differentiates the loss inside its forward (torch.autograd.grad).


def _token_gradient(loss_of, logp, shape, a: int, b: int):
    """dL/dlogp of the tokens a:b, L = loss_of(logp [shape]), through autograd: logp holds the
    log-probabilities of the tokens up to b (0 for those after it, which a separable loss's
    tokens a:b do not depend on)."""
    with torch.enable_grad():
        x = logp.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss_of(x.view(shape)), x)
    return g[a:b]


class _SeparableLogpLoss(torch.autograd.Function):
    """loss_of(logp): logp the per-token log-probabilities of hidden [N, H] through the head,
    [shape] float32; the gradients are computed chunk by chunk in the forward and kept (scaled by
    the upstream gradient in the backward), each only where its input takes a gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, loss_of, shape, ce_args, chunk_size):
        n = hidden.shape[0]
        logp = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        dhidden = torch.empty_like(hidden) if hidden.requires_grad else hidden.new_empty(0)
        wants_dweight = weight.requires_grad or (bias is not None and bias.requires_grad)
        acc = _Accumulator(weight, bias) if wants_dweight else None
        logits_of = _Logits(hidden, weight, bias, chunk_size)
        for a, b in _chunks(n, chunk_size):
            h = hidden[a:b]
            logits = logits_of(h)
            nll, _, lse = ops.cross_entropy_fwd(logits, target[a:b], *ce_args)
            logp[a:b] = -nll
            dnll = -_token_gradient(loss_of, logp, shape, a, b)
            ops.cross_entropy_bwd_(dnll, logits, target[a:b], lse, *ce_args)  # logits now hold dlogits
            if hidden.requires_grad:
                torch.mm(logits, weight, out=dhidden[a:b])
            if acc is not None:
                acc.add(logits, h)
        logits = logits_of = None
        dweight, dbias = acc.results() if acc is not None else (weight.new_empty(0), weight.new_empty(0))
        ctx.set_materialize_grads(False)
        ctx.wanted = (hidden.requires_grad, acc is not None, acc is not None and bias is not None)
        ctx.save_for_backward(dhidden, dweight, dbias)
        return loss_of(logp.view(shape)).detach()

    @staticmethod
    def backward(ctx, dloss):
        if dloss is None:
            return (None,) * 8
        grads = [g * dloss.to(g.dtype) if wanted else None for g, wanted in zip(ctx.saved_tensors, ctx.wanted)]
        return (*grads, *(None,) * 5)


def separable_logp_loss(hidden, weight, target, loss_of, *, bias=None, ignore_index: int = -100, chunk_size=None):
    """loss_of(logp), logp [target's shape] float32 the log-probabilities of target under
    hidden [..., H] @ weight.T + bias (0 where target is ignore_index), in one pass over the head's
    chunks: loss_of is to be a sum over the tokens of functions of each token's own log-probability
    (spec.losses.GRPOOptions.token_separable). Dense tensors, eager; the arguments checked as
    fused_linear_cross_entropy's."""
    h2 = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    t1 = target.reshape(-1).contiguous()
    options = _op_check(h2, weight, bias, t1, (ignore_index, 0.0, 0.0, 0.0), chunk_size or 0)
    chunk = _resolve(chunk_size or 0, h2, weight)
    return _SeparableLogpLoss.apply(h2, weight, bias, t1, loss_of, tuple(target.shape), options.cross_entropy.op_args(), chunk)


# --- DTensor sharding (fuselet.torch._dtensor): tokens (hidden's and target's rows) keep their
# sharding, weight and bias are replicated (a vocab-sharded lm_head weight is gathered); the
# summed loss and dweight / dbias are Partial. The mean's scale (1 / the number of counted
# tokens) needs every shard's count: on DTensor inputs the wrapper takes the sum and divides.


@sharding("fused_linear_cross_entropy_reduced")
def _(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, mean, chunk_size):
    return rowwise(
        [(hidden, "rows"), (weight, "param"), (bias, "param"), (target, "rows"), *scalars(6)],
        [("sum", hidden), ("sum", hidden), "rows", ("sum", weight), ("sum", bias)],
        skip=(0,) if mean else (),
    )


@sharding("fused_linear_cross_entropy_none")
def _(hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, chunk_size):
    return rowwise([(hidden, "rows"), (weight, "param"), (bias, "param"), (target, "rows"), *scalars(5)], ["rows"] * 3)


@sharding("fused_linear_cross_entropy_none_bwd")
def _(dloss, hidden, weight, bias, target, lse, ignore_index, label_smoothing, z_loss, softcap, chunk_size):
    return rowwise(
        [(dloss, "rows"), (hidden, "rows"), (weight, "param"), (bias, "param"), (target, "rows"), (lse, "rows"), *scalars(5)],
        ["rows", ("sum", weight), ("sum", bias)],
    )


def _dtensor_mean(h2, weight, bias, t1, options: spec.FusedLinearCrossEntropyOptions):
    """reduction="mean" of DTensor inputs: the summed loss over the global count of counted tokens."""
    loss, z, *_ = _reduced(h2, weight, bias, t1, *options.op_args(mean=False))
    count = _counted(t1, options.cross_entropy.ignore_index)
    return loss / count, z / count


# --- vocab-parallel: the head's rows sharded over a process group (fuselet.torch._vocab_parallel).
# Each rank runs the chunks on its own rows of the head; per chunk one all-gather of [k, chunk]
# float32 statistics; dhidden all-reduced once per call, dweight / dbias the rank's own rows.


def _vp_chunk(shard: vp.Shard, n: int, h: int, chunk_size) -> vp.Shard:
    """shard with its chunk: chunk_size, or the default for the largest shard (alike on all ranks)."""
    return replace(shard, chunk=chunk_size or chunk_size_for(n, h, max(max(shard.sizes), 1)))


class _VocabParallelReduced(torch.autograd.Function):
    """(loss, z): the sum over the rows of the loss times `scale` (1, or 1 / the counted tokens);
    the gradients are computed here, chunk by chunk, and kept (scaled by dloss in the backward)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, shard, op_args, scale):
        ctx.has_bias = bias is not None
        if not spec.one_pass_for(hidden.shape[0], weight.shape[0], shard.chunk):  # the forward, then by blocks
            token_loss, token_z, lse = _vp_token_losses(hidden, weight, bias, target, shard, op_args)
            g = torch.full((hidden.shape[0],), scale, dtype=torch.float32, device=hidden.device)
            ctx.save_for_backward(*_vp_token_losses_backward(g, hidden, weight, bias, target, lse, shard, op_args))
            z = token_z.sum() * scale
            ctx.mark_non_differentiable(z)
            return token_loss.sum() * scale, z
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        z = torch.zeros((), dtype=torch.float32, device=hidden.device)
        dhidden = torch.empty_like(hidden)
        acc, logits_of = _Accumulator(weight, bias), _Logits(hidden, weight, bias, shard.chunk)
        for a, b in _chunks(hidden.shape[0], shard.chunk):
            h = hidden[a:b]
            logits = logits_of(h)
            rows = vp.Rows(target[a:b], shard, op_args[0])
            loss_c, z_c, lse = vp.combine(logits, rows, shard, op_args)
            loss += loss_c.sum()
            z += z_c.sum()
            g = torch.full((b - a,), scale, dtype=torch.float32, device=hidden.device)
            vp.dlogits_(logits, g, rows, lse, shard, op_args)
            torch.mm(logits, weight, out=dhidden[a:b])
            acc.add(logits, h)
        logits = logits_of = None
        vp.all_reduce_(dhidden, shard)
        dweight, dbias = acc.results()
        ctx.save_for_backward(dhidden, dweight, dbias)
        ctx.mark_non_differentiable(z)
        return loss * scale, z * scale

    @staticmethod
    def backward(ctx, dloss, _dz):
        return _scaled_gradients(ctx, dloss, 7)


class _VocabParallelNone(torch.autograd.Function):
    """(loss, z) per row; the forward keeps the global lse [N], the backward recomputes each
    chunk's local logits (no collective but dhidden's all-reduce)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, shard, op_args):
        loss, z, lse = _vp_token_losses(hidden, weight, bias, target, shard, op_args)
        ctx.shard, ctx.op_args, ctx.has_bias = shard, op_args, bias is not None
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, dloss, _dz):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        dloss = dloss.to(torch.float32).contiguous()
        grads = _vp_token_losses_backward(dloss, hidden, weight, bias, target, lse, ctx.shard, ctx.op_args)
        return grads[0], grads[1], grads[2] if ctx.has_bias else None, None, None, None


def _vp_token_losses(hidden, weight, bias, target, shard: vp.Shard, op_args) -> tuple:
    """(loss, z, lse) float32 per row, alike on every rank: one all-gather per chunk."""
    n = hidden.shape[0]
    loss, z, lse = (torch.empty(n, dtype=torch.float32, device=hidden.device) for _ in range(3))
    logits_of = _Logits(hidden, weight, bias, shard.chunk)
    for a, b in _chunks(n, shard.chunk):
        rows = vp.Rows(target[a:b], shard, op_args[0])
        loss[a:b], z[a:b], lse[a:b] = vp.combine(logits_of(hidden[a:b]), rows, shard, op_args)
    return loss, z, lse


def _vp_token_losses_backward(dloss, hidden, weight, bias, target, lse, shard: vp.Shard, op_args) -> tuple:
    """(dhidden all-reduced, this rank's dweight, dbias or an empty tensor) of sum(dloss * the
    per-row losses), dloss [N] float32: no collective but dhidden's all-reduce."""

    def dlogits_(logits, a, b, block):
        vp.dlogits_(logits, dloss[a:b], vp.Rows(target[a:b], block, op_args[0]), lse[a:b], block, op_args)

    dhidden, dweight, dbias = recomputed_backward(hidden, weight, bias, shard, dlogits_)
    return vp.all_reduce_(dhidden, shard), dweight, dbias


def _vocab_parallel(h2, weight, bias, t1, shard: vp.Shard, options, reduction: str):
    """(loss, z) of this rank's tensors: h2 [N, H] and t1 [N] alike on every rank, weight [V_r, H]
    and bias [V_r] its rows of the head."""
    ce = options.cross_entropy
    vp.check_targets(t1, shard.vocab, ce.ignore_index)
    shard = _vp_chunk(shard, h2.shape[0], h2.shape[1], options.chunk_size)
    if reduction == "none":
        return _VocabParallelNone.apply(h2, weight, bias, t1, shard, ce.op_args())
    scale = 1.0 / int(_counted(t1, ce.ignore_index)) if reduction == "mean" else 1.0
    return _VocabParallelReduced.apply(h2, weight, bias, t1, shard, ce.op_args(), scale)


def _plain_vocab_parallel(h2, weight, bias, t1, process_group, options, reduction: str):
    """The process_group door: this rank's rows of the head, the tokens alike on every rank."""
    ce = options.cross_entropy
    fields = {
        "hidden: the tokens [N, H], alike on every rank": tuple(h2.shape),
        "hidden: its dtype": vp.DTYPES.index(h2.dtype),
        "bias: given or None": bias is not None,
        "chunk_size": options.chunk_size or 0,
        "ignore_index": int(ce.ignore_index),
        "label_smoothing": float(ce.label_smoothing),
        "z_loss": float(ce.z_loss),
        "softcap": float(ce.softcap or 0.0),
        "reduction": ("none", "sum", "mean").index(reduction),
    }
    shard = vp.agree(process_group, weight.shape[0], fields, h2.device)
    return _vocab_parallel(h2, weight, bias, t1, shard, options, reduction)


def _vocab_dim(weight) -> int | None:
    """The mesh dim over which a DTensor weight is Shard(0) (its vocabulary rows), or None."""
    if not is_dtensor(weight):
        return None
    _, Shard, _ = placements()
    dims = [d for d, p in enumerate(weight.placements) if isinstance(p, Shard) and p.dim == 0]
    if len(dims) > 1:
        raise ValueError(
            f"weight: expected Shard(0) on at most one mesh dimension (the tensor-parallel one), "
            f"got placements {tuple(weight.placements)}"
        )
    return dims[0] if dims else None


def _dtensor_vocab_parallel(h2, weight, bias, t1, options, reduction: str, d: int):
    """DTensor inputs with the head Shard(0) on mesh dim d: kept sharded (local_map over the
    plain door, group = the mesh's dim d). hidden / target are replicated over d; over the other
    dims their rows keep a Shard(0) (the loss is then Partial there, dweight / dbias too). A
    hidden Shard(0) over d itself (sequence parallel) is gathered for the loss, and its gradient
    goes back as each rank's share (Partial over d), which DTensor reduce-scatters to Shard(0)."""
    from torch.distributed.tensor.experimental import local_map

    lay = vp.mesh_layout(h2, weight, d)
    mean_here = reduction == "mean" and not any(lay.split)
    local_reduction = "sum" if reduction == "mean" and not mean_here else reduction
    out = lay.rows if reduction == "none" else lay.summed

    def local(h, w, t, b=None):
        return _vocab_parallel(h, w, b, t, lay.shard(weight=w), options, local_reduction)

    args = (h2, weight, t1) + (() if bias is None else (bias,))
    loss, z = local_map(
        local,
        out_placements=(out, out),  # a tuple: one placement list per output
        in_placements=(lay.rows, lay.head, lay.rows) + (() if bias is None else (lay.head,)),
        in_grad_placements=(lay.drows, lay.dhead, lay.rows) + (() if bias is None else (lay.dhead,)),
        device_mesh=lay.mesh,
        redistribute_inputs=True,
    )(*args)
    if reduction == "mean" and not mean_here:
        count = _counted(t1, options.cross_entropy.ignore_index)
        return loss / count, z / count
    return loss, z


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    reduction: str = "mean",
    return_z_loss: bool = False,
    chunk_size: int | None = None,
    process_group=None,
):
    """cross_entropy(hidden @ weight.T + bias, target, ...) without materializing the logits.

    hidden [..., H], weight [V, H] (torch.nn.Linear's layout), bias [V] or None, all of one dtype
    (float32, float16 or bfloat16); target hidden.shape[:-1] of int64 / int32 class ids. The
    options are cross_entropy's. chunk_size: tokens per chunk (None: chunk_size_for(N, H, V)).
    Returns the float32 loss (target's shape for reduction="none"), and with return_z_loss=True
    (loss, z), z the z-loss part alone for logging (no gradient flows through z).

    Under torch.autocast, hidden, weight and bias are cast to autocast's dtype first, as the
    torch.nn.Linear this replaces would cast them (its logits are a matmul's; the loss is float32
    math either way), and their gradients flow back in their own dtypes."""
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias), ("target", target)):
        check_dense(name, t, optional=name == "bias")
    if hidden.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(hidden.device.type):
        low = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight, bias = (t.to(low) if t is not None and t.is_floating_point() else t for t in (hidden, weight, bias))
    options = spec.fused_linear_cross_entropy(
        facts(hidden),
        facts(weight),
        facts(bias),
        facts(target),
        chunk_size,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        softcap=softcap,
        reduction=reduction,
        return_z_loss=return_z_loss,
    )
    check_same_device("hidden", hidden, weight=weight, bias=bias, target=target)
    vp.check_group(process_group)
    check_dtensors(hidden=hidden, weight=weight, bias=bias, target=target)
    vocab_dim = _vocab_dim(weight)
    if process_group is not None and is_dtensor(weight):
        raise ValueError("process_group: expected None for DTensor inputs (the weight's device mesh gives the group)")
    shape, h_dim = target.shape, hidden.shape[-1]
    h2 = hidden.reshape(-1, h_dim).contiguous()
    t1 = target.reshape(-1).contiguous()
    weight = weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    if process_group is not None or vocab_dim is not None:
        if process_group is not None:
            loss, z = _plain_vocab_parallel(h2, weight, bias, t1, process_group, options, reduction)
        else:
            loss, z = _dtensor_vocab_parallel(h2, weight, bias, t1, options, reduction, vocab_dim)
        if reduction == "none":
            loss, z = loss.reshape(shape), z.reshape(shape)
        return (loss, z.detach()) if return_z_loss else loss
    # chunk_size None is the ops' 0: chunk_size_for(N, H, V), decided by the op (_resolve)
    if reduction == "none":
        loss, z, _ = _per_token(h2, weight, bias, t1, *options.op_args())
        loss, z = loss.reshape(shape), z.reshape(shape)
    elif reduction == "mean" and is_dtensor(h2):
        loss, z = _dtensor_mean(h2, weight, bias, t1, options)
    else:
        loss, z, *_ = _reduced(h2, weight, bias, t1, *options.op_args(mean=reduction == "mean"))
    return (loss, z.detach()) if return_z_loss else loss
