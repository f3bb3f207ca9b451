"""Scaled, optionally causal softmax for JAX: FFI calls wrapped in custom_vjp (and custom_vmap).

Math and shapes: csrc/core/include/fuselet/softmax.h. y = softmax(scale * x) over the last
dim of x [..., K]; causal=True takes x [..., Q, K] and masks key j for query i when
j > i + (K - Q) (bottom-right aligned); a fully masked row is zeros. y has x's dtype. The
leading dims keep their sharding (with causal=True, all but Q and K).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import row_op
from fuselet.jax._sharding import ROWS
from fuselet.spec import softmax as spec

CAUSAL = 1  # FUSELET_SOFTMAX_CAUSAL of fuselet/softmax.h


def _fwd_call(x, scale, causal):
    return row_op(
        "softmax_fwd",
        (ROWS,),
        (ROWS,),
        (x,),
        True,
        core_dims=2 if causal else 1,
        scale=np.float32(scale),
        flags=np.int32(CAUSAL if causal else 0),
    )[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _softmax(x, scale, causal):
    return _fwd_call(x, scale, causal)


def _softmax_fwd(x, scale, causal):
    y = _fwd_call(x, scale, causal)
    return y, y


def _softmax_bwd(scale, causal, y, dy):
    return (row_op("softmax_bwd", (ROWS, ROWS), (ROWS,), (dy, y), True, scale=np.float32(scale))[0],)


_softmax.defvjp(_softmax_fwd, _softmax_bwd)
# Jitted so that an eager call with sharded x is partitioned too (inside jit it is inlined).
_softmax_jit = jax.jit(_softmax, static_argnums=(1, 2))


def softmax(x, scale: float = 1.0, causal: bool = False):
    """y = softmax(scale * x, axis=-1), with the bottom-right causal mask when causal=True."""
    options = spec.softmax(array_facts("x", x), scale, causal)
    return _softmax_jit(x, *options.op_args())
