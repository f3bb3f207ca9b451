"""fused_linear_jsd: student_hidden [..., Hs] and student_weight [V, Hs] of one float dtype,
teacher_hidden [..., Ht] (the student's leading dims) and teacher_weight [V, Ht] of one float
dtype, H > 0; labels and ignore_index as jsd's over logits [..., V] (spec/divergence.py), and its
beta; temperature a finite number > 0 whose inverse float32 holds (the logits are divided by it);
chunk_size None or an int >= 1."""

from __future__ import annotations

from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec import divergence
from fuselet.spec._rules import Array, Refusal
from fuselet.spec.divergence import DivergenceOptions


@dataclass(frozen=True)
class FusedLinearJSDOptions:
    beta: float = 0.5
    temperature: float = 1.0
    ignore_index: int = -100
    chunk_size: int | None = None

    @property
    def divergence(self) -> DivergenceOptions:
        """jsd's options, whose op_args() are the divergence kernels' scalar arguments."""
        return DivergenceOptions("jsd", True, self.beta, ignore_index=self.ignore_index)


def fused_linear_jsd(
    student_hidden: tuple,
    student_weight: tuple,
    teacher_hidden: tuple,
    teacher_weight: tuple,
    labels: tuple | None = None,
    beta=0.5,
    temperature=1.0,
    ignore_index=-100,
    chunk_size=None,
) -> FusedLinearJSDOptions:
    """Each array as (shape, dtype); labels None or one."""
    (hs, hs_dtype), (ws, _), (ht, ht_dtype), (wt, _) = student_hidden, student_weight, teacher_hidden, teacher_weight
    for name, (shape, dtype), like in (
        ("student_hidden", student_hidden, None),
        ("student_weight", student_weight, ("student_hidden", hs_dtype)),
        ("teacher_hidden", teacher_hidden, None),
        ("teacher_weight", teacher_weight, ("teacher_hidden", ht_dtype)),
    ):
        r.float_dtype(name, dtype, like)
        if len(shape) == 0 or shape[-1] == 0:
            raise ValueError(f"{name}: expected shape [..., H] with H > 0, got {tuple(shape)}")
    if len(ws) != 2 or ws[1] != hs[-1]:
        raise ValueError(f"student_weight: expected shape [V, {hs[-1]}] (student_hidden's H), got {tuple(ws)}")
    if tuple(ht[:-1]) != tuple(hs[:-1]):
        raise ValueError(
            f"teacher_hidden: expected shape [{', '.join(map(str, hs[:-1]))}, H_teacher] (student_hidden's tokens), "
            f"got {tuple(ht)}"
        )
    if len(wt) != 2 or tuple(wt) != (ws[0], ht[-1]):
        raise ValueError(
            f"teacher_weight: expected shape [{ws[0]}, {ht[-1]}] (student_weight's V, teacher_hidden's H), got {tuple(wt)}"
        )
    # labels, ignore_index and beta as jsd takes them over the logits [..., V]
    divergence.kept_rows(labels, (*hs[:-1], ws[0]), ignore_index)
    r.number("beta", beta, low=0, high=1, finite_only=False)
    r.number("temperature", temperature, noun="number")
    r.number("temperature", temperature, low=0.0, low_open=True, finite_only=False, noun="number")
    r.float32("temperature", temperature)
    r.inverse_float32("temperature", temperature)
    r.count("chunk_size", chunk_size)
    return FusedLinearJSDOptions(beta, temperature, ignore_index, chunk_size)


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

