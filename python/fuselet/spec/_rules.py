"""The primitive argument rules, each written once with its words: the op specs of this package
(spec/<op>.py) are made of them.

A rule takes an argument's name and plain facts (a number, a shape as a tuple, a dtype name) and
raises TypeError (wrong kind or dtype) or ValueError (wrong value or shape) with a message that
names the argument first and says what was expected: "<name>: expected <what>, got <value>".

Numbers and shapes are compared with <, <=, == and != only: under torch.compile an option may be
a symbolic float (a SymFloat eps or scale) and a dimension a SymInt, where math.isfinite or a
conversion would break the graph.
"""

from __future__ import annotations

import math
from typing import NamedTuple

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INDEX_DTYPES = ("int32", "int64")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32
FLOAT32_TINY = 1.401298464324817e-45  # the smallest float32 subnormal
MAX_DIMS = 8  # FUSELET_MAX_DIMS of fuselet/fuselet.h
_INF = float("inf")


class Array(NamedTuple):
    """The facts of an array argument, as the specs take them: (shape, dtype name)."""

    shape: tuple
    dtype: str = "float32"


class Refusal(NamedTuple):
    """One bad value of a spec's table (REFUSALS of each spec module), which tests/test_spec.py
    gives to both layers' public functions and to the raw torch op.

    ops: the public functions (of fuselet.torch and fuselet.jax) it is given to; args: the
    arguments that replace those of the op's valid call (EXAMPLES of the module; arrays as Array);
    error and message: the refusal (message: how it starts). raw: True where the raw op
    (torch.ops.fuselet.<op>, its fake impl on meta tensors) refuses it in the same words, a str
    where the raw op's own rule refuses it in other words (how they start), False where the raw
    op takes the value (it means something else there)."""

    ops: tuple
    args: dict
    error: type
    message: str
    raw: bool | str = True


# --- numbers ---------------------------------------------------------------------------------


