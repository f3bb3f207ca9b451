"""SwiGLU, GeGLU and GPT-OSS's clamped SwiGLU for JAX: FFI calls wrapped in custom_vjp (and custom_vmap).

Math and shapes: csrc/core/include/fuselet/glu.h. x [..., 2F] is [gate, up] (clamped_swiglu: or
interleaved [g0, u0, g1, u1, ...]); y [..., F] has
x's dtype (float32, float16 or bfloat16; the math runs in float32). Leading dims of x keep
their sharding; a sharded last dim is gathered.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import row_op
from fuselet.jax._sharding import HALF, ROWS
from fuselet.spec import glu as spec

# fuselet_glu_activation of fuselet/glu.h
SILU, GELU, GELU_TANH, SILU_CLAMPED = 0, 1, 2, 3


def _attrs(options: spec.GluOptions) -> dict:
    """fuselet_glu_options' fields of the options (passed to the jitted functions whole: static)."""
    activation = {"swiglu": SILU, "clamped_swiglu": SILU_CLAMPED}.get(options.op)
    if activation is None:  # geglu
        activation = GELU_TANH if options.approximate == "tanh" else GELU
    return dict(
        activation=np.int32(activation),
        interleaved=np.int32(options.interleaved),
        alpha=np.float32(options.alpha),
        limit=np.float32(options.limit),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _glu(x, options):
    return row_op("glu_fwd", (ROWS,), (HALF,), (x,), True, **_attrs(options))[0]


def _glu_fwd(x, options):
    return _glu(x, options), x


def _glu_bwd(options, x, dy):
    return (row_op("glu_bwd", (HALF, ROWS), (ROWS,), (dy, x), True, **_attrs(options))[0],)


_glu.defvjp(_glu_fwd, _glu_bwd)
# Jitted so that an eager call with sharded x is partitioned too (inside jit it is inlined).
_glu_jit = jax.jit(_glu, static_argnums=(1,))


def swiglu(x):
    """y = silu(gate) * up with x [..., 2F] = [gate, up]; y [..., F]."""
    return _glu_jit(x, spec.swiglu(array_facts("x", x)))


def geglu(x, approximate: str = "none"):
    """y = gelu(gate, approximate) * up with x [..., 2F] = [gate, up]; approximate "none" (erf) or "tanh"."""
    return _glu_jit(x, spec.geglu(array_facts("x", x), approximate))


def clamped_swiglu(x, *, alpha: float = 1.702, limit: float = 7.0, interleaved: bool = False):
    """GPT-OSS's SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), y = g * sigmoid(alpha * g) * (u + 1).

    x [..., 2F] is [gate, up], or [g0, u0, g1, u1, ...] with interleaved=True (GPT-OSS's
    gate_up_proj); y [..., F]. The defaults are GPT-OSS's (swiglu_alpha, swiglu_limit)."""
    return _glu_jit(x, spec.clamped_swiglu(array_facts("x", x), alpha, limit, interleaved))
