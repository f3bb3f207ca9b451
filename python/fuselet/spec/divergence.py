"""kl_div, jsd, tvd over one kernel family (fuselet/divergence.h): input and target [..., V]
log-probabilities (target: probabilities for kl_div with log_target=False) of one shape and float
dtype, V > 0; kl_div's log_target a bool and reduction one of KL_REDUCTIONS; jsd's beta in
[0, 1]; jsd's and tvd's labels input.shape[:-1] int32 / int64 ids or None and ignore_index an
int64."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal

# The public op of each kind code of fuselet/divergence.h (fuselet_divergence_kind).
KINDS = {"kl_div": 0, "jsd": 1, "tvd": 2}
KL_REDUCTIONS = ("none", "batchmean", "sum", "mean")


@dataclass(frozen=True)
class DivergenceOptions:
    op: str  # "kl_div", "jsd" or "tvd"
    log_target: bool = True
    beta: float = 0.0
    reduction: str = "batchmean"  # kl_div's; jsd and tvd: the mean over the kept rows
    ignore_index: int = -100

    def op_args(self) -> tuple:
        """The raw ops' scalar arguments: (kind, log_target, beta)."""
        return KINDS[self.op], self.log_target, float(self.beta)


def _input(input: tuple) -> None:
    shape, dtype = input
    r.float_dtype("input", dtype)
    r.max_dims("input", shape)
    r.rows("input", shape, "[..., V]")
    r.last_positive("input", shape, "the number of classes (last dimension)")


def _arrays(input: tuple, target: tuple) -> None:
    _input(input)
    r.float_dtype("target", target[1], ("input", input[1]))
    r.same_shape("target", target[0], input[0], "the shape of input")


def _beta(beta) -> None:
    r.number("beta", beta, low=0, high=1, finite_only=False)


def kept_rows(labels: tuple | None, input_shape: tuple, ignore_index) -> None:
    """jsd's and tvd's labels (shape, dtype) or None, and ignore_index."""
    if labels is not None:
        r.index_dtype("labels", labels[1])
        r.same_shape("labels", labels[0], input_shape[:-1], "the shape of input without its last dimension")
    r.int64("ignore_index", ignore_index)


def kl_div(input: tuple, target: tuple, log_target=False, reduction="batchmean") -> DivergenceOptions:
    _arrays(input, target)
    r.a_bool("log_target", log_target)
    r.one_of("reduction", reduction, KL_REDUCTIONS)
    return DivergenceOptions("kl_div", log_target, 0.0, reduction)


def jsd(input: tuple, target: tuple, beta=0.5, labels: tuple | None = None, ignore_index=-100) -> DivergenceOptions:
    _arrays(input, target)
    _beta(beta)
    kept_rows(labels, input[0], ignore_index)
    return DivergenceOptions("jsd", True, beta, ignore_index=ignore_index)


def tvd(input: tuple, target: tuple, labels: tuple | None = None, ignore_index=-100) -> DivergenceOptions:
    _arrays(input, target)
    kept_rows(labels, input[0], ignore_index)
    return DivergenceOptions("tvd", ignore_index=ignore_index)


# --- the raw ops (torch.ops.fuselet.divergence_*: the fake impls) --------------------------------


def op(input: tuple, target: tuple, kind, log_target, beta, tokens: dict | None = None) -> DivergenceOptions:
    """input as the public ops', target rows like it; kind a KINDS code, log_target True but
    with KL, beta in [0, 1] for JSD and 0 for the others (op_args() of the public ops' options);
    per-row float32 `tokens` {"dloss": (shape, dtype)}."""
    _input(input)
    n_rows, classes = math.prod(input[0][:-1]), input[0][-1]
    r.op_rows_like("target", *target, ("input", input[1]), n_rows, classes)
    ops = {code: op for op, code in KINDS.items()}
    if isinstance(kind, bool) or kind not in ops:
        raise ValueError(f"kind: expected 0 (KL), 1 (JSD) or 2 (TVD), got {kind!r}")
    if ops[kind] != "kl_div" and not log_target:
        raise ValueError("log_target: expected True (target as log-probabilities) for JSD and TVD, got False")
    if ops[kind] == "jsd":
        _beta(beta)
    elif beta != 0.0:
        raise ValueError(f"beta: expected 0 (beta is JSD's), got {beta}")
    for name, facts in (tokens or {}).items():
        r.op_vector(name, *facts, n_rows)
    return DivergenceOptions(ops[kind], log_target, beta)


def logits_op(input: tuple, target: tuple, dloss: tuple, kind, log_target, beta, scale) -> DivergenceOptions:
    """divergence_logits_ (the one pass over logits of fused_linear_jsd's chunks): input, target,
    kind, log_target, beta as op()'s and dloss its per-row float32 vector; log_target True (the
    log_softmax of logits are log-probabilities); scale (1 / temperature) a finite number > 0 that
    float32 holds."""
    options = op(input, target, kind, log_target, beta, {"dloss": dloss})
    if not log_target:
        raise ValueError("log_target: expected True (the log_softmax of target's logits are log-probabilities), got False")
    r.number("scale", scale, low=0, low_open=True)
    r.float32("scale", scale, positive=True)
    return options


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

