"""Per-token log-probabilities of `hidden @ weight.T + bias` for JAX, and the entropy and statistics
of each token's distribution, without the [tokens, V] logits (as fuselet.torch's
fused_linear_logprobs).

The tokens are taken chunk by chunk (fused_linear_cross_entropy's lax.scan over whole chunks, then
the remainder): each chunk's logits from XLA's matmul, fuselet's logprobs kernel turns them into
the per-token outputs; the backward (custom_vjp) recomputes each chunk's logits from hidden,
weight and the forward's float32 lse and entropy, turns them into dlogits of the log-probabilities
and the entropy, and accumulates dhidden and the float32 dweight / dbias. Rules:
fuselet/spec/fused_linear_logprobs.py.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fuselet.jax import _vocab_parallel as vp
from fuselet.jax import _vocab_parallel_logprobs as vpl
from fuselet.jax._checks import array_facts
from fuselet.jax._sharding import vary_like, varying_axes
from fuselet.jax.cross_entropy import _target_errors, logprobs_chunk, logprobs_chunk_grad
from fuselet.jax.fused_linear_cross_entropy import _accumulate, _dhidden, _logits, _over_chunks, _with_heads, _zeros
from fuselet.spec import fused_linear_logprobs as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for


class LogProbs(NamedTuple):
    """The per-token outputs, target's shape each (None where not asked for): log_probs and entropy
    float32 with gradients; log_sum_sq_probs (log sum_v p_v^2) and mean_logits float32, is_top1
    bool (whether the target is the argmax), without. 0 (False) where the target is ignore_index."""

    log_probs: jax.Array
    entropy: jax.Array | None = None
    log_sum_sq_probs: jax.Array | None = None
    mean_logits: jax.Array | None = None
    is_top1: jax.Array | None = None


def _fwd(h, w, b, t, options: spec.FusedLinearLogProbsOptions, chunk):
    ignore_index, softcap, _, _ = options.op_args()
    asked = options.outputs - {"log_probs"}
    names = ("log_probs", "lse", *sorted(asked))

    def loop(w_mm):
        def body(carry, xs):
            h_i, t_i = xs
            got = logprobs_chunk(_logits(h_i, w_mm, b), t_i, ignore_index=ignore_index, softcap=softcap or None, outputs=asked)
            return carry, tuple(got[name] for name in names)

        return _over_chunks(body, (), (h, t), chunk)[1]

    values = _with_heads(loop, w)
    out = dict(zip(names, values))
    lse = out.pop("lse")
    return out, (h, w, b, t, lse, out.get("entropy"))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _logprobs(h, w, b, t, options, chunk, axis=None, vocab_size=None):
    return _fwd_partitioned(h, w, b, t, options, chunk, axis, vocab_size)[0]


def _bwd(options, chunk, res, g):
    h, w, b, t, lse, entropy = res
    ignore_index, softcap, _, _ = options.op_args()
    dlogp = g["log_probs"].astype(jnp.float32)
    dentropy = None if entropy is None else g["entropy"].astype(jnp.float32)

    def loop(w_mm):
        def body(carry, xs):
            h_i, t_i, l_i, e_i, gl_i, ge_i = xs
            dl = logprobs_chunk_grad(
                _logits(h_i, w_mm, b),
                t_i,
                l_i,
                e_i,
                gl_i,
                ge_i if entropy is not None else None,
                ignore_index=ignore_index,
                softcap=softcap or None,
            )
            return _accumulate(carry, dl, h_i, b), (_dhidden(dl, w_mm),)

        return _over_chunks(body, lambda: _zeros(w, b), xs, chunk)

    zero = jnp.zeros_like(lse)
    xs = (h, t, lse, zero if entropy is None else entropy, dlogp, zero if dentropy is None else dentropy)
    (dw, db), (dh,) = _with_heads(loop, w)
    return dh, dw.astype(w.dtype), None if b is None else db.astype(b.dtype), None


# Sharded (fuselet.jax._vocab_parallel_logprobs, docs/tensor_parallel.md): _fwd and _bwd are one
# device's loops over whole heads; each device runs them over its own tokens, or with the head
# sharded on V the vocab-parallel loop over its own classes (the head never gathered). With axis
# (inside the caller's shard_map) each device runs the vocab-parallel loop over its tokens and its
# block of the classes over axis.


def _fwd_partitioned(h, w, b, t, options, chunk, axis=None, vocab_size=None):
    out, lse = vpl.forward(_fwd, h, w, b, t, options, chunk, axis, vocab_size)
    return out, (h, w, b, t, lse, out.get("entropy"))


def _bwd_partitioned(options, chunk, axis, vocab_size, res, g):
    h, w, b, t, lse, entropy = res
    dentropy = None if entropy is None else g["entropy"]
    grads = vpl.backward(_bwd, options, chunk, h, w, b, t, lse, entropy, g["log_probs"], dentropy, axis, vocab_size)
    return (*grads, None)


_logprobs.defvjp(_fwd_partitioned, _bwd_partitioned)
# Jitted so that an eager call runs as one computation (inside jit it is inlined).
_logprobs_jit = jax.jit(_logprobs, static_argnums=(4, 5))


def fused_linear_logprobs(
    hidden,
    weight,
    target,
    *,
    bias=None,
    temperature: float = 1.0,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    outputs: tuple[str, ...] = ("log_probs",),
    chunk_size: int | None = None,
    axis_name=None,
    vocab_size: int | None = None,
) -> LogProbs:
    """The log-probability of each target token under the logits
    `softcap(logit_scale * (hidden @ weight.T + bias)) / temperature` (softcap c: c * tanh(x / c)),
    without materializing them, and the other per-token `outputs`: "entropy" (of the token's
    distribution, with its gradient), "log_sum_sq_probs", "mean_logits" (of those logits),
    "is_top1"; log_probs always. hidden [..., H], weight [V, H], bias [V] or None, one float dtype;
    target hidden.shape[:-1] of int32 class ids (int64 with x64). Returns LogProbs, each output
    target's shape, 0 where the target is ignore_index. chunk_size: tokens per chunk (None:
    chunk_size_for(N, H, V)).

    hidden and bias are multiplied by logit_scale / temperature before the matmul (no [tokens, V]
    copy), which rounds them once to their dtype where it is not float32.

    Under jax.jit, a weight (and bias) sharded on V over mesh axes stays sharded: each device
    computes the logits of its classes only, the outputs combined over those axes
    (docs/tensor_parallel.md). Inside shard_map, axis_name (a mesh axis name or a tuple of them)
    says that weight and bias are this device's block of the classes over that axis, in axis
    order, target holding global class ids: the outputs and hidden's gradient are the whole
    head's (alike on every device of the axis), the weight's gradient this block's. vocab_size
    (with axis_name): the real V where the blocks are padded (the classes from vocab_size on are
    ignored); None: V_r times the axis size."""
    options = spec.fused_linear_logprobs(
        array_facts("hidden", hidden),
        array_facts("weight", weight),
        array_facts("bias", bias, optional=True),
        array_facts("target", target),
        temperature=temperature,
        logit_scale=logit_scale,
        softcap=softcap,
        ignore_index=ignore_index,
        outputs=outputs,
        chunk_size=chunk_size,
    )
    shape, h_dim = target.shape, hidden.shape[-1]
    chunk = chunk_size or chunk_size_for(math.prod(shape), h_dim, weight.shape[0])
    h2 = hidden.reshape(-1, h_dim)
    if options.scale != 1.0:
        h2 = (h2 * options.scale).astype(hidden.dtype)
        bias = None if bias is None else (bias * options.scale).astype(bias.dtype)
    axis = vp.check_axis_name(axis_name)
    vocab_size = vp.check_vocab_size(vocab_size, axis, weight.shape[0])
    if axis is not None:  # inside the caller's shard_map: no jit of our own
        # The head's gradient is summed over the axes the tokens vary over (the transpose of this
        # cast); hidden's over the classes' axes inside (psum).
        varying = varying_axes(h2, target) - frozenset(axis)
        weight, bias = vary_like(varying, weight), vary_like(varying, bias)
        out = _logprobs(h2, weight, bias, target.reshape(-1), options, chunk, axis, vocab_size)
    else:
        vp.refuse_targets(target, weight, 0, weight.shape[0], options.ignore_index)
        out = _target_errors(target, lambda: _logprobs_jit(h2, weight, bias, target.reshape(-1), options, chunk))
    got = {}
    for name, value in out.items():
        value = value.reshape(shape)
        got[name] = value if name in ("log_probs", "entropy") else jax.lax.stop_gradient(value)
    return LogProbs(**got)
