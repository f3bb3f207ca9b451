"""cross_entropy, its fwd_bwd helper and the log-probabilities of a chunk (fuselet/cross_entropy.h): logits [..., V] of a float
dtype, V > 0; target logits.shape[:-1] of int32 / int64 class ids; ignore_index an int64;
label_smoothing in [0, 1]; z_loss a finite number >= 0 and softcap None or a finite number > 0,
both also in float32; reduction "none", "sum" or "mean"; return_z_loss a bool; fwd_bwd's
grad_scale a finite number, also in float32."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal

REDUCTIONS = ("none", "sum", "mean")


@dataclass(frozen=True)
class CrossEntropyOptions:
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None
    reduction: str = "mean"
    return_z_loss: bool = False

    def op_args(self) -> tuple:
        """The raw ops' scalar arguments: (ignore_index, label_smoothing, z_loss, softcap), softcap
        None as 0.0 (the kernels' "no softcap")."""
        softcap = 0.0 if self.softcap is None else float(self.softcap)
        return int(self.ignore_index), float(self.label_smoothing), float(self.z_loss), softcap


def options(ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean", return_z_loss=False):
    """The options alone (fused_linear_cross_entropy takes them too)."""
    r.int64("ignore_index", ignore_index)
    r.number("label_smoothing", label_smoothing, low=0, high=1, finite_only=False)
    r.number("z_loss", z_loss, low=0)
    r.float32("z_loss", z_loss)
    r.number("softcap", softcap, low=0, low_open=True, optional=True)
    if softcap is not None:  # 0 in float32 would be the kernels' "no softcap"
        r.float32("softcap", softcap, positive=True)
    r.one_of("reduction", reduction, REDUCTIONS, "'none', 'sum' or 'mean'")
    r.a_bool("return_z_loss", return_z_loss)
    return CrossEntropyOptions(ignore_index, label_smoothing, z_loss, softcap, reduction, return_z_loss)


def _logits(logits: tuple) -> None:
    shape, dtype = logits
    r.float_dtype("logits", dtype)
    r.max_dims("logits", shape)
    r.rows("logits", shape, "[..., V]")
    r.last_positive("logits", shape, "the number of classes (last dimension)")


def cross_entropy(logits: tuple, target: tuple, **opts) -> CrossEntropyOptions:
    """logits and target (shape, dtype); opts: those of options()."""
    _logits(logits)
    r.index_dtype("target", target[1])
    r.same_shape("target", target[0], logits[0][:-1], "the shape of logits without its last dimension")
    return options(**opts)


def grad_scale(value) -> float:
    """fwd_bwd's grad_scale."""
    r.number("grad_scale", value)
    r.float32("grad_scale", value)
    return float(value)


def inplace_backward(value) -> bool:
    """fuselet.torch.cross_entropy's inplace_backward."""
    r.a_bool("inplace_backward", value)
    return value


# --- the raw ops (torch.ops.fuselet.cross_entropy_*: the fake impls) ----------------------------


def op_options(op_args: tuple) -> CrossEntropyOptions:
    """The options of the raw ops' scalar arguments (softcap 0.0: none, as in the core's words):
    op_args() inverted."""
    ignore_index, label_smoothing, z_loss, softcap = op_args
    softcap = None if softcap == 0.0 else softcap
    r.number("softcap", softcap, low=0, low_open=True, optional=True, none="0 (none)")
    return options(ignore_index, label_smoothing, z_loss, softcap, "none")


def op(logits: tuple, target: tuple, op_args: tuple, scale=None, tokens: dict | None = None) -> CrossEntropyOptions:
    """The raw ops: logits as cross_entropy's, target its rows' class ids (any shape), op_args as
    CrossEntropyOptions.op_args() gives them, scale (the fwd_bwd ops' grad_scale) and per-row
    float32 `tokens` {"dloss": (shape, dtype), "lse": ...}."""
    _logits(logits)
    r.index_dtype("target", target[1])
    result = op_options(op_args)
    if scale is not None:
        grad_scale(scale)
    n_rows = math.prod(logits[0][:-1])
    if math.prod(target[0]) != n_rows:
        raise ValueError(f"target: expected {n_rows} elements (the rows of logits), got shape {r.shape_str(target[0])}")
    for name, facts in (tokens or {}).items():
        r.op_vector(name, *facts, n_rows)
    return result


# --- the log-probabilities (fuselet/cross_entropy.h, fuselet_logprobs_*) -------------------------
# logits and target as cross_entropy's; ignore_index and softcap as its options (no label smoothing,
# no z-loss); outputs a set of names among LOGPROBS_OUTPUTS (log_probs and lse come always).

LOGPROBS_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
STATS = ("log_sum_sq_probs", "mean_logits", "is_top1")  # computed together (the raw op's with_stats)


@dataclass(frozen=True)
class LogprobsOptions:
    ignore_index: int = -100
    softcap: float | None = None
    outputs: frozenset = frozenset()

    def op_args(self) -> tuple:
        """The raw logprobs_fwd's scalar arguments: (ignore_index, softcap, with_entropy,
        with_stats), softcap None as 0.0."""
        softcap = 0.0 if self.softcap is None else float(self.softcap)
        return int(self.ignore_index), softcap, "entropy" in self.outputs, any(n in self.outputs for n in STATS)


def _outputs(outputs) -> frozenset:
    names = "a set of names among 'entropy', 'log_sum_sq_probs', 'mean_logits', 'is_top1'"
    if not isinstance(outputs, (set, frozenset, tuple, list)):
        raise TypeError(f"outputs: expected {names}, got {type(outputs).__name__}")
    for name in outputs:
        if not isinstance(name, str) or name not in LOGPROBS_OUTPUTS:
            raise ValueError(f"outputs: expected {names}, got {name!r}")
    return frozenset(outputs)


def logprobs(logits: tuple, target: tuple, ignore_index=-100, softcap=None, outputs=frozenset()) -> LogprobsOptions:
    """The log-probabilities of a chunk (fuselet.<layer>.cross_entropy.logprobs_chunk): logits and
    target (shape, dtype) as cross_entropy's, ignore_index and softcap as its options."""
    _logits(logits)
    r.index_dtype("target", target[1])
    r.same_shape("target", target[0], logits[0][:-1], "the shape of logits without its last dimension")
    options(ignore_index=ignore_index, softcap=softcap)
    return LogprobsOptions(ignore_index, softcap, _outputs(outputs))


def logprobs_op(logits: tuple, target: tuple, op_args: tuple, tokens: dict | None = None) -> None:
    """The raw ops logprobs_fwd and logprobs_bwd_: logits, target as op()'s, op_args (ignore_index,
    softcap) and per-row float32 `tokens` {"lse": (shape, dtype), "entropy": ..., "dlogp": ...,
    "dentropy": ...} (the given ones; entropy needed with dentropy)."""
    _logits(logits)
    r.index_dtype("target", target[1])
    ignore_index, softcap = op_args
    op_options((ignore_index, 0.0, 0.0, softcap))
    n_rows = math.prod(logits[0][:-1])
    if math.prod(target[0]) != n_rows:
        raise ValueError(f"target: expected {n_rows} elements (the rows of logits), got shape {r.shape_str(target[0])}")
    tokens = tokens or {}
    if "dentropy" in tokens and "entropy" not in tokens:
        raise ValueError("entropy: expected a tensor (the forward's entropy, needed with dentropy), got None")
    for name, facts in tokens.items():
        r.op_vector(name, *facts, n_rows)


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

LOGITS, TARGET = Array((2, 4)), Array((2,), "int32")
EXAMPLES = {
    "cross_entropy": {"logits": LOGITS, "target": TARGET},
    "cross_entropy.fwd_bwd": {"logits": LOGITS, "target": TARGET, "grad_scale": 1.0},
    "cross_entropy.logprobs_chunk": {
        "logits": LOGITS,
        "target": TARGET,
        "ignore_index": -100,
        "softcap": None,
        "outputs": frozenset(LOGPROBS_OUTPUTS),
    },
}
BOTH = tuple(EXAMPLES)
LOGPROBS = ("cross_entropy.logprobs_chunk",)
# the options, refused alike by cross_entropy, its fwd_bwd and fused_linear_cross_entropy (and
# the log-probabilities: those they take)
OPTIONS = ("cross_entropy", "cross_entropy.fwd_bwd", "fused_linear_cross_entropy")
REDUCED = ("cross_entropy", "fused_linear_cross_entropy")
REFUSALS = [
    Refusal(
        BOTH, {"logits": Array((2, 4), "float64")}, TypeError, "logits: expected dtype float32, float16 or bfloat16, got float64"
    ),
    Refusal(BOTH, {"logits": Array((1,) * 8 + (2, 4))}, ValueError, "logits: expected at most 8 dimensions, got 10"),
    Refusal(
        BOTH,
        {"logits": Array(()), "target": Array((), "int32")},
        ValueError,
        "logits: expected shape [..., V] with at least 1 dimension, got a 0-d array",
    ),
    Refusal(
        BOTH,
        {"logits": Array((2, 0))},
        ValueError,
        "logits: the number of classes (last dimension) must be > 0, got shape (2, 0)",
    ),
    Refusal(BOTH, {"target": Array((2,))}, TypeError, "target: expected dtype int32 or int64 (class ids), got float32"),
    Refusal(
        BOTH,
        {"target": Array((3,), "int32")},
        ValueError,
        "target: expected shape (2,) (the shape of logits without its last dimension), got (3,)",
        raw="target: expected 2 elements (the rows of logits), got shape [3]",
    ),
    Refusal((*OPTIONS, *LOGPROBS), {"ignore_index": -100.0}, TypeError, "ignore_index: expected a Python int, got float"),
    Refusal(
        (*OPTIONS, *LOGPROBS), {"ignore_index": 2**63}, ValueError, f"ignore_index: expected an int64, got {2**63}", raw=False
    ),
    Refusal(OPTIONS, {"label_smoothing": "0.1"}, TypeError, "label_smoothing: expected a Python float, got str"),
    Refusal(OPTIONS, {"label_smoothing": 1.5}, ValueError, "label_smoothing: expected a number in [0, 1], got 1.5"),
    Refusal(OPTIONS, {"label_smoothing": float("nan")}, ValueError, "label_smoothing: expected a number in [0, 1], got nan"),
    Refusal(OPTIONS, {"z_loss": None}, TypeError, "z_loss: expected a Python float, got NoneType"),
    Refusal(OPTIONS, {"z_loss": -1.0}, ValueError, "z_loss: expected a finite number >= 0, got -1.0"),
    Refusal(OPTIONS, {"z_loss": 1e39}, ValueError, "z_loss: expected a magnitude float32 can hold"),
    Refusal((*OPTIONS, *LOGPROBS), {"softcap": "30"}, TypeError, "softcap: expected None or a Python float, got str"),
    Refusal(
        (*OPTIONS, *LOGPROBS),
        {"softcap": -30.0},
        ValueError,
        "softcap: expected None or a finite number > 0, got -30.0",
        raw="softcap: expected 0 (none) or a finite number > 0, got -30.0",
    ),
    # 0.0 is the raw ops' "no softcap"
    Refusal(
        (*OPTIONS, *LOGPROBS), {"softcap": 0.0}, ValueError, "softcap: expected None or a finite number > 0, got 0.0", raw=False
    ),
    Refusal(
        (*OPTIONS, *LOGPROBS),
        {"softcap": float("inf")},
        ValueError,
        "softcap: expected None or a finite number > 0, got inf",
        raw="softcap: expected 0 (none) or a finite number > 0, got inf",
    ),
    Refusal((*OPTIONS, *LOGPROBS), {"softcap": 1e-50}, ValueError, "softcap: expected a value > 0 in float32"),
    Refusal((*OPTIONS, *LOGPROBS), {"softcap": 1e39}, ValueError, "softcap: expected a magnitude float32 can hold"),
    Refusal(REDUCED, {"reduction": "avg"}, ValueError, "reduction: expected 'none', 'sum' or 'mean', got 'avg'"),
    Refusal(REDUCED, {"reduction": None}, TypeError, "reduction: expected 'none', 'sum' or 'mean', got NoneType"),
    Refusal(REDUCED, {"return_z_loss": 1}, TypeError, "return_z_loss: expected a bool, got int"),
    # fuselet.torch's alone (fuselet.jax.cross_entropy has no such argument)
    Refusal(("cross_entropy",), {"inplace_backward": "yes"}, TypeError, "inplace_backward: expected a bool, got str"),
    Refusal(("cross_entropy.fwd_bwd",), {"grad_scale": "1"}, TypeError, "grad_scale: expected a Python float, got str"),
    Refusal(
        ("cross_entropy.fwd_bwd",), {"grad_scale": float("inf")}, ValueError, "grad_scale: expected a finite number, got inf"
    ),
    Refusal(("cross_entropy.fwd_bwd",), {"grad_scale": -1e39}, ValueError, "grad_scale: expected a magnitude float32"),
    Refusal(
        LOGPROBS,
        {"outputs": "entropy"},
        TypeError,
        "outputs: expected a set of names among 'entropy', 'log_sum_sq_probs', 'mean_logits', 'is_top1', got str",
    ),
    Refusal(
        LOGPROBS,
        {"outputs": {"logp"}},  # one name: the ids of the tests are the same in every process
        ValueError,
        "outputs: expected a set of names among 'entropy', 'log_sum_sq_probs', 'mean_logits', 'is_top1', got 'logp'",
    ),
]
# the raw ops' default scalars, by their names
OP_ARGS = dict(zip(("ignore_index", "label_smoothing", "z_loss", "softcap"), CrossEntropyOptions().op_args()))
LOGPROBS_BWD = {  # the optional tensors None unless a refusal gives them
    "logits": LOGITS,
    "target": TARGET,
    "lse": Array((2,)),
    "entropy": None,
    "dlogp": None,
    "dentropy": None,
    "ignore_index": -100,
    "softcap": 0.0,
}
OP_REFUSALS = [
    Refusal(
        ("cross_entropy_bwd",),
        {"dloss": Array((3,)), "logits": LOGITS, "target": TARGET, "lse": Array((2,)), **OP_ARGS},
        ValueError,
        "dloss: expected 2 elements, got shape [3]",
    ),
    Refusal(("logprobs_bwd_",), {**LOGPROBS_BWD, "dlogp": Array((3,))}, ValueError, "dlogp: expected 2 elements, got shape [3]"),
    Refusal(
        ("logprobs_bwd_",),
        {**LOGPROBS_BWD, "dlogp": Array((2,), "float16")},
        TypeError,
        "dlogp: expected dtype float32, got float16",
    ),
    Refusal(
        ("logprobs_bwd_",),
        {**LOGPROBS_BWD, "dentropy": Array((2,))},
        ValueError,
        "entropy: expected a tensor (the forward's entropy, needed with dentropy)",
    ),
    Refusal(
        ("logprobs_bwd_",),
        {**LOGPROBS_BWD, "entropy": Array((2,)), "dentropy": Array((3,))},
        ValueError,
        "dentropy: expected 2 elements",
    ),
]
