"""fused_linear_logprobs: hidden [..., H], weight [V, H], bias [V] or None and target
hidden.shape[:-1] as fused_linear_cross_entropy takes them (spec/fused_linear_cross_entropy.py);
temperature a finite number > 0 whose inverse float32 holds, logit_scale a finite number float32
holds (the logits are `softcap(logit_scale * (hidden @ weight.T + bias)) / temperature`); softcap
and ignore_index as cross_entropy's; outputs a tuple of OUTPUTS' names; chunk_size None or an
int >= 1."""

from __future__ import annotations

from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec import cross_entropy
from fuselet.spec import fused_linear_cross_entropy as flce
from fuselet.spec._rules import Array, Refusal

# The per-token outputs, in the order the ops return them (TRL's ChunkedLogProbFunction's).
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# The raw ops' `outputs` flags: the bit of each output beyond log_probs.
FLAGS = {name: 1 << i for i, name in enumerate(OUTPUTS[1:])}


@dataclass(frozen=True)
class FusedLinearLogProbsOptions:
    temperature: float = 1.0
    logit_scale: float = 1.0
    softcap: float | None = None
    ignore_index: int = -100
    outputs: frozenset = frozenset({"log_probs"})
    chunk_size: int | None = None

    @property
    def scale(self) -> float:
        """What hidden and bias are multiplied by before the matmul: logit_scale / temperature."""
        return self.logit_scale / self.temperature

    def op_args(self) -> tuple:
        """The raw ops' scalars (ignore_index, softcap, outputs, chunk_size): the softcap of the
        scaled logits (c / temperature; 0.0 none), the outputs' flags, chunk_size None as 0."""
        softcap = 0.0 if self.softcap is None else self.softcap / self.temperature
        return self.ignore_index, softcap, flags(self.outputs), self.chunk_size or 0


def flags(outputs) -> int:
    return sum(FLAGS.get(name, 0) for name in outputs)


def names(flag_bits: int) -> frozenset:
    """The outputs of a raw op's flags (log_probs always)."""
    return frozenset({"log_probs", *(name for name, bit in FLAGS.items() if flag_bits & bit)})


def _outputs(outputs) -> frozenset:
    words = "a tuple of names among " + ", ".join(map(repr, OUTPUTS))
    if isinstance(outputs, str) or not isinstance(outputs, (tuple, list, set, frozenset)):
        raise TypeError(f"outputs: expected {words}, got {type(outputs).__name__}")
    for name in outputs:
        if name not in OUTPUTS:
            raise ValueError(f"outputs: expected {words}, got {name!r}")
    return frozenset({"log_probs", *outputs})


def fused_linear_logprobs(
    hidden: tuple,
    weight: tuple,
    bias: tuple | None,
    target: tuple,
    temperature=1.0,
    logit_scale=1.0,
    softcap=None,
    ignore_index=-100,
    outputs=("log_probs",),
    chunk_size=None,
) -> FusedLinearLogProbsOptions:
    """The arrays (shape, dtype), bias None or one."""
    flce.fused_linear_cross_entropy(hidden, weight, bias, target, chunk_size, ignore_index=ignore_index, softcap=softcap)
    r.number("temperature", temperature, low=0.0, low_open=True, noun="number")
    r.float32("temperature", temperature)
    r.inverse_float32("temperature", temperature)
    r.number("logit_scale", logit_scale)
    r.float32("logit_scale", logit_scale)
    return FusedLinearLogProbsOptions(temperature, logit_scale, softcap, ignore_index, _outputs(outputs), chunk_size)


# --- the raw ops (torch.ops.fuselet.fused_linear_logprobs*: their impls and fake impls) ----------


