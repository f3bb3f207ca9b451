"""rope (fuselet/rope.h): x [B, S, N, D] (layout "bshd") or [B, N, S, D] ("bhsd"), B optional,
of a float dtype, D > 0; cos and sin [S, R] or [B, S, R] (not with a B-less x), one dtype
(float32 or x's), R even in [2, D]; interleaved a bool.

pair_table (a bool): cos and sin hold one column per rotating pair, [S, R/2] or [B, S, R/2]
(R = 2 x their last dim, in [2, D]). sections (None or 1 to MAX_SECTIONS ints >= 0 summing to
R/2): cos and sin get a leading dim of K = len(sections) tables, [K, S, R'] or [K, B, S, R'],
and pair j reads table k(j) (sections_table); interleaved_sections (a bool, with sections only):
Qwen3-VL's interleaved rule, whose section k >= 1 must fit: K (s_k - 1) + k < R/2."""

from __future__ import annotations

from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal

LAYOUTS = ("bshd", "bhsd")
MAX_SECTIONS = 4  # FUSELET_ROPE_MAX_SECTIONS of fuselet/rope.h


@dataclass(frozen=True)
class RopeOptions:
    layout: str = "bshd"
    interleaved: bool = False
    pair_table: bool = False
    sections: tuple[int, ...] | None = None
    interleaved_sections: bool = False

    def op_args(self) -> tuple:
        """rope_fwd's (and rope_bwd's) scalar arguments: (bhsd, interleaved, pair_table, sections
        as a list or None, interleaved_sections)."""
        sections = list(self.sections) if self.sections is not None else None
        return self.layout == "bhsd", self.interleaved, self.pair_table, sections, self.interleaved_sections


def sections_table(j: int, sections: tuple[int, ...], interleaved: bool) -> int:
    """The table k(j) that pair j reads (fuselet/rope.h): contiguous, the section j falls in by
    the cumulative sums (transformers' Qwen2-VL recomposition); interleaved, with K tables,
    m = j % K when m != 0 and j < K * s_m, else 0 (Qwen3-VL's apply_interleaved_mrope)."""
    k = len(sections)
    if interleaved:
        m = j % k
        return m if m != 0 and j < k * sections[m] else 0
    end = 0
    for table, size in enumerate(sections[:-1]):
        end += size
        if j < end:
            return table
    return k - 1


def _sections(sections, interleaved_sections) -> tuple[int, ...] | None:
    """sections' type and count (its values need R: _section_values)."""
    r.a_bool("interleaved_sections", interleaved_sections)
    if sections is None:
        if interleaved_sections:
            raise ValueError("interleaved_sections: needs sections (got sections=None)")
        return None
    if not isinstance(sections, (tuple, list)) or any(isinstance(v, bool) or not isinstance(v, int) for v in sections):
        raise TypeError(f"sections: expected None or a tuple of ints, got {type(sections).__name__}")
    if not 1 <= len(sections) <= MAX_SECTIONS:
        raise ValueError(f"sections: expected 1 to {MAX_SECTIONS} sections (one per table), got {len(sections)}")
    return tuple(sections)


def _section_values(sections: tuple[int, ...], pairs: int, interleaved_sections: bool) -> None:
    for k, size in enumerate(sections):
        if size < 0:
            raise ValueError(f"sections: expected each >= 0, got {size} (section {k})")
    if sum(sections) != pairs:
        raise ValueError(f"sections: expected a sum of {pairs} (R/2, the rotating pairs), got {sum(sections)}")
    n = len(sections)
    for k, size in enumerate(sections):
        if interleaved_sections and k > 0 and size > 0 and n * (size - 1) + k >= pairs:
            raise ValueError(
                f"sections: interleaved section {k} reads pairs {k}, {k + n}, ... up to {n * (size - 1) + k}, "
                f"beyond the R/2 = {pairs} pairs (K * (s_k - 1) + k < R/2)"
            )


