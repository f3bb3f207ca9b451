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


def check_glu_args(x_shape: tuple, x_dtype: str) -> None:
    """x: [..., 2F], the gate and up halves: an even last dimension > 0."""
    check_dtype("x", x_dtype)
    if len(x_shape) == 0:
        raise ValueError("x: expected shape [..., 2F] with at least 1 dimension, got a 0-d array")
    if x_shape[-1] == 0 or x_shape[-1] % 2:
        raise ValueError(f"x: expected an even last dimension > 0 (2F: the gate and up halves), got shape {tuple(x_shape)}")


def check_clamped_glu_options(alpha, limit, interleaved) -> None:
    """clamped_swiglu's alpha (finite), limit (finite, > 0) and interleaved (a bool)."""
    for name, value, rule in (("alpha", alpha, "a finite number"), ("limit", limit, "a finite number > 0")):
        if not _is_number(value):
            raise TypeError(f"{name}: expected a Python float, got {type(value).__name__}")
        if not _finite(value) or (name == "limit" and not value > 0):
            raise ValueError(f"{name}: expected {rule}, got {value}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool, got {type(interleaved).__name__}")


def check_approximate(approximate) -> None:
    if not isinstance(approximate, str):
        raise TypeError(f"approximate: expected 'none' or 'tanh', got {type(approximate).__name__}")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")


def check_softmax_args(x_shape: tuple, x_dtype: str, scale, causal) -> None:
    """x: [..., K] ([..., Q, K] when causal), K > 0; scale: a finite float; causal: a bool."""
    check_dtype("x", x_dtype)
    if len(x_shape) == 0:
        raise ValueError("x: expected shape [..., K] with at least 1 dimension, got a 0-d array")
    if x_shape[-1] == 0:
        raise ValueError(f"x: the last dimension (keys) must be > 0, got shape {tuple(x_shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a Python float, got {type(scale).__name__}")
    if not _finite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if causal and len(x_shape) < 2:
        raise ValueError(f"causal: needs x of shape [..., Q, K] with at least 2 dimensions, got shape {tuple(x_shape)}")


ROPE_LAYOUTS = ("bshd", "bhsd")


def check_rope_args(
    x_shape: tuple, x_dtype: str, cos_shape: tuple, cos_dtype: str, sin_shape: tuple, sin_dtype: str, layout, interleaved
) -> None:
    """x: [B, S, N, D] ("bshd") or [B, N, S, D] ("bhsd"), B optional, D > 0; cos and sin: [S, R]
    or [B, S, R] (not with a B-less x), one dtype (float32 or x's), R even in [2, D]."""
    check_dtype("x", x_dtype)
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected 'bshd' or 'bhsd', got {type(layout).__name__}")
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool, got {type(interleaved).__name__}")
    x_shape, cos_shape, sin_shape = tuple(x_shape), tuple(cos_shape), tuple(sin_shape)
    names = "[B, S, N, D] or [S, N, D]" if layout == "bshd" else "[B, N, S, D] or [N, S, D]"
    if len(x_shape) not in (3, 4):
        raise ValueError(f"x: expected shape {names} (layout {layout!r}), got shape {x_shape}")
    if x_shape[-1] == 0:
        raise ValueError(f"x: the head dim D (last dimension) must be > 0, got shape {x_shape}")
    check_param_dtype("cos", cos_dtype, x_dtype, None)
    check_param_dtype("sin", sin_dtype, x_dtype, ("cos", cos_dtype))
    has_b = len(x_shape) == 4
    s_dim = (1 if has_b else 0) + (0 if layout == "bshd" else 1)
    if len(cos_shape) != 2 and not (has_b and len(cos_shape) == 3):
        expected = "[S, R] or [B, S, R]" if has_b else "[S, R] (x has no batch dim)"
        raise ValueError(f"cos: expected shape {expected}, got shape {cos_shape}")
    head_dim, rotary = x_shape[-1], cos_shape[-1]
    if rotary < 2 or rotary > head_dim or rotary % 2:
        raise ValueError(f"cos: the rotary dim R (last dimension) must be even and in [2, D={head_dim}], got shape {cos_shape}")
    if cos_shape[-2] != x_shape[s_dim]:
        raise ValueError(f"cos: expected {x_shape[s_dim]} positions (S, dim {s_dim} of x {x_shape}), got shape {cos_shape}")
    if len(cos_shape) == 3 and cos_shape[0] != x_shape[0]:
        raise ValueError(f"cos: expected a batch of {x_shape[0]} (B, dim 0 of x {x_shape}), got shape {cos_shape}")
    if sin_shape != cos_shape:
        raise ValueError(f"sin: expected shape {cos_shape} (the shape of cos), got {sin_shape}")


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
