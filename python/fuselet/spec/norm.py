"""rms_norm, layer_norm, add_rms_norm, gated_rms_norm (fuselet/norm.h): x [..., H] of a float
dtype, H > 0; weight and bias [H] or None, in x's dtype or float32 (one dtype for both); eps a
finite number > 0, also in float32; zero_centered_gamma a bool, which needs a weight;
add_rms_norm's residual and gated_rms_norm's gate z of x's shape and dtype; gated_rms_norm's
group_size None or a divisor of H, norm_before_gate a bool."""

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


@dataclass(frozen=True)
class GatedNormOptions:
    eps: float
    group_size: int = 0  # 0: the whole row
    norm_before_gate: bool = True
    zero_centered_gamma: bool = False

    def op_args(self) -> tuple:
        """The raw ops' scalar arguments: (eps, group_size, norm_before_gate, zero_centered_gamma)."""
        return float(self.eps), self.group_size, self.norm_before_gate, self.zero_centered_gamma


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


def _group_size(group_size, hidden, raw: bool = False) -> int:
    """None (the public functions) or 0 (the raw ops): the whole row; else a divisor of H."""
    whole = "0" if raw else "None"
    if group_size is None and not raw:
        return 0
    r.int64("group_size", group_size)
    if raw and group_size == 0:
        return 0
    if group_size < 1 or hidden % group_size != 0:
        raise ValueError(
            f"group_size: expected {whole} (the whole row) or a divisor of {hidden} (the hidden size of x), got {group_size}"
        )
    return group_size


def gated(x: tuple, z: tuple, params: dict, eps, group_size=None, norm_before_gate=True, zero_centered_gamma=False):
    """gated_rms_norm's arguments: the norm's, the gate z (x's shape and dtype), group_size,
    norm_before_gate."""
    options = norm(x, params, eps, zero_centered_gamma)
    r.float_dtype("z", z[1], ("x", x[1]))
    r.same_shape("z", z[0], x[0], "the shape of x")
    size = _group_size(group_size, x[0][-1])
    r.a_bool("norm_before_gate", norm_before_gate)
    return GatedNormOptions(options.eps, size, norm_before_gate, zero_centered_gamma)


def groups(x_shape, group_size: int) -> int:
    """The groups per row of the gated norm (its rstd's last dim)."""
    return x_shape[-1] // group_size if group_size else 1


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


def gated_fwd_op(x: tuple, z: tuple, params: dict, eps, group_size, zero_centered_gamma) -> int:
    """gated_rms_norm_fwd: the number of groups per row."""
    norm(x, params, eps, zero_centered_gamma)
    n_rows, hidden = math.prod(x[0][:-1]), x[0][-1]
    r.op_rows_like("z", *z, ("x", x[1]), n_rows, hidden, " like x")
    return groups(x[0], _group_size(group_size, hidden, raw=True))


def gated_bwd_op(x: tuple, z: tuple, params: dict, group_size, zero_centered_gamma, dy: tuple, rstd: tuple) -> None:
    """gated_rms_norm_bwd: dy and z rows like x, rstd one float32 per group."""
    bwd_op(x, params, zero_centered_gamma, {"dy": dy, "z": z}, {})
    size = _group_size(group_size, x[0][-1], raw=True)
    r.op_vector("rstd", *rstd, math.prod(x[0][:-1]) * groups(x[0], size))


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

