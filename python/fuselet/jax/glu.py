"""SwiGLU and GeGLU for JAX: FFI calls wrapped in custom_vjp (and custom_vmap).

Math and shapes: csrc/core/include/fuselet/glu.h. x [..., 2F] is [gate, up]; y [..., F] has
x's dtype (float32, float16 or bfloat16; the math runs in float32). Leading dims of x keep
their sharding; a sharded last dim is gathered.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from fuselet._checks import check_approximate, check_glu_args
from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import row_op
from fuselet.jax._sharding import HALF, ROWS

# fuselet_glu_activation of fuselet/glu.h
SILU, GELU, GELU_TANH = 0, 1, 2


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _glu(x, activation):
    return row_op("glu_fwd", (ROWS,), (HALF,), (x,), True, activation=np.int32(activation))[0]


def _glu_fwd(x, activation):
    return _glu(x, activation), x


def _glu_bwd(activation, x, dy):
    return (row_op("glu_bwd", (HALF, ROWS), (ROWS,), (dy, x), True, activation=np.int32(activation))[0],)


_glu.defvjp(_glu_fwd, _glu_bwd)
# Jitted so that an eager call with sharded x is partitioned too (inside jit it is inlined).
_glu_jit = jax.jit(_glu, static_argnums=(1,))


def _check(x) -> None:
    check_glu_args(*array_facts("x", x))


def swiglu(x):
    """y = silu(gate) * up with x [..., 2F] = [gate, up]; y [..., F]."""
    _check(x)
    return _glu_jit(x, SILU)


def geglu(x, approximate: str = "none"):
    """y = gelu(gate, approximate) * up with x [..., 2F] = [gate, up]; approximate "none" (erf) or "tanh"."""
    _check(x)
    check_approximate(approximate)
    return _glu_jit(x, GELU_TANH if approximate == "tanh" else GELU)
