"""Cross-entropy loss for JAX: FFI calls wrapped in custom_vjp (and custom_vmap), the fused
fwd_bwd helper; the per-token log-probabilities of a chunk of logits (logprobs_chunk,
logprobs_chunk_grad).

Math and shapes: csrc/core/include/fuselet/cross_entropy.h. logits [..., V] (float32, float16,
bfloat16), target logits.shape[:-1] (int32; int64 with jax x64 on). Per token with
target != ignore_index: ce = (1 - ls) (lse - s_t) + ls (lse - mean(s)), loss = ce + z_loss lse^2,
s = softcap * tanh(logits / softcap) with a softcap, else the logits. Ignored tokens give 0 and
no gradient. Losses are float32; the forward keeps only a float32 lse per token for the
backward. fwd_bwd's dlogits may reuse the logits' buffer (input_output_aliases). The reduction
("mean" over the non-ignored tokens, "sum", "none") is one jnp.sum over the per-token values:
with row-sharded logits, one all-reduce.

Logits sharded on V (the last dim) stay so: each device runs the vocab-parallel math
(_vocab_parallel) on its block of the classes, combining per-row float32 statistics over the
axes of V (a pmax and a psum per call); the backward needs no collective and dlogits keeps the
logits' sharding. Inside a user's shard_map, axis_name= names those axes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fuselet.jax import _vocab_parallel as vp
from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import row_op
from fuselet.jax._sharding import ROWS, STATS
from fuselet.spec import cross_entropy as spec


def _attrs(options: spec.CrossEntropyOptions) -> dict:
    """The FFI attributes of the options (passed to the jitted functions whole: static, hashable)."""
    ignore_index, label_smoothing, z_loss, softcap = options.op_args()
    return {
        "ignore_index": np.int64(ignore_index),
        "label_smoothing": np.float32(label_smoothing),
        "z_loss": np.float32(z_loss),
        "softcap": np.float32(softcap),
    }


def _op_args(attrs: dict) -> tuple:
    return int(attrs["ignore_index"]), float(attrs["label_smoothing"]), float(attrs["z_loss"]), float(attrs["softcap"])


def _offset(axes, logits):
    return vp.index(axes) * logits.shape[-1]


# Each device's block of logits sharded on V (see _sharding.row_partitioned's sharded_last).
def _vp_fwd(axes, vocab, attrs, logits, target):
    return vp.stats(logits, target, _op_args(attrs), axes, vocab, _offset(axes, logits))


def _vp_bwd(axes, vocab, attrs, dloss, logits, target, lse):
    return (vp.dlogits(logits, target, dloss, lse, _op_args(attrs), vocab, _offset(axes, logits)),)


def _vp_fwd_bwd(axes, vocab, attrs, logits, target):
    op_args, offset = _op_args(attrs), _offset(axes, logits)
    loss, z, lse = vp.stats(logits, target, op_args, axes, vocab, offset)
    g = jnp.full(loss.shape, attrs["grad_scale"], jnp.float32)
    return loss, z, vp.dlogits(logits, target, g, lse, op_args, vocab, offset)


def _fwd_call(logits, target, options):
    return row_op(
        "cross_entropy_fwd", (ROWS, STATS), (STATS, STATS, STATS), (logits, target), True, sharded_last=_vp_fwd, **_attrs(options)
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _per_token(logits, target, options):
    loss, z, _ = _fwd_call(logits, target, options)
    return loss, z


def _per_token_fwd(logits, target, options):
    loss, z, lse = _fwd_call(logits, target, options)
    return (loss, z), (logits, target, lse)


def _per_token_bwd(options, res, cts):
    logits, target, lse = res
    dloss, _ = cts  # z is for logging: no gradient flows through it
    # No input_output_aliases here: where the logits are still live (a jit argument that is not
    # donated, as in jax.grad of the loss with respect to the logits themselves) XLA copies
    # them first, which measured 2-3x the backward's own time (8192 x 32768 float32 on the
    # CPU); where they are dead (an intermediate), XLA may reuse their buffer unasked.
    return _bwd_call(dloss, logits, target, lse, options), None


def _bwd_call(dloss, logits, target, lse, options):
    return row_op(
        "cross_entropy_bwd",
        (STATS, ROWS, STATS, STATS),
        (ROWS,),
        (dloss, logits, target, lse),
        True,
        sharded_last=_vp_bwd,
        **_attrs(options),
    )[0]


_per_token.defvjp(_per_token_fwd, _per_token_bwd)


# --- inside the caller's shard_map, the classes over axis (axis_name=) ------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _per_token_axis(logits, target, options, axis, vocab):
    return _per_token_axis_fwd(logits, target, options, axis, vocab)[0]


def _per_token_axis_fwd(logits, target, options, axis, vocab):
    loss, z, lse = vp.stats(logits, target, options.op_args(), axis, vocab, _offset(axis, logits))
    return (loss, z), (logits, target, lse)


def _per_token_axis_bwd(options, axis, vocab, res, cts):
    logits, target, lse = res
    return vp.dlogits(logits, target, cts[0], lse, options.op_args(), vocab, _offset(axis, logits)), None


_per_token_axis.defvjp(_per_token_axis_fwd, _per_token_axis_bwd)


def _valid(target, ignore_index):
    info = jnp.iinfo(target.dtype)
    if not info.min <= ignore_index <= info.max:  # no target can equal it
        return jnp.ones(target.shape, jnp.float32)
    return (target != ignore_index).astype(jnp.float32)


def _reduced(logits, target, options, axis=None, vocab=None):
    reduction, return_z_loss = options.reduction, options.return_z_loss
    if axis is None:
        loss, z = _per_token(logits, target, options)
    else:
        loss, z = _per_token_axis(logits, target, options, axis, vocab)
    z = jax.lax.stop_gradient(z)
    if reduction == "none":
        return (loss, z) if return_z_loss else loss
    parts = [loss, z] if return_z_loss else [loss]
    if reduction == "mean":
        parts.append(_valid(target, options.ignore_index))
    # One reduction over the token axes of the stacked values: one all-reduce when sharded.
    sums = jnp.sum(jnp.stack(parts), axis=tuple(range(1, loss.ndim + 1)))
    if reduction == "mean":
        sums = sums[:-1] / jnp.maximum(sums[-1], 1.0)  # 0 tokens: 0, not NaN
    return (sums[0], sums[1]) if return_z_loss else sums[0]


# Jitted so that an eager call with sharded logits is partitioned too (inside jit it is inlined).
_reduced_jit = jax.jit(_reduced, static_argnums=(2,))


def cross_entropy(
    logits,
    target,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    reduction: str = "mean",
    return_z_loss: bool = False,
    axis_name=None,
    vocab_size: int | None = None,
):
    """Cross-entropy of logits [..., V] against target (logits.shape[:-1]), reduced by `reduction`.

    z_loss adds z_loss * lse^2 per token; softcap first maps the logits to softcap * tanh(logits /
    softcap). return_z_loss=True returns (loss, z), z the z-loss part alone, reduced the same way
    (for logging: no gradient flows through it). A target outside [0, V) that is not
    ignore_index raises on the CPU (the CUDA kernel gives NaN for that token; so does the
    vocab-parallel path under jit: an eager call on the CPU raises there too).

    Logits sharded on V under jax.jit stay sharded (docs/tensor_parallel.md). Inside shard_map,
    axis_name (a mesh axis name or a tuple of them) says that logits [..., V_r] are this device's
    block of the classes over that axis, in axis order, target holding global class ids; the
    loss is the whole vocabulary's, alike on every device of the axis, the logits' gradient this
    block's. vocab_size (with axis_name): the real V where the blocks are padded; None: V_r times
    the axis size."""
    options = spec.cross_entropy(
        array_facts("logits", logits),
        array_facts("target", target),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        softcap=softcap,
        reduction=reduction,
        return_z_loss=return_z_loss,
    )
    axis = vp.check_axis_name(axis_name)
    vocab_size = vp.check_vocab_size(vocab_size, axis, logits.shape[-1])
    if axis is not None:  # inside the caller's shard_map: no jit of our own
        return _reduced(logits, target, options, axis, vocab_size or logits.shape[-1] * vp.axis_size(axis))
    vp.refuse_targets(target, logits, -1, logits.shape[-1], options.ignore_index)
    return _target_errors(target, lambda: _reduced_jit(logits, target, options))


def _target_errors(target, call):
    """call(); in an eager call on the CPU, the kernel's refusal of an out-of-range target
    raised as the ValueError it is (waiting for the result; traced calls, and other
    platforms, keep XLA's asynchronous error)."""
    if isinstance(target, jax.core.Tracer):
        return call()
    platforms = {d.platform for d in target.devices()} if isinstance(target, jax.Array) else {jax.default_backend()}
    if platforms != {"cpu"}:
        return call()
    try:
        return jax.block_until_ready(call())
    except jax.errors.JaxRuntimeError as exc:
        message = str(exc)
        if "fuselet: target: element" not in message:
            raise
        raise ValueError(message[message.index("fuselet: target: element") :].splitlines()[0]) from None


def _fwd_bwd(logits, target, options, grad_scale):
    return row_op(
        "cross_entropy_fwd_bwd",
        (ROWS, STATS),
        (STATS, STATS, ROWS),
        (logits, target),
        True,
        aliases=((0, 2),),
        sharded_last=_vp_fwd_bwd,
        grad_scale=np.float32(grad_scale),
        **_attrs(options),
    )


_fwd_bwd_jit = jax.jit(_fwd_bwd, static_argnums=(2, 3))


def fwd_bwd(
    logits,
    target,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    grad_scale: float = 1.0,
):
    """(loss, z, dlogits) in one pass over the logits, no custom_vjp: the per-token float32 loss
    and z-loss part (target's shape, 0 where ignored) and dlogits = grad_scale * d loss_token /
    d logits in logits' dtype, written into the logits' buffer where XLA can (logits made in the
    same jit, e.g. one chunk's h @ W, or donated; logits still live elsewhere are copied first).
    grad_scale is a Python float (a compile-time attribute)."""
    options = spec.cross_entropy(
        array_facts("logits", logits),
        array_facts("target", target),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        softcap=softcap,
    )
    scale = spec.grad_scale(grad_scale)
    return _target_errors(target, lambda: _fwd_bwd_jit(logits, target, options, scale))


# --- the log-probabilities of a chunk of logits (fuselet_logprobs_*): pure functions, no
# custom_vjp, called chunk by chunk by the fused-linear log-probabilities ------------------------


def _logprobs_attrs(op_args: tuple) -> dict:
    ignore_index, softcap = op_args
    return {"ignore_index": np.int64(ignore_index), "softcap": np.float32(softcap)}


def _logprobs_fwd(logits, target, op_args):
    return row_op("logprobs_fwd", (ROWS, STATS), (STATS,) * 6, (logits, target), True, **_logprobs_attrs(op_args))


def _logprobs_bwd(dlogp, dentropy, logits, target, lse, entropy, op_args):
    return row_op(
        "logprobs_bwd",
        (STATS, STATS, ROWS, STATS, STATS, STATS),
        (ROWS,),
        (dlogp, dentropy, logits, target, lse, entropy),
        True,
        aliases=((2, 0),),
        **_logprobs_attrs(op_args),
    )[0]


_logprobs_fwd_jit = jax.jit(_logprobs_fwd, static_argnums=(2,))
_logprobs_bwd_jit = jax.jit(_logprobs_bwd, static_argnums=(6,))


def logprobs_chunk(logits, target, *, ignore_index, softcap, outputs) -> dict:
    """Per-token log-probabilities of logits [..., V] at target (logits.shape[:-1]):
    {"log_probs": s_t - lse, "lse": lse} (float32, target's shape; 0 where target ==
    ignore_index), plus the names of `outputs` asked for among "entropy" (lse - sum p s),
    "log_sum_sq_probs" (log sum p^2), "mean_logits" (mean s) (float32) and "is_top1" (bool:
    target is the argmax of s, ties to the lowest index). s = softcap * tanh(logits / softcap)
    with a softcap, else the logits; p = softmax(s). lse and entropy are the inputs of
    logprobs_chunk_grad. No custom_vjp: the gradient is logprobs_chunk_grad's."""
    options = spec.logprobs(
        array_facts("logits", logits), array_facts("target", target), ignore_index=ignore_index, softcap=softcap, outputs=outputs
    )
    op_args = options.op_args()[:2]
    logp, lse, entropy, lssp, mean, top1 = _target_errors(target, lambda: _logprobs_fwd_jit(logits, target, op_args))
    result = {"log_probs": logp, "lse": lse}
    for name, value in (("entropy", entropy), ("log_sum_sq_probs", lssp), ("mean_logits", mean), ("is_top1", top1 != 0)):
        if name in options.outputs:
            result[name] = value
    return result


def logprobs_chunk_grad(logits, target, lse, entropy, dlogp, dentropy, *, ignore_index, softcap):
    """dlogits (logits' shape and dtype) of sum(dlogp * log_probs + dentropy * entropy)
    (logprobs_chunk's): dlogp, dentropy per token (target's shape; None for 0), lse and entropy
    logprobs_chunk's (entropy needed with dentropy, else may be None). XLA may write dlogits into
    the logits' buffer where they are dead after the call (made in the same jit, or donated)."""
    options = spec.logprobs(
        array_facts("logits", logits), array_facts("target", target), ignore_index=ignore_index, softcap=softcap
    )
    op_args = options.op_args()[:2]
    dlogp, dentropy = (None if g is None else jnp.asarray(g, jnp.float32) for g in (dlogp, dentropy))
    given = {"lse": lse, "entropy": entropy, "dlogp": dlogp, "dentropy": dentropy}
    spec.logprobs_op(
        array_facts("logits", logits),
        array_facts("target", target),
        op_args,
        {n: array_facts(n, a) for n, a in given.items() if a is not None},
    )
    zeros = jnp.zeros(target.shape, jnp.float32)
    dlogp = zeros if dlogp is None else dlogp
    entropy = zeros if dentropy is None else entropy  # read with dentropy alone
    dentropy = zeros if dentropy is None else dentropy
    return _target_errors(target, lambda: _logprobs_bwd_jit(dlogp, dentropy, logits, target, lse, entropy, op_args))


# fuselet.<layer>.cross_entropy is the function above (the package exports it over this
# module's name): the helpers are reachable as fuselet.<layer>.cross_entropy.fwd_bwd (and
# .logprobs_chunk, .logprobs_chunk_grad) too.
cross_entropy.fwd_bwd = fwd_bwd
cross_entropy.logprobs_chunk = logprobs_chunk
cross_entropy.logprobs_chunk_grad = logprobs_chunk_grad
