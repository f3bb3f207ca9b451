"""Divergences for JAX (distillation losses): kl_div, jsd, tvd over one FFI pair wrapped in
custom_vjp (and custom_vmap).

Math and shapes: csrc/core/include/fuselet/divergence.h. input and target [..., V] of one shape
and dtype (float32, float16, bfloat16): input the log-probabilities log Q of the model being
trained (what jax.nn.log_softmax gives), target those of the reference log P (for kl_div with
log_target=False, its probabilities P). The kernel sums each row into one float32 loss; the
reductions run here, around it, as in fuselet.torch: kl_div as torch.nn.functional.kl_div
("batchmean" = sum / input.shape[0], "sum", "mean" = sum / input.size, "none" the elementwise
loss in jnp), jsd and tvd the mean over the rows whose label is not ignore_index (all rows without
labels; 0 kept rows give 0). Losses are float32. The backward computes target's gradient in a
call of its own, which XLA drops under jit when nothing uses it (a teacher under stop_gradient).
The leading dims keep their sharding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import row_op
from fuselet.jax._sharding import ROWS, STATS
from fuselet.spec import divergence as spec


def _attrs(options: spec.DivergenceOptions) -> dict:
    """The FFI attributes of the options (passed to the jitted functions whole: static)."""
    kind, log_target, beta = options.op_args()
    return {"kind": np.int32(kind), "log_target": np.int32(log_target), "beta": np.float32(beta)}


def _fwd_call(input, target, options):
    return row_op("divergence_fwd", (ROWS, ROWS), (STATS,), (input, target), True, **_attrs(options))[0]


def _bwd_call(dloss, input, target, options, wrt_target):
    return row_op(
        "divergence_bwd",
        (STATS, ROWS, ROWS),
        (ROWS,),
        (dloss, input, target),
        True,
        wrt_target=np.int32(wrt_target),
        **_attrs(options),
    )[0]


def _logits_call(input, target, dloss, options, scale):
    """(the loss per row, input's gradient) of divergence_logits: one pass over the logits input and
    target (times scale) of fused_linear_jsd's chunks. The gradient may reuse input's buffer."""
    return row_op(
        "divergence_logits",
        (ROWS, ROWS, STATS),
        (STATS, ROWS),
        (input, target, dloss),
        True,
        aliases=((0, 1),),
        scale=np.float32(scale),
        **_attrs(options),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _per_row(input, target, options):
    return _fwd_call(input, target, options)


def _per_row_fwd(input, target, options):
    return _fwd_call(input, target, options), (input, target)


def _per_row_bwd(options, res, dloss):
    input, target = res
    return _bwd_call(dloss, input, target, options, 0), _bwd_call(dloss, input, target, options, 1)


_per_row.defvjp(_per_row_fwd, _per_row_bwd)


def _kept_mean(rows, labels, ignore_index):
    if labels is None:
        return jnp.sum(rows) / max(rows.size, 1)
    info = jnp.iinfo(labels.dtype)
    if not info.min <= ignore_index <= info.max:  # no label can equal it
        return jnp.sum(rows) / max(rows.size, 1)
    keep = labels != ignore_index
    return jnp.sum(jnp.where(keep, rows, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def _reduced(input, target, labels, options: spec.DivergenceOptions):
    if options.reduction == "none":  # kl_div's elementwise loss: as large as the input, nothing to fuse
        x, t = input.astype(jnp.float32), target.astype(jnp.float32)
        if options.log_target:
            return jnp.exp(t) * (t - x)
        return jax.scipy.special.xlogy(t, t) - t * x
    rows = _per_row(input, target, options)
    if options.op != "kl_div":
        return _kept_mean(rows, labels, options.ignore_index)
    total = jnp.sum(rows)
    if options.reduction == "sum":
        return total
    return total / (input.shape[0] if options.reduction == "batchmean" else input.size)


# Jitted so that an eager call with sharded input is partitioned too (inside jit it is inlined).
_reduced_jit = jax.jit(_reduced, static_argnums=(3,))


def kl_div(input, target, *, log_target: bool = False, reduction: str = "batchmean"):
    """KL(P || Q) = sum P (log P - input) per row: torch.nn.functional.kl_div's math and
    reductions, the rows summed by one fused kernel."""
    options = spec.kl_div(array_facts("input", input), array_facts("target", target), log_target, reduction)
    return _reduced_jit(input, target, None, options)


def jsd(input, target, *, beta: float = 0.5, labels=None, ignore_index: int = -100):
    """Generalized Jensen-Shannon divergence of student log-probabilities `input` (log Q) and
    teacher ones `target` (log P), per row beta KL(P || M) + (1 - beta) KL(Q || M), M = beta P +
    (1 - beta) Q; beta = 0 is the forward KL(P || Q), beta = 1 the reverse KL(Q || P). The mean over
    the rows whose label (labels, input.shape[:-1]) is not ignore_index."""
    facts = (array_facts("input", input), array_facts("target", target))
    options = spec.jsd(*facts, beta, array_facts("labels", labels, optional=True), ignore_index)
    return _reduced_jit(input, target, labels, options)


def tvd(input, target, *, labels=None, ignore_index: int = -100):
    """Total variation distance 0.5 sum |exp(target) - exp(input)| per row of log-probabilities,
    the mean over the rows whose label (labels, input.shape[:-1]) is not ignore_index."""
    facts = (array_facts("input", input), array_facts("target", target))
    options = spec.tvd(*facts, array_facts("labels", labels, optional=True), ignore_index)
    return _reduced_jit(input, target, labels, options)
