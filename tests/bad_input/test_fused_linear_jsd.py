"""Bad input to fused_linear_jsd, in both layers."""

from __future__ import annotations

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


def test_fused_linear_jsd_rules(api):
    hs, ws, ht, wt = api.array((2, 3, 4)), api.array((5, 4)), api.array((2, 3, 6)), api.array((5, 6))
    loss = api.module.fused_linear_jsd
    with raises(ValueError, "student_weight: expected shape [V, 4] (student_hidden's H), got (5, 3)"):
        loss(hs, api.array((5, 3)), ht, wt)
    with raises(ValueError, "teacher_hidden: expected shape [2, 3, H_teacher] (student_hidden's tokens), got (2, 2, 6)"):
        loss(hs, ws, api.array((2, 2, 6)), wt)
    with raises(ValueError, "teacher_weight: expected shape [5, 6] (student_weight's V, teacher_hidden's H), got (4, 6)"):
        loss(hs, ws, ht, api.array((4, 6)))
    with raises(TypeError, "student_weight: expected dtype float32 (the dtype of student_hidden), got bfloat16"):
        loss(hs, api.array((5, 4), "bfloat16"), ht, wt)
    with raises(TypeError, "teacher_hidden: expected dtype float32, float16 or bfloat16, got int32"):
        loss(hs, ws, api.array((2, 3, 6), "int32"), wt)
    with raises(ValueError, "labels: expected shape (2, 3) (the shape of input without its last dimension), got (2,)"):
        loss(hs, ws, ht, wt, api.array((2,), "int32"))
    with raises(ValueError, "beta: expected a number in [0, 1], got 2.0"):
        loss(hs, ws, ht, wt, beta=2.0)
    with raises(ValueError, "temperature: expected a number > 0.0, got 0.0"):
        loss(hs, ws, ht, wt, temperature=0.0)
    with raises(ValueError, "chunk_size: expected None or an int >= 1, got 0"):
        loss(hs, ws, ht, wt, chunk_size=0)
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"teacher_weight: expected a {kind}, got list"):
        loss(hs, ws, ht, [1.0])


def test_fused_linear_jsd_per_token_rules(api):
    hs, ws, ht, wt = api.array((2, 3, 4)), api.array((5, 4)), api.array((2, 3, 6)), api.array((5, 6))
    per_token = api.module.fused_linear_jsd_per_token
    with raises(ValueError, "teacher_hidden: expected shape [2, 3, H_teacher] (student_hidden's tokens), got (2, 2, 6)"):
        per_token(hs, ws, api.array((2, 2, 6)), wt)
    with raises(ValueError, "teacher_weight: expected shape [5, 6] (student_weight's V, teacher_hidden's H), got (4, 6)"):
        per_token(hs, ws, ht, api.array((4, 6)))
    with raises(ValueError, "student_bias: expected shape (5,) (V, the rows of student_weight), got (4,)"):
        per_token(hs, ws, ht, wt, student_bias=api.array((4,)))
    with raises(TypeError, "teacher_bias: expected dtype float32 (the dtype of teacher_hidden), got bfloat16"):
        per_token(hs, ws, ht, wt, teacher_bias=api.array((5,), "bfloat16"))
    with raises(ValueError, "beta: expected a number in [0, 1], got -0.5"):
        per_token(hs, ws, ht, wt, beta=-0.5)
    with raises(ValueError, "temperature: expected a number > 0.0, got -1.0"):
        per_token(hs, ws, ht, wt, temperature=-1.0)
    with raises(ValueError, "student_logit_scale: expected a finite number, got inf"):
        per_token(hs, ws, ht, wt, student_logit_scale=float("inf"))
    with raises(ValueError, "teacher_softcap: expected None or a finite number > 0, got -3.0"):
        per_token(hs, ws, ht, wt, teacher_softcap=-3.0)
    with raises(TypeError, "with_entropy: expected a bool, got str"):
        per_token(hs, ws, ht, wt, with_entropy="yes")
    with raises(ValueError, "chunk_size: expected None or an int >= 1, got -2"):
        per_token(hs, ws, ht, wt, chunk_size=-2)
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"student_bias: expected a {kind} or None, got list"):
        per_token(hs, ws, ht, wt, student_bias=[1.0])