X, H4 = Array((2, 4)), Array((4,))
EXAMPLES = {
    "rms_norm": {"x": X, "weight": H4, "eps": 1e-6, "zero_centered_gamma": False},
    "layer_norm": {"x": X, "weight": H4, "bias": H4, "eps": 1e-5, "zero_centered_gamma": False},
    "add_rms_norm": {"x": X, "residual": X, "weight": H4, "eps": 1e-6, "zero_centered_gamma": False},
    "gated_rms_norm": {
        "x": X,
        "z": X,
        "weight": H4,
        "eps": 1e-6,
        "group_size": 2,
        "norm_before_gate": True,
        "zero_centered_gamma": False,
    },
}
ALL = tuple(EXAMPLES)
REFUSALS = [
    Refusal(ALL, {"x": Array((2, 4), "float64")}, TypeError, "x: expected dtype float32, float16 or bfloat16, got float64"),
    Refusal(ALL, {"x": Array((1,) * 8 + (4,))}, ValueError, "x: expected at most 8 dimensions, got 9"),
    Refusal(ALL, {"x": Array(())}, ValueError, "x: expected shape [..., H] with at least 1 dimension, got a 0-d array"),
    Refusal(ALL, {"x": Array((2, 0))}, ValueError, "x: the hidden size (last dimension) must be > 0, got shape (2, 0)"),
    Refusal(
        ALL, {"weight": Array((5,))}, ValueError, "weight: expected shape (4,) to match the last dimension of x (2, 4), got (5,)"
    ),
    Refusal(ALL, {"weight": Array((4,), "int32")}, TypeError, "weight: expected dtype float32, float16 or bfloat16, got int32"),
    Refusal(ALL, {"weight": Array((4,), "float16")}, TypeError, "weight: expected dtype float32 (the dtype of x), got float16"),
    Refusal(
        ("layer_norm",),
        {"x": Array((2, 4), "bfloat16"), "weight": Array((4,), "bfloat16"), "bias": H4},
        TypeError,
        "bias: expected dtype bfloat16 (the dtype of weight), got float32",
    ),
    Refusal(ALL, {"eps": "1e-6"}, TypeError, "eps: expected a Python float, got str"),
    Refusal(ALL, {"eps": 0.0}, ValueError, "eps: expected a finite number > 0, got 0.0"),
    Refusal(ALL, {"eps": float("nan")}, ValueError, "eps: expected a finite number > 0, got nan"),
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
        ("add_rms_norm",),
        {"residual": Array((2, 4), "bfloat16")},
        TypeError,
        "residual: expected dtype float32 (the dtype of x), got bfloat16",
    ),
    Refusal(
        ("gated_rms_norm",),
        {"z": Array((2, 5))},
        ValueError,
        "z: expected shape (2, 4) (the shape of x), got (2, 5)",
        raw="z: expected 2 rows of 4 elements like x, got 2 rows of 5",
    ),
    Refusal(
        ("gated_rms_norm",), {"z": Array((2, 4), "float16")}, TypeError, "z: expected dtype float32 (the dtype of x), got float16"
    ),
    Refusal(
        ("gated_rms_norm",),
        {"group_size": 3},
        ValueError,
        "group_size: expected None (the whole row) or a divisor of 4 (the hidden size of x), got 3",
        raw="group_size: expected 0 (the whole row) or a divisor of 4 (the hidden size of x), got 3",
    ),
    Refusal(("gated_rms_norm",), {"group_size": 2.0}, TypeError, "group_size: expected a Python int, got float"),
    Refusal(("gated_rms_norm",), {"norm_before_gate": 1}, TypeError, "norm_before_gate: expected a bool, got int"),
]
R2 = Array((2,))
OP_REFUSALS = [
    Refusal(
        ("rms_norm_bwd",),
        {"dy": Array((2, 3)), "x": X, "weight": H4, "rstd": R2},
        ValueError,
        "dy: expected 2 rows of 4 elements like x, got 2 rows of 3",
    ),
    Refusal(
        ("rms_norm_bwd",),
        {"dy": X, "x": X, "weight": H4, "rstd": Array((3,))},
        ValueError,
        "rstd: expected 2 elements, got shape [3]",
    ),
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
        "residual_out: expected shape [..., H] with at least 1 dimension, got a 0-d array",
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
        "zero_centered_gamma: scales by (1 + weight) and needs a weight, got weight=None",
    ),
    Refusal(
        ("gated_rms_norm_bwd",),
        {"dy": X, "x": X, "z": X, "weight": H4, "rstd": R2, "group_size": 2},
        ValueError,
        "rstd: expected 4 elements, got shape [2]",
    ),
    Refusal(
        ("rms_norm_bwd",),
        {"dy": X, "x": X, "weight": Array((5,)), "rstd": R2},
        ValueError,
        "weight: expected shape (4,) to match the last dimension of x (2, 4), got (5,)",
    ),
    Refusal(
        ("gated_rms_norm_bwd",),
        {"dy": X, "x": X, "z": X, "weight": H4, "rstd": R2, "group_size": 3},
        ValueError,
        "group_size: expected 0 (the whole row) or a divisor of 4 (the hidden size of x), got 3",
    ),
    Refusal(
        ("gated_rms_norm_bwd",),
        {"dy": X, "x": X, "z": Array((2, 3)), "weight": H4, "rstd": R2},
        ValueError,
        "z: expected 2 rows of 4 elements like x, got 2 rows of 3",
    ),
]
