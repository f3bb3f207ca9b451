"""Bad input to the norms (rms_norm, layer_norm, add_rms_norm, gated_rms_norm): both layers'
entry points and the registered torch ops."""

from __future__ import annotations

import math

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_x_dtype(api, dtype):
    with raises(TypeError, f"x: expected dtype float32, float16 or bfloat16, got {dtype}"):
        api.rms_norm(api.array((2, 4), dtype), api.array((4,)))


def test_integer_weight(api):
    with raises(TypeError, "weight: expected dtype float32, float16 or bfloat16, got int32"):
        api.rms_norm(api.array((2, 4)), api.array((4,), "int32"))


def test_weight_dtype_differs_from_x(api):
    with raises(TypeError, "weight: expected dtype float32 (the dtype of x), got float16"):
        api.rms_norm(api.array((2, 4)), api.array((4,), "float16"))


def test_float16_weight_with_bfloat16_x(api):
    """Parameters are in x's dtype or float32, nothing else."""
    with raises(TypeError, "weight: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        api.rms_norm(api.array((2, 4), "bfloat16"), api.array((4,), "float16"))


def test_bias_dtype_differs_from_weight(api):
    with raises(TypeError, "bias: expected dtype bfloat16 (the dtype of weight), got float32"):
        api.layer_norm(api.array((2, 4), "bfloat16"), api.array((4,), "bfloat16"), api.array((4,)))


def test_bias_only_dtype(api):
    with raises(TypeError, "bias: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        api.layer_norm(api.array((2, 4), "bfloat16"), None, api.array((4,), "float16"))


def test_integer_bias(api):
    with raises(TypeError, "bias: expected dtype float32, float16 or bfloat16, got int32"):
        api.layer_norm(api.array((2, 4)), None, api.array((4,), "int32"))


def test_zero_centered_gamma_without_weight(api):
    with raises(ValueError, "zero_centered_gamma: scales by (1 + weight) and needs a weight, got weight=None"):
        api.layer_norm(api.array((2, 4)), None, None, zero_centered_gamma=True)


def test_zero_centered_gamma_not_bool(api):
    with raises(TypeError, "zero_centered_gamma: expected a bool, got str"):
        api.rms_norm(api.array((2, 4)), api.array((4,)), zero_centered_gamma="yes")


def test_bias_to_rms_norm(api):
    """RMSNorm has no bias: passing one is an error that names it, never silently ignored."""
    with pytest.raises(TypeError, match="bias"):
        api.module.rms_norm(api.array((2, 4)), api.array((4,)), bias=api.array((4,)))


def test_weight_hidden_size(api):
    with raises(ValueError, "weight: expected shape (4,) to match the last dimension of x (2, 4), got (5,)"):
        api.rms_norm(api.array((2, 4)), api.array((5,)))


def test_weight_not_1d(api):
    with raises(ValueError, "weight: expected shape (4,) to match the last dimension of x (2, 4), got (1, 4)"):
        api.rms_norm(api.array((2, 4)), api.array((1, 4)))


def test_bias_size(api):
    with raises(ValueError, "bias: expected shape (4,) to match the last dimension of x (2, 4), got (3,)"):
        api.layer_norm(api.array((2, 4)), api.array((4,)), api.array((3,)))


def test_zero_hidden_size(api):
    with raises(ValueError, "x: the hidden size (last dimension) must be > 0, got shape (2, 0)"):
        api.rms_norm(api.array((2, 0)), api.array((0,)))


@pytest.mark.parametrize("eps", [0.0, -1e-6, -math.inf])
def test_eps_not_positive(api, eps):
    with raises(ValueError, f"eps: expected a finite number > 0, got {eps}"):
        api.rms_norm(api.array((2, 4)), api.array((4,)), eps)


@pytest.mark.parametrize("eps", [math.nan, math.inf])
def test_eps_not_finite(api, eps):
    with raises(ValueError, f"eps: expected a finite number > 0, got {eps}"):
        api.layer_norm(api.array((2, 4)), api.array((4,)), api.array((4,)), eps)


@pytest.mark.parametrize("eps", ["1e-6", None, True], ids=["str", "None", "bool"])
def test_eps_not_a_number(api, eps):
    with raises(TypeError, f"eps: expected a Python float, got {type(eps).__name__}"):
        api.rms_norm(api.array((2, 4)), api.array((4,)), eps)


def test_scalar_x(api):
    with raises(ValueError, "x: expected shape [..., H] with at least 1 dimension, got a 0-d array"):
        api.rms_norm(api.array(()), api.array((1,)))


@pytest.mark.parametrize("argument", ["x", "weight", "bias"])
def test_not_an_array(api, argument):
    args = {"x": api.array((2, 4)), "weight": api.array((4,)), "bias": api.array((4,))}
    args[argument] = [1.0, 2.0, 3.0, 4.0]
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    kind += "" if argument == "x" else " or None"
    with raises(TypeError, f"{argument}: expected a {kind}, got list"):
        api.layer_norm(args["x"], args["weight"], args["bias"])


@pytest.mark.parametrize("eps", [1e-50, 1e39, 10**400], ids=["rounds-to-0", "rounds-to-inf", "int-beyond-float"])
def test_eps_beyond_float32(api, eps):
    """The kernels take eps in float32: one that becomes 0 or inf there is refused at the call."""
    with raises(ValueError, "eps: expected"):
        api.rms_norm(api.array((2, 4)), api.array((4,)), eps)


# --- residual add + RMSNorm ---------------------------------------------------------------


def test_add_rms_norm_residual_shape(api):
    with raises(ValueError, "residual: expected shape (2, 4) (the shape of x), got (2, 5)"):
        api.module.add_rms_norm(api.array((2, 4)), api.array((2, 5)), api.array((4,)))


def test_add_rms_norm_residual_dtype(api):
    with raises(TypeError, "residual: expected dtype float32 (the dtype of x), got bfloat16"):
        api.module.add_rms_norm(api.array((2, 4)), api.array((2, 4), "bfloat16"), api.array((4,)))


def test_add_rms_norm_residual_not_an_array(api):
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"residual: expected a {kind}, got list"):
        api.module.add_rms_norm(api.array((2, 4)), [1.0, 2.0], api.array((4,)))


def test_add_rms_norm_x_weight_eps(api):
    with raises(TypeError, "x: expected dtype float32, float16 or bfloat16, got int32"):
        api.module.add_rms_norm(api.array((2, 4), "int32"), api.array((2, 4), "int32"), api.array((4,)))
    with raises(ValueError, "weight: expected shape (4,) to match the last dimension of x (2, 4), got (3,)"):
        api.module.add_rms_norm(api.array((2, 4)), api.array((2, 4)), api.array((3,)))
    with raises(ValueError, "eps: expected a finite number > 0, got 0.0"):
        api.module.add_rms_norm(api.array((2, 4)), api.array((2, 4)), api.array((4,)), 0.0)


# --- torch only -----------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["weight", "bias"])
def test_torch_mixed_devices(torch, argument):
    from fuselet.torch import layer_norm

    args = {"x": torch.ones(2, 4), "weight": torch.ones(4), "bias": torch.zeros(4)}
    args[argument] = args[argument].to("meta")
    with raises(ValueError, f"{argument}: expected a tensor on cpu (the device of x), got meta"):
        layer_norm(args["x"], args["weight"], args["bias"])


def test_torch_op_direct_bad_hidden_size(torch):
    """The registered op checks its arguments too: a Python ValueError, not a crash."""
    with raises(ValueError, "weight: expected shape [4] to match the last dimension of x [2, 4], got [5]"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4), torch.ones(5), 1e-6)


