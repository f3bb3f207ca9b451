"""What each fuselet.torch op saves for the backward (saved_tensors_hooks, counted by
benchmarks/bench_memory.py): the exact saved set per op, no more new bytes than the unfused
expression it replaces, and the table of docs/ops.md equal to what the measurement gives."""

from __future__ import annotations

import pytest

from tests.conftest import import_layer
from tests.memory import bench_memory, by_op, described, docs_rows

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
bm = bench_memory()

ROWS, H = bm.ROWS, bm.H
N, HID, V = bm.FLCE
S, D = bm.ROPE[1], bm.ROPE[3]
F32 = "float32"


@pytest.fixture(scope="module")
def cases():
    return bm.measure("torch")


def expected(dt: str) -> dict:
    """op -> what fuselet saves, (owner, shape, dtype) in the order saved; "output": one of its outputs."""
    return {
        "rms_norm": [("x", (ROWS, H), dt), ("weight", (H,), dt), ("new", (ROWS,), F32)],  # x, weight, rstd
        "layer_norm": [
            ("x", (ROWS, H), dt),
            ("weight", (H,), dt),
            ("bias", (H,), dt),
            ("new", (ROWS,), F32),
            ("new", (ROWS,), F32),
        ],  # + mean, rstd
        # residual_out (its own second output, not x or residual), weight, rstd
        "add_rms_norm": [("output", (ROWS, H), dt), ("weight", (H,), dt), ("new", (ROWS,), F32)],
        # x, z and weight (the callers' tensors) and a float32 rstd per group: y is recomputed
        "gated_rms_norm": [("x", (ROWS, H), dt), ("z", (ROWS, H), dt), ("weight", (H,), dt), ("new", (ROWS, 1), F32)],
        "swiglu": [("x", (ROWS, 2 * H), dt)],  # x only: the backward recomputes silu(gate)
        "geglu tanh": [("x", (ROWS, 2 * H), dt)],
        "clamped_swiglu": [("x", (ROWS, 2 * H), dt)],  # x only: the clamps are recomputed
        "softmax": [("output", bm.SOFTMAX, dt)],  # y only
        "softmax causal": [("output", bm.SOFTMAX, dt)],  # the mask is recomputed, not kept
        "rope": [("cos", (S, D), dt), ("sin", (S, D), dt)],  # the tables only, nothing of x
        # logits, target, a float32 lse per token, and the mean's count of tokens (a scalar)
        "cross_entropy": [
            ("logits", (bm.TOKENS, bm.VOCAB), dt),
            ("target", (bm.TOKENS,), "int64"),
            ("new", (bm.TOKENS,), F32),
            ("new", (), "int64"),
        ],
        # the gradients, computed in the forward: dhidden, dweight and an empty stand-in for dbias
        # input and target (the callers' tensors): the backward recomputes each element's terms
        **{op: [("input", (bm.TOKENS, bm.VOCAB), dt), ("target", (bm.TOKENS, bm.VOCAB), dt)] for op in ("kl_div", "jsd", "tvd")},
        "fused_linear_cross_entropy mean": [("new", (N, HID), dt), ("new", (V, HID), dt), ("new", (0,), dt)],
        # the inputs and a float32 lse per token; the backward recomputes the logits chunk by chunk
        "fused_linear_cross_entropy none": [
            ("hidden", (N, HID), dt),
            ("weight", (V, HID), dt),
            ("target", (N,), "int64"),
            ("new", (N,), F32),
        ],
        # the inputs and a float32 lse and entropy per token; the logits are recomputed
        "fused_linear_logprobs entropy": [
            ("hidden", (N, HID), dt),
            ("weight", (V, HID), dt),
            ("target", (N,), "int64"),
            ("new", (N,), F32),
            ("output", (N,), F32),  # the entropy the caller gets
        ],
    }


@pytest.mark.parametrize("dtype", bm.DTYPES)
def test_saved_set_per_op(cases, dtype):
    got = {op: described(c.fuselet) for (op, dt), c in by_op(cases).items() if dt == dtype}
    assert got == expected(dtype)


@pytest.mark.parametrize("dtype", bm.DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_linear_cross_entropy_saves_no_logits(cases, dtype, reduction):
    case = by_op(cases)[(f"fused_linear_cross_entropy {reduction}", dtype)]
    assert not [s for s in case.fuselet if s.shape == (N, V)]
    assert [s for s in case.unfused if s.shape == (N, V)], "the unfused expression keeps its [tokens, V] log-probs"


@pytest.mark.parametrize("dtype", bm.DTYPES)
def test_new_bytes_at_most_the_unfused(cases, dtype):
    for (op, dt), case in by_op(cases).items():
        if dt != dtype:
            continue
        ours, theirs = bm.split(case.fuselet)[1], bm.split(case.unfused)[1]
        if op == "layer_norm" and dtype == "bfloat16":
            # torch's CPU layer_norm keeps bfloat16 mean / rstd, fuselet float32 ones: 2 x ROWS x (4 vs 2) bytes
            assert (ours, theirs) == (2 * ROWS * 4, 2 * ROWS * 2)
        else:
            assert ours <= theirs, f"{op} {dtype}: fuselet keeps {ours} new bytes, the unfused expression {theirs}"


def test_unfused_figures(cases):
    """The peers' saves docs/ops.md explains: torch's CPU rms_norm keeps a normalized copy of x (and, in
    bfloat16, a float32 copy of x instead of x), the GLUs the activation of the gate, F.cross_entropy its
    [tokens, V] log-probs (not the logits)."""
    got = by_op(cases)
    assert described(got[("rms_norm", F32)].unfused) == [
        ("x", (ROWS, H), F32),
        ("new", (ROWS, 1), F32),
        ("weight", (H,), F32),
        ("new", (ROWS, H), F32),
    ]
    assert described(got[("rms_norm", "bfloat16")].unfused) == [
        ("new", (ROWS, H), F32),
        ("new", (ROWS, 1), F32),
        ("weight", (H,), "bfloat16"),
        ("new", (ROWS, H), F32),
    ]
    assert ("new", (ROWS, H), F32) in described(got[("swiglu", F32)].unfused)
    assert described(got[("cross_entropy", F32)].unfused) == [
        ("new", (bm.TOKENS, bm.VOCAB), F32),
        ("target", (bm.TOKENS,), "int64"),
        ("new", (), F32),
    ]


def test_docs_table_matches(cases):
    assert docs_rows("torch") == [bm.cells(c) for c in cases]
