"""Bad input to the gated linear units (swiglu, geglu, clamped_swiglu): both layers' entry points
and the registered torch ops."""

from __future__ import annotations

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


@pytest.mark.parametrize("op", ["swiglu", "geglu", "clamped_swiglu"])
def test_glu_odd_last_dim(api, op):
    with raises(ValueError, "x: expected an even last dimension > 0 (2F: the gate and up halves), got shape (2, 5)"):
        getattr(api.module, op)(api.array((2, 5)))


@pytest.mark.parametrize("op", ["swiglu", "geglu", "clamped_swiglu"])
def test_glu_bad_x(api, op):
    with raises(ValueError, "x: expected an even last dimension > 0 (2F: the gate and up halves), got shape (2, 0)"):
        getattr(api.module, op)(api.array((2, 0)))
    with raises(ValueError, "x: expected shape [..., 2F] with at least 1 dimension, got a 0-d array"):
        getattr(api.module, op)(api.array(()))
    with raises(TypeError, "x: expected dtype float32, float16 or bfloat16, got float64"):
        getattr(api.module, op)(api.array((2, 4), "float64"))
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"x: expected a {kind}, got list"):
        getattr(api.module, op)([1.0, 2.0])


def test_geglu_approximate(api):
    with raises(ValueError, "approximate: expected 'none' or 'tanh', got 'fast'"):
        api.module.geglu(api.array((2, 4)), approximate="fast")
    with raises(TypeError, "approximate: expected 'none' or 'tanh', got bool"):
        api.module.geglu(api.array((2, 4)), approximate=True)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"limit": 0.0}, ValueError, "limit: expected a finite number > 0, got 0.0"),
        ({"limit": -7.0}, ValueError, "limit: expected a finite number > 0, got -7.0"),
        ({"limit": float("inf")}, ValueError, "limit: expected a finite number > 0, got inf"),
        ({"alpha": float("nan")}, ValueError, "alpha: expected a finite number, got nan"),
        ({"alpha": "1.702"}, TypeError, "alpha: expected a Python float, got str"),
        ({"limit": True}, TypeError, "limit: expected a Python float, got bool"),
        ({"interleaved": 1}, TypeError, "interleaved: expected a bool, got int"),
    ],
)
def test_clamped_swiglu_options(api, options, error, message):
    with raises(error, message):
        api.module.clamped_swiglu(api.array((2, 4)), **options)


# --- torch only -----------------------------------------------------------------------------


def test_torch_op_direct_glu(torch):
    with raises(ValueError, "x: expected an even last dimension > 0 (2F: the gate and up halves), got shape [2, 5]"):
        torch.ops.fuselet.swiglu_fwd(torch.ones(2, 5))
    with raises(ValueError, "approximate: expected 'none' or 'tanh', got 'fast'"):
        torch.ops.fuselet.geglu_fwd(torch.ones(2, 4), "fast")
    with raises(ValueError, "dy: expected 2 rows of 2 elements, got 2 rows of 4"):
        torch.ops.fuselet.swiglu_bwd(torch.ones(2, 4), torch.ones(2, 4))
    with raises(ValueError, "limit: expected a finite number > 0, got 0.0"):
        torch.ops.fuselet.clamped_swiglu_fwd(torch.ones(2, 4), 1.702, 0.0, True)
    with raises(ValueError, "alpha: expected a finite number, got inf"):
        torch.ops.fuselet.clamped_swiglu_bwd(torch.ones(2, 2), torch.ones(2, 4), float("inf"), 7.0, False)
