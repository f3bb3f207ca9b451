"""swiglu, geglu, clamped_swiglu (fuselet/glu.h): x [..., 2F] of a float dtype, 2F even and > 0;
geglu's approximate "none" or "tanh"; clamped_swiglu's alpha a finite number and limit a finite
number > 0, both also in float32, and interleaved a bool."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal

APPROXIMATIONS = ("none", "tanh")


@dataclass(frozen=True)
class GluOptions:
    op: str  # "swiglu", "geglu" or "clamped_swiglu"
    approximate: str = "none"
    alpha: float = 0.0
    limit: float = 0.0
    interleaved: bool = False

    def op_args(self) -> tuple:
        """The raw op's scalar arguments: none for swiglu_fwd, (approximate,) for geglu_fwd,
        (alpha, limit, interleaved) for clamped_swiglu_fwd."""
        if self.op == "geglu":
            return (self.approximate,)
        if self.op == "clamped_swiglu":
            return float(self.alpha), float(self.limit), self.interleaved
        return ()


def _x(x: tuple) -> None:
    shape, dtype = x
    r.float_dtype("x", dtype)
    r.max_dims("x", shape)
    r.rows("x", shape, "[..., 2F]")
    if shape[-1] == 0 or shape[-1] % 2:
        raise ValueError(f"x: expected an even last dimension > 0 (2F: the gate and up halves), got shape {tuple(shape)}")


def swiglu(x: tuple) -> GluOptions:
    _x(x)
    return GluOptions("swiglu")


def geglu(x: tuple, approximate="none") -> GluOptions:
    _x(x)
    r.one_of("approximate", approximate, APPROXIMATIONS, "'none' or 'tanh'")
    return GluOptions("geglu", approximate=approximate)


def clamped_swiglu(x: tuple, alpha=1.702, limit=7.0, interleaved=False) -> GluOptions:
    _x(x)
    r.number("alpha", alpha, noun="number")
    r.float32("alpha", alpha)
    r.number("limit", limit, low=0, low_open=True, noun="number")
    r.float32("limit", limit, positive=True)
    r.a_bool("interleaved", interleaved)
    return GluOptions("clamped_swiglu", alpha=alpha, limit=limit, interleaved=interleaved)


# --- the raw ops (torch.ops.fuselet.<op>_fwd / _bwd: the fake impls) ----------------------------


def op(name: str, x: tuple, *op_args, dy: tuple | None = None) -> GluOptions:
    """<name>_fwd (dy None) and <name>_bwd (dy: rows of x's dtype, half of x's last dimension)."""
    options = {"swiglu": swiglu, "geglu": geglu, "clamped_swiglu": clamped_swiglu}[name](x, *op_args)
    if dy is not None:
        r.op_rows_like("dy", *dy, ("x", x[1]), math.prod(x[0][:-1]), x[0][-1] // 2)
    return options


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

EXAMPLES = {"swiglu": {"x": Array((2, 4))}, "geglu": {"x": Array((2, 4))}, "clamped_swiglu": {"x": Array((2, 4))}}
ALL, CLAMPED = tuple(EXAMPLES), ("clamped_swiglu",)
REFUSALS = [
    Refusal(ALL, {"x": Array((2, 4), "float64")}, TypeError, "x: expected dtype float32, float16 or bfloat16, got float64"),
    Refusal(ALL, {"x": Array((1,) * 8 + (4,))}, ValueError, "x: expected at most 8 dimensions, got 9"),
    Refusal(ALL, {"x": Array(())}, ValueError, "x: expected shape [..., 2F] with at least 1 dimension, got a 0-d array"),
    Refusal(
        ALL,
        {"x": Array((2, 5))},
        ValueError,
        "x: expected an even last dimension > 0 (2F: the gate and up halves), got shape (2, 5)",
    ),
    Refusal(("geglu",), {"approximate": "fast"}, ValueError, "approximate: expected 'none' or 'tanh', got 'fast'"),
    Refusal(("geglu",), {"approximate": True}, TypeError, "approximate: expected 'none' or 'tanh', got bool"),
    Refusal(CLAMPED, {"alpha": "1.702"}, TypeError, "alpha: expected a Python float, got str"),
    Refusal(CLAMPED, {"alpha": float("nan")}, ValueError, "alpha: expected a finite number, got nan"),
    Refusal(CLAMPED, {"alpha": -1e39}, ValueError, "alpha: expected a magnitude float32 can hold"),
    Refusal(CLAMPED, {"limit": True}, TypeError, "limit: expected a Python float, got bool"),
    Refusal(CLAMPED, {"limit": 0.0}, ValueError, "limit: expected a finite number > 0, got 0.0"),
    Refusal(CLAMPED, {"limit": float("inf")}, ValueError, "limit: expected a finite number > 0, got inf"),
    Refusal(CLAMPED, {"limit": 1e-50}, ValueError, "limit: expected a value > 0 in float32"),
    Refusal(CLAMPED, {"interleaved": 1}, TypeError, "interleaved: expected a bool, got int"),
]
OP_REFUSALS = [
    Refusal(
        ("swiglu_bwd",),
        {"dy": Array((2, 4)), "x": Array((2, 4))},
        ValueError,
        "dy: expected 2 rows of 2 elements, got 2 rows of 4",
    ),
    Refusal(
        ("clamped_swiglu_bwd",),
        {"dy": Array((2, 2), "bfloat16"), "x": Array((2, 4))},
        TypeError,
        "dy: expected dtype float32 (the dtype of x), got bfloat16",
    ),
]