def test_torch_op_direct_bad_bias_and_eps(torch):
    with raises(ValueError, "bias: expected shape [4] to match the last dimension of x [2, 4], got [3]"):
        torch.ops.fuselet.layer_norm_fwd(torch.ones(2, 4), torch.ones(4), torch.ones(3), 1e-5)
    with raises(ValueError, "eps: expected a finite number > 0, got -1.0"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4), torch.ones(4), -1.0)


def test_torch_op_direct_bad_dtype(torch):
    with raises(TypeError, "x: expected dtype float32, float16 or bfloat16, got float64"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), 1e-6)


def test_torch_op_direct_parameter_dtypes(torch):
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    with raises(TypeError, "weight: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        torch.ops.fuselet.rms_norm_fwd(x, torch.ones(4, dtype=torch.float16), 1e-6)
    with raises(TypeError, "bias: expected dtype float32 (the dtype of weight), got bfloat16"):
        torch.ops.fuselet.layer_norm_fwd(x, torch.ones(4), torch.ones(4, dtype=torch.bfloat16), 1e-5)
    with raises(ValueError, "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA scales by (1 + weight) and needs a weight, got weight=NULL"):
        torch.ops.fuselet.rms_norm_fwd(x, None, 1e-6, True)


def test_torch_op_direct_add_rms_norm(torch):
    with raises(ValueError, "residual: expected 2 rows of 4 elements like x, got 2 rows of 3"):
        torch.ops.fuselet.add_rms_norm_fwd(torch.ones(2, 4), torch.ones(2, 3), torch.ones(4), 1e-6)
    with raises(TypeError, "dresidual_out: expected dtype float32 (the dtype of residual_out), got bfloat16"):
        torch.ops.fuselet.add_rms_norm_bwd(
            torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(2, 4), torch.ones(4), torch.ones(2)
        )


@pytest.mark.parametrize("group_size", [3, 0, -4, 8])
def test_gated_group_size_not_a_divisor(api, group_size):
    """None is the whole row; 0 is the raw ops' word for it, not the public functions'."""
    message = f"group_size: expected None (the whole row) or a divisor of 4 (the hidden size of x), got {group_size}"
    with raises(ValueError, message):
        api.module.gated_rms_norm(api.array((2, 4)), api.array((2, 4)), group_size=group_size)


def test_gated_gate_shape(api):
    with raises(ValueError, "z: expected shape (2, 4) (the shape of x), got (4,)"):
        api.module.gated_rms_norm(api.array((2, 4)), api.array((4,)))


def test_gated_gate_dtype(api):
    with raises(TypeError, "z: expected dtype bfloat16 (the dtype of x), got float32"):
        api.module.gated_rms_norm(api.array((2, 4), "bfloat16"), api.array((2, 4)))


def test_gated_norm_before_gate_not_bool(api):
    with raises(TypeError, "norm_before_gate: expected a bool, got str"):
        api.module.gated_rms_norm(api.array((2, 4)), api.array((2, 4)), norm_before_gate="after")
