"""The one float64 numpy reference of fuselet's kernels, and the one tolerance table.

Both the torch and the jax tests compare against these functions. Feed them the values
the kernel actually received: the low-precision inputs, cast to float64 after rounding
(see `to_float64`). Math: csrc/core/include/fuselet/norm.h.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

DTYPE_NAMES = ("float32", "float16", "bfloat16")
NUMPY_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
                "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# (rtol, atol) per dtype name.
#   "out":    elementwise outputs (y, dx) and float32 statistics: float32 math, one rounding
#             to the dtype at the end: within half an ulp of the dtype (2^-11 float16,
#             2^-8 bfloat16 relative) plus float32 error; the table allows about one ulp.
#   "reduce": sums over rows (dweight, dbias); atol is per sqrt(row), see `tolerance`.
TOLERANCES = {
    "float32": {"out": (1e-5, 1e-5), "reduce": (1e-5, 1e-5)},
    "float16": {"out": (1e-3, 1e-3), "reduce": (1e-3, 1e-3)},
    "bfloat16": {"out": (8e-3, 8e-3), "reduce": (8e-3, 8e-3)},
}


def tolerance(dtype: str, kind: str, rows: int = 1) -> tuple[float, float]:
    """(rtol, atol) for `kind` ("out" or "reduce") of `dtype`; "reduce" atol grows as sqrt(rows)."""
    rtol, atol = TOLERANCES[dtype][kind]
    if kind == "reduce":
        atol *= max(1.0, float(rows)) ** 0.5
    return rtol, atol


def assert_close(actual, expected, dtype: str, kind: str = "out", rows: int = 1, name: str = "") -> None:
    """actual: the kernel's result as a float64 array; expected: the reference's."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != reference {expected.shape}"
    rtol, atol = tolerance(dtype, kind, rows)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol,
                               err_msg=f"{name} ({dtype}, {kind}, rows={rows})")


def to_float64(a) -> np.ndarray:
    """A numpy-convertible array of any float dtype (bfloat16 included) as float64."""
    return np.asarray(a).astype(np.float64)


def make_inputs(shape, dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Random x [..., H], weight [H], bias [H], dy [..., H], already rounded to `dtype`."""
    rng = np.random.default_rng(seed)
    hidden = shape[-1]
    values = {
        "x": rng.standard_normal(shape) * 2.0 + 0.5,
        "weight": 1.0 + 0.5 * rng.standard_normal(hidden),
        "bias": 0.5 * rng.standard_normal(hidden),
        "dy": rng.standard_normal(shape),
    }
    return {k: v.astype(NUMPY_DTYPES[dtype]) for k, v in values.items()}


def rows_of(shape) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64))


def _eps(eps: float) -> float:
    return float(np.float32(eps))  # the kernels take eps as a float32


def rms_norm_fwd(x, weight, eps):
    """-> y [..., H], rstd [...] (x.shape[:-1])."""
    x, weight = to_float64(x), to_float64(weight)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + _eps(eps))
    return x * rstd[..., None] * weight, rstd


def rms_norm_bwd(dy, x, weight, eps):
    """-> dx [..., H], dweight [H]."""
    dy, x, weight = to_float64(dy), to_float64(x), to_float64(weight)
    _, rstd = rms_norm_fwd(x, weight, eps)
    xhat = x * rstd[..., None]
    g = dy * weight
    dx = rstd[..., None] * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    dweight = (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx, dweight


def layer_norm_fwd(x, weight, bias, eps):
    """-> y [..., H], mean [...], rstd [...]."""
    x, weight, bias = to_float64(x), to_float64(weight), to_float64(bias)
    mean = np.mean(x, axis=-1)
    centered = x - mean[..., None]
    rstd = 1.0 / np.sqrt(np.mean(centered * centered, axis=-1) + _eps(eps))
    return centered * rstd[..., None] * weight + bias, mean, rstd


def layer_norm_bwd(dy, x, weight, eps):
    """-> dx [..., H], dweight [H], dbias [H]."""
    dy, x, weight = to_float64(dy), to_float64(x), to_float64(weight)
    _, mean, rstd = layer_norm_fwd(x, weight, np.zeros_like(weight), eps)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * weight
    dx = rstd[..., None] * (g - np.mean(g, axis=-1, keepdims=True)
                            - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    flat = (-1, x.shape[-1])
    return dx, (dy * xhat).reshape(flat).sum(axis=0), dy.reshape(flat).sum(axis=0)
