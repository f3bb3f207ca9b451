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
