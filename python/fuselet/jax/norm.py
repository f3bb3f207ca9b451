"""RMSNorm, LayerNorm, residual add + RMSNorm and gated RMSNorm for JAX: FFI calls wrapped in custom_vjp (and custom_vmap).

Math and shapes: csrc/core/include/fuselet/norm.h. Statistics are float32; x is float32,
float16 or bfloat16; weight and bias are optional (None) and in x's dtype or float32 (the
math runs in float32, y has x's dtype, each parameter's gradient its parameter's dtype).
zero_centered_gamma=True scales by (1 + weight).

An absent parameter reaches the FFI handlers as an array with no elements.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fuselet.jax import _sharding
from fuselet.jax._checks import array_facts
from fuselet.jax._ffi import row_op as _row_op
from fuselet.jax._sharding import GROUPS, PARAM, PARAM_SUM, ROWS, STATS
from fuselet.spec import norm as spec

ZERO_CENTERED_GAMMA = 1  # FUSELET_NORM_ZERO_CENTERED_GAMMA of fuselet/norm.h
GATE_FIRST = 2  # FUSELET_NORM_GATE_FIRST


def _param(p, x):
    """p, or the no-element array that stands for an absent parameter."""
    return jnp.zeros((0,), x.dtype) if p is None else p


def _flags(zero_centered_gamma: bool) -> np.int32:
    return np.int32(ZERO_CENTERED_GAMMA if zero_centered_gamma else 0)


# --- RMSNorm -----------------------------------------------------------------------------


def _rms_fwd_call(x, weight, eps, flags):
    return _row_op("rms_norm_fwd", (ROWS, PARAM), (ROWS, STATS), (x, _param(weight, x)), True, eps=np.float32(eps), flags=flags)


def _rms_bwd_call(dy, x, weight, rstd, flags):
    return _row_op(
        "rms_norm_bwd",
        (ROWS, ROWS, PARAM, STATS),
        (ROWS, PARAM_SUM),
        (dy, x, _param(weight, x), rstd),
        False,
        workspace=True,
        flags=flags,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, weight, eps, flags):
    return _rms_fwd_call(x, weight, eps, flags)[0]


def _rms_norm_fwd(x, weight, eps, flags):
    y, rstd = _rms_fwd_call(x, weight, eps, flags)
    return y, (x, weight, rstd)


def _rms_norm_bwd(eps, flags, res, dy):
    x, weight, rstd = res
    dx, dweight = _rms_bwd_call(dy, x, weight, rstd, flags)
    return dx, None if weight is None else dweight


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)
# Jitted so that an eager call with sharded x is partitioned too (inside jit it is inlined).
_rms_norm_jit = jax.jit(_rms_norm, static_argnums=(2, 3))


def rms_norm(x, weight=None, eps: float = 1e-6, zero_centered_gamma: bool = False):
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dim of x [..., H].

    weight=None scales by 1; zero_centered_gamma=True scales by (1 + weight)."""
    options = _check(x, eps, zero_centered_gamma, weight=weight)[1]
    axes = _sharding.varying_axes(x)
    return _rms_norm_jit(x, _sharding.vary_like(axes, weight), *_scalars(options))


# --- LayerNorm ---------------------------------------------------------------------------


def _layer_fwd_call(x, weight, bias, eps, flags):
    return _row_op(
        "layer_norm_fwd",
        (ROWS, PARAM, PARAM),
        (ROWS, STATS, STATS),
        (x, _param(weight, x), _param(bias, x)),
        True,
        eps=np.float32(eps),
        flags=flags,
    )


def _layer_bwd_call(dy, x, weight, bias, mean, rstd, flags):
    return _row_op(
        "layer_norm_bwd",
        (ROWS, ROWS, PARAM, PARAM, STATS, STATS),
        (ROWS, PARAM_SUM, PARAM_SUM),
        (dy, x, _param(weight, x), _param(bias, x), mean, rstd),
        False,
        workspace=True,
        flags=flags,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, weight, bias, eps, flags):
    return _layer_fwd_call(x, weight, bias, eps, flags)[0]


