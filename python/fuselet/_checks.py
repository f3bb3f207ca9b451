"""Argument checks shared by the torch and jax layers, so both raise the same messages.

Each function takes plain facts (shapes as tuples, dtype names as strings) and raises
TypeError (wrong kind or dtype) or ValueError (wrong shape or value) naming the argument.
"""

from __future__ import annotations

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_INF = float("inf")
_FLOAT32_TINY = 1.401298464324817e-45  # the smallest float32 subnormal


def _finite(v) -> bool:
    """_finite(v) in comparisons only (False for NaN and +-inf): torch.compile traces
    them on a symbolic float (a SymFloat eps or scale), where math.isfinite breaks the graph."""
    return -_INF < v < _INF and _fits_float(v)


def _fits_float(v) -> bool:
    """False for a Python int beyond the float range (float(v) would raise OverflowError)."""
    if type(v) is not int:
        return True
    try:
        float(v)
    except OverflowError:
        return False
    return True


def check_dtype(name: str, dtype: str, like: str | None = None) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {dtype}")
    if like is not None and dtype != like:
        raise TypeError(f"{name}: expected dtype {like} (the dtype of x), got {dtype}")


def check_param_dtype(name: str, dtype: str, x_dtype: str, like: tuple[str, str] | None) -> None:
    """Parameters are in x's dtype or float32, all in one dtype (`like`: (name, dtype) of one seen before)."""
    check_dtype(name, dtype)
    if like is not None:
        if dtype != like[1]:
            raise TypeError(f"{name}: expected dtype {like[1]} (the dtype of {like[0]}), got {dtype}")
    elif dtype not in (x_dtype, "float32"):
        also = "" if x_dtype == "float32" else " or float32"
        raise TypeError(f"{name}: expected dtype {x_dtype} (the dtype of x){also}, got {dtype}")


INDEX_DTYPES = ("int32", "int64")
REDUCTIONS = ("none", "sum", "mean")
_INT64 = (-(2**63), 2**63 - 1)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# The divergences of fuselet/divergence.h: the public op, its kind code (fuselet_divergence_kind).
DIVERGENCE_KINDS = {"kl_div": 0, "jsd": 1, "tvd": 2}
_DIVERGENCE_OPS = {code: op for op, code in DIVERGENCE_KINDS.items()}
KL_REDUCTIONS = ("none", "batchmean", "sum", "mean")


def check_divergence_args(
    op: str,
    input_shape: tuple,
    input_dtype: str,
    target_shape: tuple,
    target_dtype: str,
    *,
    log_target=True,
    reduction="batchmean",
    beta=0.0,
    labels: tuple | None = None,
    ignore_index=-100,
) -> None:
    """input, target: [..., V] log-probabilities (target: probabilities for kl_div with
    log_target=False), one shape and float dtype, V > 0; kl_div: log_target a bool, reduction one
    of KL_REDUCTIONS; jsd: beta in [0, 1]; jsd and tvd: labels (shape, dtype) of input.shape[:-1]
    int32/int64 ids or None, ignore_index an int."""
    check_dtype("input", input_dtype)
    if len(input_shape) == 0:
        raise ValueError("input: expected shape [..., V] with at least 1 dimension, got a 0-d array")
    if input_shape[-1] == 0:
        raise ValueError(f"input: the number of classes (last dimension) must be > 0, got shape {tuple(input_shape)}")
    if target_dtype != input_dtype:
        check_dtype("target", target_dtype)
        raise TypeError(f"target: expected dtype {input_dtype} (the dtype of input), got {target_dtype}")
    if tuple(target_shape) != tuple(input_shape):
        raise ValueError(f"target: expected shape {tuple(input_shape)} (the shape of input), got {tuple(target_shape)}")
    if op == "kl_div":
        if not isinstance(log_target, bool):
            raise TypeError(f"log_target: expected a bool, got {type(log_target).__name__}")
        if not isinstance(reduction, str) or reduction not in KL_REDUCTIONS:
            raise ValueError(f"reduction: expected one of {', '.join(map(repr, KL_REDUCTIONS))}, got {reduction!r}")
        return
    if op == "jsd":
        if not _is_number(beta):
            raise TypeError(f"beta: expected a Python float, got {type(beta).__name__}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta: expected a float in [0, 1], got {beta}")
    if labels is not None:
        shape, dtype = labels
        if dtype not in INDEX_DTYPES:
            raise TypeError(f"labels: expected dtype int32 or int64 (class ids), got {dtype}")
        if tuple(shape) != tuple(input_shape[:-1]):
            raise ValueError(
                f"labels: expected shape {tuple(input_shape[:-1])} (the shape of input without its last dimension), "
                f"got {tuple(shape)}"
            )
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected a Python int, got {type(ignore_index).__name__}")
    if not _INT64[0] <= ignore_index <= _INT64[1]:
        raise ValueError(f"ignore_index: expected an int64, got {ignore_index}")


def check_divergence_options(kind, log_target, beta) -> None:
    """The raw ops' options (torch.ops.fuselet.divergence_*, the FFI targets), as the core checks
    them: kind a DIVERGENCE_KINDS code, log_target True except with KL, beta in [0, 1] for JSD and
    0 for the others."""
    names = _DIVERGENCE_OPS
    if isinstance(kind, bool) or kind not in names:
        raise ValueError(f"kind: expected 0 (KL), 1 (JSD) or 2 (TVD), got {kind!r}")
    if not isinstance(log_target, bool):
        raise TypeError(f"log_target: expected a bool, got {type(log_target).__name__}")
    if names[kind] != "kl_div" and not log_target:
        raise ValueError("log_target: expected True (target as log-probabilities) for JSD and TVD, got False")
    if not _is_number(beta):
        raise TypeError(f"beta: expected a Python float, got {type(beta).__name__}")
    if names[kind] == "jsd" and not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta: expected a float in [0, 1], got {beta}")
    if names[kind] != "jsd" and beta != 0.0:
        raise ValueError(f"beta: expected 0 (beta is JSD's), got {beta}")