def is_number(v) -> bool:
    """A Python int or float (not a bool); a SymFloat under torch.compile passes as a float."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fits_float(v) -> bool:
    """False for a Python int beyond the float range (float(v) would raise OverflowError)."""
    if type(v) is not int:
        return True
    try:
        float(v)
    except OverflowError:
        return False
    return True


def finite(v) -> bool:
    """False for NaN, +-inf and an int beyond the float range; comparisons only (see above)."""
    return -_INF < v < _INF and _fits_float(v)


def shown(v) -> str:
    """v as a message shows it: an int of more than 16 digits by its length."""
    if type(v) is int and not -(10**16) < v < 10**16:
        return f"an int of {len(str(abs(v)))} digits"
    return str(v)


def number(
    name: str, v, *, low=None, high=None, low_open=False, finite_only=True, optional=False, none="None", noun="number"
) -> None:
    """A Python int or float (None too where `optional`: `none`, how the words name it), finite
    where `finite_only`, in [low, high] (low excluded where `low_open`). The words, the core's
    too (csrc/core/src/*_check.cc): "a finite number > 0", "a number in [0, 1]", "None or a
    finite number > 0"."""
    if optional and v is None:
        return
    none = f"{none} or " if optional else ""
    if not is_number(v):
        raise TypeError(f"{name}: expected {none}a Python float, got {type(v).__name__}")
    ok = not finite_only or finite(v)
    if low is not None:
        ok = ok and (v > low if low_open else v >= low)
    if high is not None:
        ok = ok and v <= high
    if not ok:
        if low is not None and high is not None:
            words = f"a {noun} in [{low}, {high}]"
        else:
            words = ("a finite " if finite_only else "a ") + noun
            words += f" {'>' if low_open else '>='} {low}" if low is not None else ""
            words += f" <= {high}" if high is not None else ""
        raise ValueError(f"{name}: expected {none}{words}, got {shown(v)}")


def float32(name: str, v, positive: bool = False) -> None:
    """A number (already checked finite, and > 0 where `positive`) that stays so in float32, the
    precision in which the kernels receive it: 1e39 would become inf there, an eps of 1e-50 zero."""
    if v > FLOAT32_MAX or v < -FLOAT32_MAX:
        raise ValueError(
            f"{name}: expected a magnitude float32 can hold (<= {FLOAT32_MAX:.4g}; the kernels compute in float32), "
            f"got {shown(v)}"
        )
    if positive and v <= FLOAT32_TINY / 2:  # rounds to 0 (half the smallest subnormal: to even, 0)
        raise ValueError(
            f"{name}: expected a value > 0 in float32 (>= {FLOAT32_TINY:.4g}; the kernels compute in float32), "
            f"got {shown(v)}, which float32 rounds to 0"
        )


def inverse_float32(name: str, v) -> None:
    """A number > 0 whose inverse float32 holds (a temperature the logits are divided by)."""
    if v < 1 / FLOAT32_MAX:
        raise ValueError(
            f"{name}: expected a value whose inverse float32 can hold (>= {1 / FLOAT32_MAX:.4g}; the kernels "
            f"compute in float32), got {shown(v)}"
        )


def a_bool(name: str, v) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected a bool, got {type(v).__name__}")


def int64(name: str, v) -> None:
    """A Python int that int64 holds (a class id such as ignore_index)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected a Python int, got {type(v).__name__}")
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{name}: expected an int64, got {v}")


def count(name: str, v, why: str = "") -> None:
    """None or a Python int >= 1 (`why`: what it counts, said after the rule)."""
    if v is None:
        return
    why = f" ({why})" if why else ""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected None or an int{why}, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name}: expected None or an int >= 1{why}, got {v}")


def one_of(name: str, v, choices: tuple, words: str | None = None) -> None:
    """One of the strings `choices` (`words`: how the message lists them; by default "one of
    'a', 'b'")."""
    words = words or "one of " + ", ".join(map(repr, choices))
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected {words}, got {type(v).__name__}")
    if v not in choices:
        raise ValueError(f"{name}: expected {words}, got {v!r}")


# --- dtypes ----------------------------------------------------------------------------------


def float_dtype(name: str, dtype: str, like: tuple[str, str] | None = None) -> None:
    """float32, float16 or bfloat16; where `like` = (its name, its dtype), that dtype."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {dtype}")
    if like is not None and dtype != like[1]:
        raise TypeError(f"{name}: expected dtype {like[1]} (the dtype of {like[0]}), got {dtype}")


def param_dtype(name: str, dtype: str, x: tuple[str, str], like: tuple[str, str] | None) -> None:
    """A parameter: a float dtype, x's = (its name, its dtype) or float32, and that of the one seen
    before (`like`: its name and dtype) if any."""
    float_dtype(name, dtype, like)
    if like is None and dtype not in (x[1], "float32"):
        also = "" if x[1] == "float32" else " or float32"
        raise TypeError(f"{name}: expected dtype {x[1]} (the dtype of {x[0]}){also}, got {dtype}")


def index_dtype(name: str, dtype: str) -> None:
    if dtype not in INDEX_DTYPES:
        raise TypeError(f"{name}: expected dtype int32 or int64 (class ids), got {dtype}")


# --- shapes ----------------------------------------------------------------------------------


def shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def max_dims(name: str, shape) -> None:
    """At most the kernels' MAX_DIMS dimensions."""
    if len(shape) > MAX_DIMS:
        raise ValueError(f"{name}: expected at most {MAX_DIMS} dimensions, got {len(shape)}")


def rows(name: str, shape, pattern: str) -> None:
    """At least one dimension (`pattern`: the shape's words, "[..., H]")."""
    if len(shape) == 0:
        raise ValueError(f"{name}: expected shape {pattern} with at least 1 dimension, got a 0-d array")


def last_positive(name: str, shape, what: str) -> None:
    """A last dimension > 0 (`what`: its words, "the hidden size (last dimension)")."""
    if shape[-1] == 0:
        raise ValueError(f"{name}: {what} must be > 0, got shape {tuple(shape)}")


def same_shape(name: str, shape, expected, why: str) -> None:
    """shape == expected (`why`: what expected is, "the shape of x")."""
    if tuple(shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} ({why}), got {tuple(shape)}")


# --- the raw ops' own rules (torch.ops.fuselet.*: the fake impls), in the core's words ----------


def op_rows(name: str, shape, dtype: str, last: str = "H"):
    """(rows, last dim) of `name` [..., last] of a float dtype, as the core reads it."""
    float_dtype(name, dtype)
    rows(name, shape, f"[..., {last}]")
    return math.prod(shape[:-1]), shape[-1]


def op_rows_like(name: str, shape, dtype: str, like: tuple[str, str], n_rows, cols, suffix: str = "") -> None:
    """`like` = (its name, its dtype)'s dtype, read as n_rows rows of cols elements (any leading shape)."""
    float_dtype(name, dtype, like)
    got_rows, got_cols = op_rows(name, shape, dtype)
    if got_rows != n_rows or got_cols != cols:
        raise ValueError(f"{name}: expected {n_rows} rows of {cols} elements{suffix}, got {got_rows} rows of {got_cols}")


def op_vector(name: str, shape, dtype: str, n, expected: str = "float32") -> None:
    """n elements of dtype `expected`, any shape (per-row statistics and losses)."""
    if dtype != expected:
        raise TypeError(f"{name}: expected dtype {expected}, got {dtype}")
    if math.prod(shape) != n:
        raise ValueError(f"{name}: expected {n} elements, got shape {shape_str(shape)}")
