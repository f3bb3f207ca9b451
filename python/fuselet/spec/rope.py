"""rope (fuselet/rope.h): x [B, S, N, D] (layout "bshd") or [B, N, S, D] ("bhsd"), B optional,
of a float dtype, D > 0; cos and sin [S, R] or [B, S, R] (not with a B-less x), one dtype
(float32 or x's), R even in [2, D]; interleaved a bool."""

from __future__ import annotations

from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal

LAYOUTS = ("bshd", "bhsd")


@dataclass(frozen=True)
class RopeOptions:
    layout: str = "bshd"
    interleaved: bool = False

    def op_args(self) -> tuple:
        """rope_fwd's (and rope_bwd's) scalar arguments: (bhsd, interleaved)."""
        return self.layout == "bhsd", self.interleaved


def rope(x: tuple, cos: tuple, sin: tuple, layout="bshd", interleaved=False, x_name: str = "x") -> RopeOptions:
    """x, cos, sin (shape, dtype); x_name: how the messages name x (rope_bwd's: dy)."""
    (x_shape, x_dtype), (cos_shape, cos_dtype), (sin_shape, sin_dtype) = x, cos, sin
    r.float_dtype(x_name, x_dtype)
    r.one_of("layout", layout, LAYOUTS, "'bshd' or 'bhsd'")
    r.a_bool("interleaved", interleaved)
    x_shape, cos_shape, sin_shape = tuple(x_shape), tuple(cos_shape), tuple(sin_shape)
    names = "[B, S, N, D] or [S, N, D]" if layout == "bshd" else "[B, N, S, D] or [N, S, D]"
    if len(x_shape) not in (3, 4):
        raise ValueError(f"{x_name}: expected shape {names} (layout {layout!r}), got shape {x_shape}")
    r.last_positive(x_name, x_shape, "the head dim D (last dimension)")
    r.param_dtype("cos", cos_dtype, (x_name, x_dtype), None)
    r.param_dtype("sin", sin_dtype, (x_name, x_dtype), ("cos", cos_dtype))
    has_b = len(x_shape) == 4
    s_dim = (1 if has_b else 0) + (0 if layout == "bshd" else 1)
    if len(cos_shape) != 2 and not (has_b and len(cos_shape) == 3):
        expected = "[S, R] or [B, S, R]" if has_b else "[S, R] (x has no batch dim)"
        raise ValueError(f"cos: expected shape {expected}, got shape {cos_shape}")
    head_dim, rotary = x_shape[-1], cos_shape[-1]
    if rotary < 2 or rotary > head_dim or rotary % 2:
        raise ValueError(f"cos: the rotary dim R (last dimension) must be even and in [2, D={head_dim}], got shape {cos_shape}")
    if cos_shape[-2] != x_shape[s_dim]:
        raise ValueError(
            f"cos: expected {x_shape[s_dim]} positions (S, dim {s_dim} of {x_name} {x_shape}), got shape {cos_shape}"
        )
    if len(cos_shape) == 3 and cos_shape[0] != x_shape[0]:
        raise ValueError(f"cos: expected a batch of {x_shape[0]} (B, dim 0 of {x_name} {x_shape}), got shape {cos_shape}")
    r.same_shape("sin", sin_shape, cos_shape, "the shape of cos")
    return RopeOptions(layout, interleaved)


def op(x_name: str, x: tuple, cos: tuple, sin: tuple, bhsd, interleaved) -> RopeOptions:
    """The raw ops rope_fwd (x) and rope_bwd (x_name dy), whose layout is the flag bhsd."""
    return rope(x, cos, sin, "bhsd" if bhsd else "bshd", interleaved, x_name)


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

X, TABLE = Array((2, 3, 4, 8)), Array((3, 8))
EXAMPLES = {"rope": {"x": X, "cos": TABLE, "sin": TABLE}}
R = tuple(EXAMPLES)
REFUSALS = [
    Refusal(R, {"x": Array((2, 3, 4, 8), "float64")}, TypeError, "x: expected dtype float32, float16 or bfloat16, got float64"),
    Refusal(R, {"layout": "bsnd"}, ValueError, "layout: expected 'bshd' or 'bhsd', got 'bsnd'"),
    Refusal(R, {"layout": 0}, TypeError, "layout: expected 'bshd' or 'bhsd', got int"),
    Refusal(R, {"interleaved": 1}, TypeError, "interleaved: expected a bool, got int"),
    Refusal(R, {"x": Array((3, 8))}, ValueError, "x: expected shape [B, S, N, D] or [S, N, D] (layout 'bshd'), got shape (3, 8)"),
    Refusal(R, {"x": Array((2, 3, 4, 0))}, ValueError, "x: the head dim D (last dimension) must be > 0, got shape (2, 3, 4, 0)"),
    Refusal(
        R,
        {"x": Array((2, 3, 4, 8), "bfloat16"), "cos": Array((3, 8), "float16")},
        TypeError,
        "cos: expected dtype bfloat16 (the dtype of x) or float32, got float16",
    ),
    Refusal(R, {"sin": Array((3, 8), "bfloat16")}, TypeError, "sin: expected dtype float32 (the dtype of cos), got bfloat16"),
    Refusal(R, {"cos": Array((8,))}, ValueError, "cos: expected shape [S, R] or [B, S, R], got shape (8,)"),
    Refusal(
        R,
        {"cos": Array((3, 7))},
        ValueError,
        "cos: the rotary dim R (last dimension) must be even and in [2, D=8], got shape (3, 7)",
    ),
    Refusal(R, {"cos": Array((4, 8))}, ValueError, "cos: expected 3 positions (S, dim 1 of x (2, 3, 4, 8)), got shape (4, 8)"),
    Refusal(
        R, {"cos": Array((3, 3, 8))}, ValueError, "cos: expected a batch of 2 (B, dim 0 of x (2, 3, 4, 8)), got shape (3, 3, 8)"
    ),
    Refusal(R, {"sin": Array((3, 6))}, ValueError, "sin: expected shape (3, 8) (the shape of cos), got (3, 6)"),
]
OP_REFUSALS = [
    Refusal(
        ("rope_bwd",),
        {"dy": Array((2, 3, 4, 8), "int32"), "cos": TABLE, "sin": TABLE},
        TypeError,
        "dy: expected dtype float32, float16 or bfloat16, got int32",
    ),
]