HS, WS, HT, WT = Array((2, 3, 4)), Array((5, 4)), Array((2, 3, 6)), Array((5, 6))
EXAMPLES = {
    "fused_linear_jsd": {
        "student_hidden": HS,
        "student_weight": WS,
        "teacher_hidden": HT,
        "teacher_weight": WT,
        "labels": Array((2, 3), "int32"),
    }
}
J = tuple(EXAMPLES)
REFUSALS = [
    Refusal(J, {"student_hidden": Array((2, 3, 4), "float64")}, TypeError, "student_hidden: expected dtype float32, float16 or"),
    Refusal(J, {"student_weight": Array((5, 4), "bfloat16")}, TypeError, "student_weight: expected dtype float32 (the dtype of"),
    Refusal(J, {"teacher_hidden": Array((2, 3, 6), "int32")}, TypeError, "teacher_hidden: expected dtype float32, float16 or"),
    Refusal(J, {"teacher_hidden": Array((2, 3, 0))}, ValueError, "teacher_hidden: expected shape [..., H] with H > 0, got"),
    Refusal(J, {"student_weight": Array((5, 3))}, ValueError, "student_weight: expected shape [V, 4] (student_hidden's H), got"),
    Refusal(J, {"teacher_hidden": Array((2, 2, 6))}, ValueError, "teacher_hidden: expected shape [2, 3, H_teacher]"),
    Refusal(J, {"teacher_weight": Array((4, 6))}, ValueError, "teacher_weight: expected shape [5, 6] (student_weight's V"),
    Refusal(J, {"labels": Array((2,), "int32")}, ValueError, "labels: expected shape (2, 3) (the shape of input without its"),
    Refusal(J, {"labels": Array((2, 3))}, TypeError, "labels: expected dtype int32 or int64 (class ids), got float32"),
    Refusal(J, {"ignore_index": None}, TypeError, "ignore_index: expected a Python int, got NoneType"),
    Refusal(J, {"beta": 2.0}, ValueError, "beta: expected a number in [0, 1], got 2.0"),
    Refusal(J, {"temperature": "1"}, TypeError, "temperature: expected a Python float, got str"),
    Refusal(J, {"temperature": float("inf")}, ValueError, "temperature: expected a finite number, got inf"),
    Refusal(J, {"temperature": 0.0}, ValueError, "temperature: expected a number > 0.0, got 0.0"),
    Refusal(J, {"temperature": 1e39}, ValueError, "temperature: expected a magnitude float32 can hold"),
    Refusal(J, {"temperature": 1e-40}, ValueError, "temperature: expected a value whose inverse float32 can hold"),
    Refusal(J, {"chunk_size": 0}, ValueError, "chunk_size: expected None or an int >= 1, got 0"),
    Refusal(J, {"chunk_size": "8"}, TypeError, "chunk_size: expected None or an int, got str"),
]


# --- the per-token form: fused_linear_jsd_per_token ----------------------------------------------
# (TRL's ChunkedDivergenceFunction's: both heads' biases, logit scales and soft-caps, each token's
# divergence and the student's entropy)


@dataclass(frozen=True)
class FusedLinearJSDPerTokenOptions:
    beta: float = 0.5
    temperature: float = 1.0
    student_logit_scale: float = 1.0
    teacher_logit_scale: float = 1.0
    student_softcap: float | None = None
    teacher_softcap: float | None = None
    with_entropy: bool = False
    chunk_size: int | None = None

    @property
    def divergence(self) -> DivergenceOptions:
        """jsd's options, whose op_args() are the divergence kernels' scalar arguments."""
        return DivergenceOptions("jsd", True, self.beta)

    def logits(self, model: str) -> tuple[float, float | None]:
        """(scale, cap) of the "student"'s or the "teacher"'s logits: z = cap * tanh(scale * y / cap)
        (cap None: z = scale * y), y = hidden @ weight.T + bias, is softcap(logit_scale * y) /
        temperature with scale = logit_scale / temperature and cap = softcap / temperature."""
        logit_scale, softcap = getattr(self, f"{model}_logit_scale"), getattr(self, f"{model}_softcap")
        t = self.temperature
        return logit_scale / t, None if softcap is None else softcap / t


