"""Bad input to softmax: both layers' entry points and the registered torch ops."""

from __future__ import annotations

import math

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


def test_scale_beyond_float32(api):
    with raises(ValueError, "scale: expected"):
        api.module.softmax(api.array((2, 4)), 1e39)


def test_softmax_bad_x(api):
    with raises(ValueError, "x: the last dimension (keys) must be > 0, got shape (2, 0)"):
        api.module.softmax(api.array((2, 0)))
    with raises(ValueError, "x: expected shape [..., K] with at least 1 dimension, got a 0-d array"):
        api.module.softmax(api.array(()))
    with raises(TypeError, "x: expected dtype float32, float16 or bfloat16, got int32"):
        api.module.softmax(api.array((2, 4), "int32"))
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"x: expected a {kind}, got list"):
        api.module.softmax([1.0, 2.0])


@pytest.mark.parametrize("scale", [math.nan, math.inf])
def test_softmax_scale_not_finite(api, scale):
    with raises(ValueError, f"scale: expected a finite number, got {scale}"):
        api.module.softmax(api.array((2, 4)), scale)


@pytest.mark.parametrize("scale", ["0.5", None, True], ids=["str", "None", "bool"])
def test_softmax_scale_not_a_number(api, scale):
    with raises(TypeError, f"scale: expected a Python float, got {type(scale).__name__}"):
        api.module.softmax(api.array((2, 4)), scale)


def test_softmax_causal(api):
    with raises(ValueError, "causal: needs x of shape [..., Q, K] with at least 2 dimensions, got shape (4,)"):
        api.module.softmax(api.array((4,)), causal=True)
    with raises(TypeError, "causal: expected a bool, got int"):
        api.module.softmax(api.array((2, 4)), causal=1)


# --- torch only -----------------------------------------------------------------------------


def test_torch_op_direct_softmax(torch):
    with raises(
        ValueError, "flags: FUSELET_SOFTMAX_CAUSAL needs x of shape [..., Q, K] with at least 2 dimensions, got shape [4]"
    ):
        torch.ops.fuselet.softmax_fwd(torch.ones(4), 1.0, True)
    with raises(ValueError, "scale: expected a finite number, got nan"):
        torch.ops.fuselet.softmax_fwd(torch.ones(2, 4), float("nan"))
    with raises(ValueError, "dy: expected 2 rows of 4 elements, got 2 rows of 3"):
        torch.ops.fuselet.softmax_bwd(torch.ones(2, 3), torch.ones(2, 4))
