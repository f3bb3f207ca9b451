"""rms_norm, layer_norm, add_rms_norm (fuselet/norm.h): x [..., H] of a float dtype, H > 0;
weight and bias [H] or None, in x's dtype or float32 (one dtype for both); eps a finite number
> 0, also in float32; zero_centered_gamma a bool, which needs a weight; add_rms_norm's residual
of x's shape and dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal


@dataclass(frozen=True)
class NormOptions:
    eps: float
    zero_centered_gamma: bool = False

    def op_args(self) -> tuple:
        """The raw ops' scalar arguments: (eps, zero_centered_gamma)."""
        return float(self.eps), self.zero_centered_gamma


def _arrays(x: tuple, params: dict, x_name: str = "x") -> None:
    """x (shape, dtype) [..., H]; params {"weight": (shape, dtype) or None, "bias": ...}: [H] each,
    x's dtype or float32, one dtype."""
    x_shape, x_dtype = x
    r.float_dtype(x_name, x_dtype)
    r.max_dims(x_name, x_shape)
    r.rows(x_name, x_shape, "[..., H]")
    r.last_positive(x_name, x_shape, "the hidden size (last dimension)")
    hidden, like = x_shape[-1], None
    for name, param in params.items():
        if param is None:
            continue
        shape, dtype = param
        if tuple(shape) != (hidden,):
            raise ValueError(
                f"{name}: expected shape ({hidden},) to match the last dimension of {x_name} {tuple(x_shape)}, got {tuple(shape)}"
            )
        r.param_dtype(name, dtype, (x_name, x_dtype), like)
        like = like or (name, dtype)


def _zero_centered_gamma(zero_centered_gamma, has_weight: bool) -> None:
    r.a_bool("zero_centered_gamma", zero_centered_gamma)
    if zero_centered_gamma and not has_weight:
        raise ValueError("zero_centered_gamma: scales by (1 + weight) and needs a weight, got weight=None")


def norm(x: tuple, params: dict, eps, zero_centered_gamma=False) -> NormOptions:
    """rms_norm's (params: weight) and layer_norm's (weight, bias) arguments."""
    _arrays(x, params)
    r.number("eps", eps, low=0, low_open=True)
    r.float32("eps", eps, positive=True)
    _zero_centered_gamma(zero_centered_gamma, params.get("weight") is not None)
    return NormOptions(eps, zero_centered_gamma)


def residual(residual: tuple, x: tuple) -> None:
    """add_rms_norm's residual: x's shape and dtype."""
    r.float_dtype("residual", residual[1], ("x", x[1]))
    r.same_shape("residual", residual[0], x[0], "the shape of x")


# --- the raw ops (torch.ops.fuselet.*_norm_*: the fake impls) -----------------------------------


def fwd_op(x: tuple, params: dict, eps, zero_centered_gamma, residual: tuple | None = None) -> NormOptions:
    """rms_norm_fwd, layer_norm_fwd, add_rms_norm_fwd (residual: rows like x)."""
    options = norm(x, params, eps, zero_centered_gamma)
    if residual is not None:
        r.op_rows_like("residual", *residual, ("x", x[1]), math.prod(x[0][:-1]), x[0][-1], " like x")
    return options


def bwd_op(x: tuple, params: dict, zero_centered_gamma, grads: dict, stats: dict, x_name: str = "x") -> None:
    """The backward ops: x (add_rms_norm_bwd: x_name residual_out) and params as the forward's,
    grads {"dy": (shape, dtype), ...} rows like x, stats {"rstd": (shape, dtype), ...} float32 per row."""
    n_rows, hidden = r.op_rows(x_name, *x)
    _arrays(x, params, x_name)
    _zero_centered_gamma(zero_centered_gamma, params.get("weight") is not None)
    for name, grad in grads.items():
        r.op_rows_like(name, *grad, (x_name, x[1]), n_rows, hidden, f" like {x_name}")
    for name, stat in stats.items():
        r.op_vector(name, *stat, n_rows)


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