def rope(
    x: tuple,
    cos: tuple,
    sin: tuple,
    layout="bshd",
    interleaved=False,
    pair_table=False,
    sections=None,
    interleaved_sections=False,
    x_name: str = "x",
) -> RopeOptions:
    """x, cos, sin (shape, dtype); x_name: how the messages name x (rope_bwd's: dy)."""
    (x_shape, x_dtype), (cos_shape, cos_dtype), (sin_shape, sin_dtype) = x, cos, sin
    r.float_dtype(x_name, x_dtype)
    r.one_of("layout", layout, LAYOUTS, "'bshd' or 'bhsd'")
    r.a_bool("interleaved", interleaved)
    r.a_bool("pair_table", pair_table)
    x_shape, cos_shape, sin_shape = tuple(x_shape), tuple(cos_shape), tuple(sin_shape)
    names = "[B, S, N, D] or [S, N, D]" if layout == "bshd" else "[B, N, S, D] or [N, S, D]"
    if len(x_shape) not in (3, 4):
        raise ValueError(f"{x_name}: expected shape {names} (layout {layout!r}), got shape {x_shape}")
    r.last_positive(x_name, x_shape, "the head dim D (last dimension)")
    r.param_dtype("cos", cos_dtype, (x_name, x_dtype), None)
    r.param_dtype("sin", sin_dtype, (x_name, x_dtype), ("cos", cos_dtype))
    sections = _sections(sections, interleaved_sections)
    kd = 0 if sections is None else 1  # cos / sin: the K dim
    has_b = len(x_shape) == 4
    s_dim = (1 if has_b else 0) + (0 if layout == "bshd" else 1)
    if len(cos_shape) != 2 + kd and not (has_b and len(cos_shape) == 3 + kd):
        w, k = ("R/2" if pair_table else "R"), ("K, " if kd else "")
        expected = f"[{k}S, {w}] or [{k}B, S, {w}]" if has_b else f"[{k}S, {w}] (x has no batch dim)"
        raise ValueError(f"cos: expected shape {expected}, got shape {cos_shape}")
    if kd and cos_shape[0] != len(sections):
        raise ValueError(f"cos: expected {len(sections)} tables (K, one per section), got shape {cos_shape}")
    head_dim, width = x_shape[-1], cos_shape[-1]
    rotary = 2 * width if pair_table else width
    if pair_table and (rotary < 2 or rotary > head_dim):
        raise ValueError(
            f"cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D={head_dim}], got shape {cos_shape}"
        )
    if rotary < 2 or rotary > head_dim or rotary % 2:
        raise ValueError(f"cos: the rotary dim R (last dimension) must be even and in [2, D={head_dim}], got shape {cos_shape}")
    if cos_shape[-2] != x_shape[s_dim]:
        raise ValueError(
            f"cos: expected {x_shape[s_dim]} positions (S, dim {s_dim} of {x_name} {x_shape}), got shape {cos_shape}"
        )
    if len(cos_shape) == 3 + kd and cos_shape[kd] != x_shape[0]:
        raise ValueError(f"cos: expected a batch of {x_shape[0]} (B, dim 0 of {x_name} {x_shape}), got shape {cos_shape}")
    r.same_shape("sin", sin_shape, cos_shape, "the shape of cos")
    if sections is not None:
        _section_values(sections, rotary // 2, interleaved_sections)
    return RopeOptions(layout, interleaved, pair_table, sections, interleaved_sections)


def op(
    x_name: str, x: tuple, cos: tuple, sin: tuple, bhsd, interleaved, pair_table=False, sections=None, interleaved_sections=False
) -> RopeOptions:
    """The raw ops rope_fwd (x) and rope_bwd (x_name dy), whose layout is the flag bhsd and whose
    sections are a list, None or [] for none (torch's tracing may give an absent int[]? as [])."""
    if isinstance(sections, (tuple, list)) and len(sections) == 0:
        sections = None
    return rope(x, cos, sin, "bhsd" if bhsd else "bshd", interleaved, pair_table, sections, interleaved_sections, x_name)


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

X, TABLE = Array((2, 3, 4, 8)), Array((3, 8))
SECTIONS = {"cos": Array((2, 3, 8)), "sin": Array((2, 3, 8))}  # two tables [K, S, R]
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
    # the pair table
    Refusal(R, {"pair_table": 1}, TypeError, "pair_table: expected a bool, got int"),
    Refusal(
        R,
        {"pair_table": True, "cos": Array((3, 5)), "sin": Array((3, 5))},
        ValueError,
        "cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D=8], got shape (3, 5)",
    ),
    Refusal(
        R,
        {"pair_table": True, "cos": Array((8,)), "sin": Array((8,))},
        ValueError,
        "cos: expected shape [S, R/2] or [B, S, R/2], got shape (8,)",
    ),
    # sections
    Refusal(R, {"interleaved_sections": 1}, TypeError, "interleaved_sections: expected a bool, got int"),
    Refusal(R, {"interleaved_sections": True}, ValueError, "interleaved_sections: needs sections (got sections=None)"),
    Refusal(R, {"sections": "2,2"}, TypeError, "sections: expected None or a tuple of ints, got str"),
    Refusal(R, {"sections": (1, 1, 1, 1, 0)}, ValueError, "sections: expected 1 to 4 sections (one per table), got 5"),
    Refusal(R, {"sections": (2, 2)}, ValueError, "cos: expected shape [K, S, R] or [K, B, S, R], got shape (3, 8)"),
    Refusal(
        R,
        {"sections": (2, 2), "cos": Array((3, 3, 8)), "sin": Array((3, 3, 8))},
        ValueError,
        "cos: expected 2 tables (K, one per section), got shape (3, 3, 8)",
    ),
    Refusal(
        R,
        {"sections": (2, 2), "cos": Array((2, 3, 3, 8)), "sin": Array((2, 3, 3, 8))},
        ValueError,
        "cos: expected a batch of 2 (B, dim 0 of x (2, 3, 4, 8)), got shape (2, 3, 3, 8)",
    ),
    Refusal(R, {"sections": (5, -1), **SECTIONS}, ValueError, "sections: expected each >= 0, got -1 (section 1)"),
    Refusal(R, {"sections": (2, 1), **SECTIONS}, ValueError, "sections: expected a sum of 4 (R/2, the rotating pairs), got 3"),
    Refusal(
        R,
        {"sections": (1, 3), "interleaved_sections": True, **SECTIONS},
        ValueError,
        "sections: interleaved section 1 reads pairs 1, 3, ... up to 5, beyond the R/2 = 4 pairs (K * (s_k - 1) + k < R/2)",
    ),
]
OP_REFUSALS = [
    Refusal(
        ("rope_bwd",),
        {"dy": Array((2, 3, 4, 8), "int32"), "cos": TABLE, "sin": TABLE},
        TypeError,
        "dy: expected dtype float32, float16 or bfloat16, got int32",
    ),
]
