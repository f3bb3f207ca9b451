"""What each fuselet.jax op keeps for the backward (the residuals of jax.vjp, counted by
benchmarks/bench_memory.py): the exact residuals per op, no more new bytes than the jitted
jax.numpy expression it replaces, and the table of docs/ops.md equal to what the measurement gives."""

from __future__ import annotations

import pytest

from tests.conftest import import_layer
from tests.memory import bench_memory, by_op, described, docs_rows

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
fj = import_layer("jax")
bm = bench_memory()

ROWS, H = bm.ROWS, bm.H
N, HID, V = bm.FLCE
S, D = bm.ROPE[1], bm.ROPE[3]
F32 = "float32"


@pytest.fixture(scope="module")
def cases():
    return bm.measure("jax")


def expected(dt: str) -> dict:
    """op -> fuselet's residuals, (owner, shape, dtype) in vjp_fn's leaf order; "output": one of its outputs."""
    return {
        "rms_norm": [("x", (ROWS, H), dt), ("weight", (H,), dt), ("new", (ROWS,), F32)],  # x, weight, rstd
        "layer_norm": [
            ("x", (ROWS, H), dt),
            ("weight", (H,), dt),
            ("bias", (H,), dt),
            ("new", (ROWS,), F32),
            ("new", (ROWS,), F32),
        ],  # + mean, rstd
        # weight, residual_out (its own second output), rstd
        "add_rms_norm": [("weight", (H,), dt), ("output", (ROWS, H), dt), ("new", (ROWS,), F32)],
        # x, z and weight (the callers' tensors) and a float32 rstd per group: y is recomputed
        "gated_rms_norm": [("x", (ROWS, H), dt), ("z", (ROWS, H), dt), ("weight", (H,), dt), ("new", (ROWS, 1), F32)],
        "swiglu": [("x", (ROWS, 2 * H), dt)],
        "geglu tanh": [("x", (ROWS, 2 * H), dt)],
        "clamped_swiglu": [("x", (ROWS, 2 * H), dt)],  # x only: the clamps are recomputed
        "softmax": [("output", bm.SOFTMAX, dt)],
        "softmax causal": [("output", bm.SOFTMAX, dt)],
        "rope": [("cos", (S, D), dt), ("sin", (S, D), dt)],
        # logits, target, lse; then what the mean's jnp.stack([loss, valid]) adds: the instantiated
        # zero tangent of the valid-token mask (a float32 per token) and four scalars of the count
        "cross_entropy": [
            ("logits", (bm.TOKENS, bm.VOCAB), dt),
            ("target", (bm.TOKENS,), "int32"),
            ("new", (bm.TOKENS,), F32),
            ("new", (bm.TOKENS,), F32),
            ("new", (), F32),
            ("new", (), F32),
            ("new", (1,), F32),
            ("new", (), F32),
        ],
        # input and target (the callers' arrays): the backward recomputes each element's terms
        **{op: [("input", (bm.TOKENS, bm.VOCAB), dt), ("target", (bm.TOKENS, bm.VOCAB), dt)] for op in ("kl_div", "jsd", "tvd")},
        "fused_linear_cross_entropy mean": [("new", (N, HID), dt), ("new", (V, HID), dt)],  # dhidden, dweight
        "fused_linear_cross_entropy none": [
            ("hidden", (N, HID), dt),
            ("weight", (V, HID), dt),
            ("target", (N,), "int32"),
            ("new", (N,), F32),
        ],
        "fused_linear_logprobs entropy": [
            ("hidden", (N, HID), dt),
            ("weight", (V, HID), dt),
            ("target", (N,), "int32"),
            ("new", (N,), F32),
            ("output", (N,), F32),  # the entropy the caller gets
        ],
    }


@pytest.mark.parametrize("dtype", bm.DTYPES)
def test_residuals_per_op(cases, dtype):
    got = {op: described(c.fuselet) for (op, dt), c in by_op(cases).items() if dt == dtype}
    assert got == expected(dtype)


@pytest.mark.parametrize("dtype", bm.DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_linear_cross_entropy_keeps_no_logits(cases, dtype, reduction):
    case = by_op(cases)[(f"fused_linear_cross_entropy {reduction}", dtype)]
    assert not [s for s in case.fuselet if s.shape == (N, V)]
    assert [s for s in case.unfused if s.shape == (N, V)], "the unfused expression keeps its [tokens, V] log-probs"


@pytest.mark.parametrize("dtype", bm.DTYPES)
def test_new_bytes_at_most_the_unfused(cases, dtype):
    for (op, dt), case in by_op(cases).items():
        if dt == dtype:
            ours, theirs = bm.split(case.fuselet)[1], bm.split(case.unfused)[1]
            assert ours <= theirs, f"{op} {dtype}: fuselet keeps {ours} new bytes, the unfused expression {theirs}"


def test_unfused_figures(cases):
    """The peers' residuals docs/ops.md explains: XLA keeps copies of the GLU halves and the gate's
    activation, and a transposed copy of the lm_head weight next to the [tokens, V] log-probs."""
    got = by_op(cases)
    assert described(got[("swiglu", F32)].unfused) == [("new", (ROWS, H), F32)] * 5
    flce = described(got[("fused_linear_cross_entropy mean", F32)].unfused)
    assert ("hidden", (N, HID), F32) in flce and ("new", (HID, V), F32) in flce and ("new", (N, V), F32) in flce


def test_docs_table_matches(cases):
    assert docs_rows("jax") == [bm.cells(c) for c in cases]
