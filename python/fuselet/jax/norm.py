"""RMSNorm and LayerNorm for JAX: FFI calls wrapped in custom_vjp (and custom_vmap).

Math and shapes: csrc/core/include/fuselet/norm.h. Statistics are float32; inputs and
parameters are float32, float16 or bfloat16 (parameters in x's dtype).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fuselet._checks import check_norm_args
from fuselet.jax import _load


def _call(op: str, outs, *args, **attrs):
    from fuselet.jax import BUILD_INFO

    target = _load.target(op, cuda_kernels=bool(BUILD_INFO.get("cuda_kernels")))
    return jax.ffi.ffi_call(target, outs)(*args, **attrs)


def _batched(fn, row_args: tuple[bool, ...], fold: bool):
    """fn(*args) -> tuple, made vmappable.

    row_args[i]: arg i is [..., H] rows (x, dy) or per-row stats; the others are per-H
    parameters. With `fold`, a vmap that batches only row args adds a leading row dim
    (the kernel treats every leading dim as rows); otherwise, or when a parameter is
    batched, the batch runs as a loop (lax.map).
    """
    f = jax.custom_batching.custom_vmap(fn)

    @f.def_vmap
    def rule(axis_size, in_batched, *args):
        def full(a, b):
            return a if b else jnp.broadcast_to(a, (axis_size, *a.shape))

        if fold and not any(b for b, r in zip(in_batched, row_args) if not r):
            out = fn(*(full(a, b) if r else a for a, b, r in zip(args, in_batched, row_args)))
        else:
            out = jax.lax.map(lambda xs: fn(*xs), tuple(full(a, b) for a, b in zip(args, in_batched)))
        return out, tuple(True for _ in out)

    return f


def _stats(x):
    return jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)


def _like(a):
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


# --- RMSNorm -----------------------------------------------------------------------------

def _rms_fwd_call(x, weight, eps):
    call = lambda x, w: tuple(_call("rms_norm_fwd", (_like(x), _stats(x)), x, w, eps=np.float32(eps)))  # noqa: E731
    return _batched(call, (True, False), fold=True)(x, weight)


def _rms_bwd_call(dy, x, weight, rstd):
    call = lambda dy, x, w, r: tuple(_call("rms_norm_bwd", (_like(x), _like(w)), dy, x, w, r))  # noqa: E731
    return _batched(call, (True, True, False, True), fold=False)(dy, x, weight, rstd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm(x, weight, eps):
    return _rms_fwd_call(x, weight, eps)[0]


def _rms_norm_fwd(x, weight, eps):
    y, rstd = _rms_fwd_call(x, weight, eps)
    return y, (x, weight, rstd)


def _rms_norm_bwd(eps, res, dy):
    x, weight, rstd = res
    return _rms_bwd_call(dy, x, weight, rstd)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rms_norm(x, weight, eps: float = 1e-6):
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dim of x [..., H]."""
    _check(x, eps, weight=weight)
    return _rms_norm(x, weight, float(eps))


# --- LayerNorm ---------------------------------------------------------------------------

def _layer_fwd_call(x, weight, bias, eps):
    call = lambda x, w, b: tuple(  # noqa: E731
        _call("layer_norm_fwd", (_like(x), _stats(x), _stats(x)), x, w, b, eps=np.float32(eps)))
    return _batched(call, (True, False, False), fold=True)(x, weight, bias)


def _layer_bwd_call(dy, x, weight, mean, rstd):
    call = lambda dy, x, w, m, r: tuple(  # noqa: E731
        _call("layer_norm_bwd", (_like(x), _like(w), _like(w)), dy, x, w, m, r))
    return _batched(call, (True, True, False, True, True), fold=False)(dy, x, weight, mean, rstd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x, weight, bias, eps):
    return _layer_fwd_call(x, weight, bias, eps)[0]


def _layer_norm_fwd(x, weight, bias, eps):
    y, mean, rstd = _layer_fwd_call(x, weight, bias, eps)
    return y, (x, weight, mean, rstd)


def _layer_norm_bwd(eps, res, dy):
    x, weight, mean, rstd = res
    return _layer_bwd_call(dy, x, weight, mean, rstd)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm(x, weight, bias, eps: float = 1e-5):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim of x [..., H]."""
    _check(x, eps, weight=weight, bias=bias)
    return _layer_norm(x, weight, bias, float(eps))


def _check(x, eps, **params) -> None:
    arrays = {"x": x, **params}
    for name, a in arrays.items():
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{name}: expected a jax.Array, got {type(a).__name__}")
    check_norm_args(tuple(x.shape), jnp.dtype(x.dtype).name,
                    {n: (tuple(a.shape), jnp.dtype(a.dtype).name) for n, a in params.items()}, eps)
    devices = {n: a.devices() for n, a in arrays.items() if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)}
    if "x" in devices:
        for name, devs in devices.items():
            if devs != devices["x"]:
                raise ValueError(f"{name}: expected an array on {sorted(map(str, devices['x']))} (the devices of x), "
                                 f"got {sorted(map(str, devs))}")