X, H4 = Array((2, 4)), Array((4,))
EXAMPLES = {
    "rms_norm": {"x": X, "weight": H4, "eps": 1e-6, "zero_centered_gamma": False},
    "layer_norm": {"x": X, "weight": H4, "bias": H4, "eps": 1e-5, "zero_centered_gamma": False},
    "add_rms_norm": {"x": X, "residual": X, "weight": H4, "eps": 1e-6, "zero_centered_gamma": False},
}
ALL = tuple(EXAMPLES)
REFUSALS = [
    Refusal(ALL, {"x": Array((2, 4), "float64")}, TypeError, "x: expected dtype float32, float16 or bfloat16, got float64"),
    Refusal(ALL, {"x": Array((1,) * 8 + (4,))}, ValueError, "x: expected at most 8 dimensions, got 9"),
    Refusal(ALL, {"x": Array(())}, ValueError, "x: expected shape [..., H] with at least 1 dimension, got a 0-d array"),
    Refusal(ALL, {"x": Array((2, 0))}, ValueError, "x: the hidden size (last dimension) must be > 0, got shape (2, 0)"),
    Refusal(ALL, {"weight": Array((5,))}, ValueError, "weight: expected shape (4,) to match the last dimension of x (2, 4)"),
    Refusal(ALL, {"weight": Array((4,), "int32")}, TypeError, "weight: expected dtype float32, float16 or bfloat16, got int32"),
    Refusal(ALL, {"weight": Array((4,), "float16")}, TypeError, "weight: expected dtype float32 (the dtype of x), got float16"),
    Refusal(
        ("layer_norm",),
        {"x": Array((2, 4), "bfloat16"), "weight": Array((4,), "bfloat16"), "bias": H4},
        TypeError,
        "bias: expected dtype bfloat16 (the dtype of weight), got float32",
    ),
    Refusal(ALL, {"eps": "1e-6"}, TypeError, "eps: expected a Python float, got str"),
    Refusal(ALL, {"eps": 0.0}, ValueError, "eps: expected a finite float > 0, got 0.0"),
    Refusal(ALL, {"eps": float("nan")}, ValueError, "eps: expected a finite float > 0, got nan"),
    Refusal(ALL, {"eps": 1e-50}, ValueError, "eps: expected a value > 0 in float32 (>= 1.401e-45"),
    Refusal(ALL, {"eps": 1e39}, ValueError, "eps: expected a magnitude float32 can hold (<= 3.403e+38"),
    Refusal(ALL, {"zero_centered_gamma": "yes"}, TypeError, "zero_centered_gamma: expected a bool, got str"),
    Refusal(
        ALL,
        {"weight": None, "zero_centered_gamma": True},
        ValueError,
        "zero_centered_gamma: scales by (1 + weight) and needs a weight, got weight=None",
    ),
    Refusal(
        ("add_rms_norm",),
        {"residual": Array((2, 5))},
        ValueError,
        "residual: expected shape (2, 4) (the shape of x), got (2, 5)",
        raw="residual: expected 2 rows of 4 elements like x, got 2 rows of 5",
    ),
    Refusal(
        ("add_rms_norm",), {"residual": Array((2, 4), "bfloat16")}, TypeError, "residual: expected dtype float32 (the dtype of x)"
    ),
]
R2 = Array((2,))
OP_REFUSALS = [
    Refusal(("rms_norm_bwd",), {"dy": Array((2, 3)), "x": X, "weight": H4, "rstd": R2}, ValueError, "dy: expected 2 rows of 4"),
    Refusal(("rms_norm_bwd",), {"dy": X, "x": X, "weight": H4, "rstd": Array((3,))}, ValueError, "rstd: expected 2 elements"),
    Refusal(
        ("layer_norm_bwd",),
        {"dy": X, "x": X, "weight": H4, "bias": H4, "mean": Array((2,), "float16"), "rstd": R2},
        TypeError,
        "mean: expected dtype float32, got float16",
    ),
    Refusal(
        ("add_rms_norm_bwd",),
        {"dy": Array(()), "dresidual_out": Array(()), "residual_out": Array(()), "weight": None, "rstd": Array(())},
        ValueError,
        "residual_out: expected a tensor of shape [..., H], got a 0-d tensor",
    ),
    Refusal(
        ("add_rms_norm_bwd",),
        {"dy": X, "dresidual_out": Array((2, 4), "bfloat16"), "residual_out": X, "weight": H4, "rstd": R2},
        TypeError,
        "dresidual_out: expected dtype float32 (the dtype of residual_out), got bfloat16",
    ),
    Refusal(
        ("layer_norm_bwd",),
        {"dy": X, "x": X, "weight": None, "bias": None, "mean": R2, "rstd": R2, "zero_centered_gamma": True},
        ValueError,
        "zero_centered_gamma: scales by (1 + weight) and needs a weight",
    ),
]