def fused_linear_jsd_per_token(
    student_hidden: tuple,
    student_weight: tuple,
    teacher_hidden: tuple,
    teacher_weight: tuple,
    student_bias: tuple | None = None,
    teacher_bias: tuple | None = None,
    beta=0.5,
    temperature=1.0,
    student_logit_scale=1.0,
    teacher_logit_scale=1.0,
    student_softcap=None,
    teacher_softcap=None,
    with_entropy=False,
    chunk_size=None,
) -> FusedLinearJSDPerTokenOptions:
    """The arrays (shape, dtype) as fused_linear_jsd's (no labels), each bias None or [V] of its
    hidden's dtype; beta, temperature and chunk_size as fused_linear_jsd's; each logit_scale a
    finite number float32 holds, each softcap None or a finite number > 0 float32 holds (as
    fused_linear_logprobs' logit_scale and softcap); with_entropy a bool."""
    fused_linear_jsd(student_hidden, student_weight, teacher_hidden, teacher_weight, None, beta, temperature, -100, chunk_size)
    for model, bias in (("student", student_bias), ("teacher", teacher_bias)):
        if bias is not None:
            hidden, weight = f"{model}_hidden", f"{model}_weight"
            dtype = (student_hidden if model == "student" else teacher_hidden)[1]
            r.float_dtype(f"{model}_bias", bias[1], (hidden, dtype))
            r.same_shape(f"{model}_bias", bias[0], (student_weight[0][0],), f"V, the rows of {weight}")
    for name, scale in (("student_logit_scale", student_logit_scale), ("teacher_logit_scale", teacher_logit_scale)):
        r.number(name, scale)
        r.float32(name, scale)
    for name, softcap in (("student_softcap", student_softcap), ("teacher_softcap", teacher_softcap)):
        r.number(name, softcap, low=0, low_open=True, optional=True)
        if softcap is not None:
            r.float32(name, softcap, positive=True)
    r.a_bool("with_entropy", with_entropy)
    return FusedLinearJSDPerTokenOptions(
        beta,
        temperature,
        student_logit_scale,
        teacher_logit_scale,
        student_softcap,
        teacher_softcap,
        with_entropy,
        chunk_size,
    )


PER_TOKEN = ("fused_linear_jsd_per_token",)
EXAMPLES["fused_linear_jsd_per_token"] = {
    "student_hidden": HS,
    "student_weight": WS,
    "teacher_hidden": HT,
    "teacher_weight": WT,
    "student_bias": Array((5,)),
    "teacher_bias": Array((5,)),
}
# fused_linear_jsd's rules but those of labels, and the per-token form's own
REFUSALS += [refusal._replace(ops=PER_TOKEN) for refusal in REFUSALS if not {"labels", "ignore_index"} & set(refusal.args)]
REFUSALS += [
    Refusal(PER_TOKEN, {"student_bias": Array((5,), "float16")}, TypeError, "student_bias: expected dtype float32 (the dtype of"),
    Refusal(PER_TOKEN, {"teacher_bias": Array((4,))}, ValueError, "teacher_bias: expected shape (5,) (V, the rows of teacher_w"),
    Refusal(PER_TOKEN, {"student_logit_scale": None}, TypeError, "student_logit_scale: expected a Python float, got NoneType"),
    Refusal(
        PER_TOKEN, {"teacher_logit_scale": float("nan")}, ValueError, "teacher_logit_scale: expected a finite number, got nan"
    ),
    Refusal(PER_TOKEN, {"student_logit_scale": -1e39}, ValueError, "student_logit_scale: expected a magnitude float32 can hold"),
    Refusal(PER_TOKEN, {"teacher_softcap": "5"}, TypeError, "teacher_softcap: expected None or a Python float, got str"),
    Refusal(PER_TOKEN, {"student_softcap": 0.0}, ValueError, "student_softcap: expected None or a finite number > 0, got 0.0"),
    Refusal(PER_TOKEN, {"teacher_softcap": 1e-50}, ValueError, "teacher_softcap: expected a value > 0 in float32"),
    Refusal(PER_TOKEN, {"with_entropy": 1}, TypeError, "with_entropy: expected a bool, got int"),
]
