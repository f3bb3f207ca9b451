"""softmax (fuselet/softmax.h): x [..., K] of a float dtype, K > 0 ([..., Q, K] with causal);
scale a finite number, also in float32; causal a bool."""

from __future__ import annotations

from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal


@dataclass(frozen=True)
class SoftmaxOptions:
    scale: float = 1.0
    causal: bool = False

    def op_args(self) -> tuple:
        """softmax_fwd's scalar arguments: (scale, causal)."""
        return float(self.scale), self.causal


def _scale(scale) -> None:
    r.number("scale", scale)
    r.float32("scale", scale)


def softmax(x: tuple, scale=1.0, causal=False) -> SoftmaxOptions:
    shape, dtype = x
    r.float_dtype("x", dtype)
    r.max_dims("x", shape)
    r.rows("x", shape, "[..., K]")
    r.last_positive("x", shape, "the last dimension (keys)")
    _scale(scale)
    r.a_bool("causal", causal)
    if causal and len(shape) < 2:
        raise ValueError(f"causal: needs x of shape [..., Q, K] with at least 2 dimensions, got shape {tuple(shape)}")
    return SoftmaxOptions(scale, causal)


# --- the raw ops (torch.ops.fuselet.softmax_*: the fake impls; softmax_fwd's: softmax) ----------


def bwd_op(dy: tuple, y: tuple, scale) -> None:
    """softmax_bwd: y [..., K] (K > 0), dy rows like y, scale."""
    rows, keys = r.op_rows("y", *y, "K")
    r.last_positive("y", y[0], "the last dimension (keys)")
    _scale(scale)
    r.op_rows_like("dy", *dy, ("y", y[1]), rows, keys)


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

EXAMPLES = {"softmax": {"x": Array((2, 4))}}
S = tuple(EXAMPLES)
REFUSALS = [
    Refusal(S, {"x": Array((2, 4), "int32")}, TypeError, "x: expected dtype float32, float16 or bfloat16, got int32"),
    Refusal(S, {"x": Array((1,) * 8 + (4,))}, ValueError, "x: expected at most 8 dimensions, got 9"),
    Refusal(S, {"x": Array(())}, ValueError, "x: expected shape [..., K] with at least 1 dimension, got a 0-d array"),
    Refusal(S, {"x": Array((2, 0))}, ValueError, "x: the last dimension (keys) must be > 0, got shape (2, 0)"),
    Refusal(S, {"scale": None}, TypeError, "scale: expected a Python float, got NoneType"),
    Refusal(S, {"scale": float("nan")}, ValueError, "scale: expected a finite number, got nan"),
    Refusal(S, {"scale": 1e39}, ValueError, "scale: expected a magnitude float32 can hold"),
    Refusal(S, {"causal": 1}, TypeError, "causal: expected a bool, got int"),
    Refusal(
        S,
        {"x": Array((4,)), "causal": True},
        ValueError,
        "causal: needs x of shape [..., Q, K] with at least 2 dimensions, got shape (4,)",
    ),
]
OP_REFUSALS = [
    Refusal(
        ("softmax_bwd",),
        {"dy": Array((2, 0)), "y": Array((2, 0))},
        ValueError,
        "y: the last dimension (keys) must be > 0, got shape (2, 0)",
    ),
    Refusal(
        ("softmax_bwd",),
        {"dy": Array(()), "y": Array(())},
        ValueError,
        "y: expected shape [..., K] with at least 1 dimension, got a 0-d array",
    ),
    Refusal(
        ("softmax_bwd",),
        {"dy": Array((2, 4)), "y": Array((2, 4)), "scale": float("inf")},
        ValueError,
        "scale: expected a finite number, got inf",
    ),
    Refusal(
        ("softmax_bwd",),
        {"dy": Array((2, 3)), "y": Array((2, 4))},
        ValueError,
        "dy: expected 2 rows of 4 elements, got 2 rows of 3",
    ),
]