def _layer_norm_fwd(x, weight, bias, eps, flags):
    y, mean, rstd = _layer_fwd_call(x, weight, bias, eps, flags)
    # bias is kept for its presence and dtype only (the backward computes dbias when it exists)
    return y, (x, weight, bias, mean, rstd)


def _layer_norm_bwd(eps, flags, res, dy):
    x, weight, bias, mean, rstd = res
    dx, dweight, dbias = _layer_bwd_call(dy, x, weight, bias, mean, rstd, flags)
    return dx, None if weight is None else dweight, None if bias is None else dbias


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
_layer_norm_jit = jax.jit(_layer_norm, static_argnums=(3, 4))


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5, zero_centered_gamma: bool = False):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim of x [..., H].

    weight=None scales by 1, bias=None adds 0; zero_centered_gamma=True scales by (1 + weight)."""
    options = _check(x, eps, zero_centered_gamma, weight=weight, bias=bias)[1]
    axes = _sharding.varying_axes(x)
    weight, bias = (_sharding.vary_like(axes, p) for p in (weight, bias))
    return _layer_norm_jit(x, weight, bias, *_scalars(options))


# --- residual add + RMSNorm --------------------------------------------------------------


def _add_rms_fwd_call(x, residual, weight, eps, flags):
    return _row_op(
        "add_rms_norm_fwd",
        (ROWS, ROWS, PARAM),
        (ROWS, ROWS, STATS),
        (x, residual, _param(weight, x)),
        True,
        eps=np.float32(eps),
        flags=flags,
    )


def _add_rms_bwd_call(dy, dresidual_out, residual_out, weight, rstd, flags):
    return _row_op(
        "add_rms_norm_bwd",
        (ROWS, ROWS, ROWS, PARAM, STATS),
        (ROWS, PARAM_SUM),
        (dy, dresidual_out, residual_out, _param(weight, residual_out), rstd),
        False,
        workspace=True,
        flags=flags,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _add_rms_norm(x, residual, weight, eps, flags):
    return tuple(_add_rms_fwd_call(x, residual, weight, eps, flags)[:2])


def _add_rms_norm_fwd(x, residual, weight, eps, flags):
    y, residual_out, rstd = _add_rms_fwd_call(x, residual, weight, eps, flags)
    return (y, residual_out), (residual_out, weight, rstd)


def _add_rms_norm_bwd(eps, flags, res, cotangents):
    residual_out, weight, rstd = res
    dy, dresidual_out = cotangents
    dx, dweight = _add_rms_bwd_call(dy, dresidual_out, residual_out, weight, rstd, flags)
    return dx, dx, None if weight is None else dweight


_add_rms_norm.defvjp(_add_rms_norm_fwd, _add_rms_norm_bwd)
_add_rms_norm_jit = jax.jit(_add_rms_norm, static_argnums=(3, 4))


def add_rms_norm(x, residual, weight=None, eps: float = 1e-6, zero_centered_gamma: bool = False):
    """(y, residual_out): residual_out = x + residual (in x's dtype), y = rms_norm(residual_out, weight, eps).

    The pre-norm transformer step in one pass; residual has x's shape and dtype."""
    x_facts, options = _check(x, eps, zero_centered_gamma, weight=weight)
    spec.residual(array_facts("residual", residual), x_facts)
    axes = _sharding.varying_axes(x, residual)
    return _add_rms_norm_jit(x, residual, _sharding.vary_like(axes, weight), *_scalars(options))


# --- gated RMSNorm -----------------------------------------------------------------------


def _gated_fwd_call(x, z, weight, eps, group_size, flags):
    return _row_op(
        "gated_rms_norm_fwd",
        (ROWS, ROWS, PARAM),
        (ROWS, GROUPS),
        (x, z, _param(weight, x)),
        True,
        eps=np.float32(eps),
        group_size=np.int64(group_size),
        flags=flags,
    )


def _gated_bwd_call(dy, x, z, weight, rstd, group_size, flags):
    return _row_op(
        "gated_rms_norm_bwd",
        (ROWS, ROWS, ROWS, PARAM, GROUPS),
        (ROWS, ROWS, PARAM_SUM),
        (dy, x, z, _param(weight, x), rstd),
        False,
        workspace=True,
        group_size=np.int64(group_size),
        flags=flags,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _gated_rms_norm(x, z, weight, eps, group_size, flags):
    return _gated_fwd_call(x, z, weight, eps, group_size, flags)[0]


def _gated_rms_norm_fwd(x, z, weight, eps, group_size, flags):
    y, rstd = _gated_fwd_call(x, z, weight, eps, group_size, flags)
    return y, (x, z, weight, rstd)


def _gated_rms_norm_bwd(eps, group_size, flags, res, dy):
    x, z, weight, rstd = res
    dx, dz, dweight = _gated_bwd_call(dy, x, z, weight, rstd, group_size, flags)
    return dx, dz, None if weight is None else dweight


_gated_rms_norm.defvjp(_gated_rms_norm_fwd, _gated_rms_norm_bwd)
_gated_rms_norm_jit = jax.jit(_gated_rms_norm, static_argnums=(3, 4, 5))


def gated_rms_norm(
    x, z, weight=None, eps: float = 1e-6, group_size=None, norm_before_gate: bool = True, zero_centered_gamma: bool = False
):
    """y = rms_norm(x) * weight * silu(z), or rms_norm(x * silu(z)) * weight with
    norm_before_gate=False (Mamba2's), each row of x [..., H] normalized in groups of group_size
    elements (None: the whole row). z (the gate) has x's shape and dtype."""
    x_facts = array_facts("x", x)
    params = {"weight": array_facts("weight", weight, optional=True)}
    options = spec.gated(x_facts, array_facts("z", z), params, eps, group_size, norm_before_gate, zero_centered_gamma)
    _devices(x=x, z=z, weight=weight)
    eps, group_size, norm_before_gate, zero_centered_gamma = options.op_args()
    flags = np.int32((ZERO_CENTERED_GAMMA if zero_centered_gamma else 0) | (0 if norm_before_gate else GATE_FIRST))
    axes = _sharding.varying_axes(x, z)
    return _gated_rms_norm_jit(x, z, _sharding.vary_like(axes, weight), eps, group_size, flags)


def _scalars(options: spec.NormOptions) -> tuple:
    """The jitted functions' static (eps, flags)."""
    eps, zero_centered_gamma = options.op_args()
    return eps, _flags(zero_centered_gamma)


def _check(x, eps, zero_centered_gamma, **params) -> tuple[tuple, spec.NormOptions]:
    """x's (shape, dtype name) and the options, once every argument is checked."""
    arrays = {"x": x, **{n: a for n, a in params.items() if a is not None}}
    x_facts = array_facts("x", x)
    options = spec.norm(x_facts, {n: array_facts(n, a, optional=True) for n, a in params.items()}, eps, zero_centered_gamma)
    _devices(**arrays)
    return x_facts, options


def _devices(**arrays) -> None:
    """Every committed array of `arrays` (None: absent) on the devices of x."""
    arrays = {n: a for n, a in arrays.items() if a is not None}
    # Committed arrays only: JAX places uncommitted ones (jnp.ones(H)) where the others are, as
    # for its own ops; a weight on one device with x sharded over eight is the common case.
    devices = {
        n: a.devices()
        for n, a in arrays.items()
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and a.committed
    }
    if "x" in devices:
        for name, devs in devices.items():
            if devs != devices["x"]:
                raise ValueError(
                    f"{name}: expected an array on {sorted(map(str, devices['x']))} (the devices of x), "
                    f"got {sorted(map(str, devs))}"
                )