def op(
    hidden: tuple, weight: tuple, bias: tuple | None, target: tuple, op_args: tuple, tokens=None
) -> FusedLinearLogProbsOptions:
    """hidden [N, H], weight, bias, target [N]; op_args (ignore_index, softcap: 0.0 none,
    outputs: the flags, chunk_size: 0 the default) as FusedLinearLogProbsOptions.op_args() gives
    them (the softcap already divided by the temperature); per-token float32 `tokens` [N] (the
    backward's dlogp, dentropy, lse, entropy)."""
    ignore_index, softcap, flag_bits, chunk_size = op_args
    flce.op(hidden, weight, bias, target, (ignore_index, 0.0, 0.0, softcap), chunk_size, tokens)
    if isinstance(flag_bits, bool) or not isinstance(flag_bits, int) or not 0 <= flag_bits < 1 << len(FLAGS):
        raise ValueError(f"outputs: expected flags in [0, {(1 << len(FLAGS)) - 1}], got {flag_bits}")
    return FusedLinearLogProbsOptions(1.0, 1.0, softcap or None, ignore_index, names(flag_bits), chunk_size or None)


# --- the table of bad values (tests/test_spec.py; the arrays': spec/fused_linear_cross_entropy.py) --

EXAMPLES = {
    "fused_linear_logprobs": {
        "hidden": flce.HIDDEN,
        "weight": flce.WEIGHT,
        "target": flce.TARGET,
        "bias": Array((5,)),
        "outputs": OUTPUTS,
    }
}
L = tuple(EXAMPLES)
REFUSALS = [
    Refusal(L, {"hidden": Array((2, 4), "int32")}, TypeError, "hidden: expected dtype float32, float16 or bfloat16, got int32"),
    Refusal(L, {"weight": Array((5, 3))}, ValueError, "weight: expected shape [V, 4] (V > 0; H: the last dimension of hidden"),
    Refusal(L, {"target": Array((2,))}, TypeError, "target: expected dtype int32 or int64 (class ids), got float32"),
    Refusal(L, {"temperature": "1"}, TypeError, "temperature: expected a Python float, got str"),
    Refusal(L, {"temperature": 0.0}, ValueError, "temperature: expected a finite number > 0.0, got 0.0"),
    Refusal(L, {"temperature": 1e39}, ValueError, "temperature: expected a magnitude float32 can hold"),
    Refusal(L, {"temperature": 1e-40}, ValueError, "temperature: expected a value whose inverse float32 can hold"),
    Refusal(L, {"logit_scale": None}, TypeError, "logit_scale: expected a Python float, got NoneType"),
    Refusal(L, {"logit_scale": float("nan")}, ValueError, "logit_scale: expected a finite number, got nan"),
    Refusal(L, {"logit_scale": -1e39}, ValueError, "logit_scale: expected a magnitude float32 can hold"),
    Refusal(L, {"outputs": "entropy"}, TypeError, "outputs: expected a tuple of names among 'log_probs', 'entropy'"),
    Refusal(L, {"outputs": ("entropy", "logits")}, ValueError, "outputs: expected a tuple of names among"),
    Refusal(L, {"chunk_size": 0}, ValueError, "chunk_size: expected None or an int >= 1 (tokens per chunk), got 0", raw=False),
]
TOKENS, OP_ARGS = Array((2,)), {"ignore_index": -100, "softcap": 0.0, "outputs": 0, "chunk_size": 0}
OP_REFUSALS = [
    Refusal(
        ("fused_linear_logprobs_fwd",),
        {"hidden": flce.HIDDEN, "weight": flce.WEIGHT, "bias": None, "target": flce.TARGET, **OP_ARGS, "outputs": 16},
        ValueError,
        "outputs: expected flags in [0, 15], got 16",
    ),
    Refusal(
        ("fused_linear_logprobs_bwd",),
        {
            "dlogp": TOKENS,
            "dentropy": None,
            "hidden": flce.HIDDEN,
            "weight": flce.WEIGHT,
            "bias": None,
            "target": flce.TARGET,
            "lse": Array((3,)),
            "entropy": None,
            **OP_ARGS,
        },
        ValueError,
        "lse: expected shape [2] (the rows of hidden), got [3]",
    ),
]
# cross_entropy's rules of softcap and ignore_index are its own table's (spec/cross_entropy.py)
assert cross_entropy.REFUSALS