X = Array((2, 4))
EXAMPLES = {
    "kl_div": {"input": X, "target": X},
    "jsd": {"input": X, "target": X, "labels": Array((2,), "int32")},
    "tvd": {"input": X, "target": X, "labels": Array((2,), "int32")},
}
ALL, LABELED = tuple(EXAMPLES), ("jsd", "tvd")
REFUSALS = [
    Refusal(ALL, {"input": Array((2, 4), "int32")}, TypeError, "input: expected dtype float32, float16 or bfloat16, got int32"),
    Refusal(ALL, {"input": Array((1,) * 8 + (4,))}, ValueError, "input: expected at most 8 dimensions, got 9"),
    Refusal(
        ALL,
        {"input": Array(()), "target": Array(())},
        ValueError,
        "input: expected shape [..., V] with at least 1 dimension, got a 0-d array",
    ),
    Refusal(
        ALL,
        {"input": Array((2, 0)), "target": Array((2, 0))},
        ValueError,
        "input: the number of classes (last dimension) must be > 0, got shape (2, 0)",
    ),
    Refusal(
        ALL, {"target": Array((2, 4), "bfloat16")}, TypeError, "target: expected dtype float32 (the dtype of input), got bfloat16"
    ),
    Refusal(ALL, {"target": Array((2, 4), "int32")}, TypeError, "target: expected dtype float32, float16 or bfloat16, got int32"),
    Refusal(
        ALL,
        {"target": Array((2, 5))},
        ValueError,
        "target: expected shape (2, 4) (the shape of input), got (2, 5)",
        raw="target: expected 2 rows of 4 elements, got 2 rows of 5",
    ),
    Refusal(("kl_div",), {"log_target": 1}, TypeError, "log_target: expected a bool, got int"),
    Refusal(("kl_div",), {"reduction": "avg"}, ValueError, "reduction: expected one of 'none', 'batchmean', 'sum', 'mean', got"),
    Refusal(("kl_div",), {"reduction": None}, TypeError, "reduction: expected one of 'none', 'batchmean', 'sum', 'mean', got"),
    Refusal(("jsd",), {"beta": "0.5"}, TypeError, "beta: expected a Python float, got str"),
    Refusal(("jsd",), {"beta": 1.5}, ValueError, "beta: expected a number in [0, 1], got 1.5"),
    Refusal(("jsd",), {"beta": float("nan")}, ValueError, "beta: expected a number in [0, 1], got nan"),
    Refusal(LABELED, {"labels": Array((2,))}, TypeError, "labels: expected dtype int32 or int64 (class ids), got float32"),
    Refusal(
        LABELED,
        {"labels": Array((3,), "int32")},
        ValueError,
        "labels: expected shape (2,) (the shape of input without its last dimension), got (3,)",
    ),
    Refusal(LABELED, {"ignore_index": -100.0}, TypeError, "ignore_index: expected a Python int, got float"),
    Refusal(LABELED, {"ignore_index": -(2**63) - 1}, ValueError, "ignore_index: expected an int64, got"),
]


def _op(**args) -> dict:
    return {"input": X, "target": X, "kind": 1, "log_target": True, "beta": 0.5, **args}


OP_REFUSALS = [
    Refusal(("divergence_fwd",), _op(kind=3), ValueError, "kind: expected 0 (KL), 1 (JSD) or 2 (TVD), got 3"),
    Refusal(
        ("divergence_fwd",),
        _op(kind=2, log_target=False, beta=0.0),
        ValueError,
        "log_target: expected True (target as log-probabilities) for JSD and TVD, got False",
    ),
    Refusal(("divergence_fwd",), _op(beta=2.0), ValueError, "beta: expected a number in [0, 1], got 2.0"),
    Refusal(("divergence_fwd",), _op(kind=0, beta=0.5), ValueError, "beta: expected 0 (beta is JSD's), got 0.5"),
    Refusal(
        ("divergence_bwd",),
        {"dloss": Array((3,)), **_op(wrt_target=False)},
        ValueError,
        "dloss: expected 2 elements, got shape [3]",
    ),
    Refusal(
        ("divergence_logits_",),
        {"dloss": Array((3,)), **_op(scale=1.0)},
        ValueError,
        "dloss: expected 2 elements, got shape [3]",
    ),
    Refusal(
        ("divergence_logits_",),
        {"dloss": Array((2,)), **_op(kind=0, log_target=False, beta=0.0, scale=1.0)},
        ValueError,
        "log_target: expected True (the log_softmax of target's logits are log-probabilities), got False",
    ),
    Refusal(
        ("divergence_logits_",),
        {"dloss": Array((2,)), **_op(scale=0.0)},
        ValueError,
        "scale: expected a finite number > 0, got 0.0",
    ),
    Refusal(
        ("divergence_logits_",),
        {"dloss": Array((2,)), **_op(scale=float("nan"))},
        ValueError,
        "scale: expected a finite number > 0, got nan",
    ),
    Refusal(
        ("divergence_logits_",),
        {"dloss": Array((2,)), **_op(scale=1e39)},
        ValueError,
        "scale: expected a magnitude float32 can hold",
    ),
    Refusal(
        ("divergence_logits_",),
        {"dloss": Array((2,)), **_op(scale=1e-50)},
        ValueError,
        "scale: expected a value > 0 in float32",
    ),
]
