"""Bad arguments to the public API of both layers: the exception type, and a message that
names the argument and what was expected (fuselet/_checks.py words it for both layers)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tests.conftest import import_layer


class Api:
    """The public API of one layer, and how to make its arrays."""

    def __init__(self, framework, module):
        self.framework, self.module = framework, module

    def array(self, shape, dtype="float32"):
        values = np.asarray(np.arange(1, 1 + int(np.prod(shape)), dtype=np.float64).reshape(shape) / 7)
        if self.framework == "torch":
            import torch

            return torch.from_numpy(values).to(getattr(torch, dtype))
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(dtype == "float64"):  # a real float64 jax.Array
            return jnp.asarray(values, dtype=dtype)

    def rms_norm(self, x, weight, *args, **kwargs):
        return self.module.rms_norm(x, weight, *args, **kwargs)

    def layer_norm(self, x, weight, bias, *args, **kwargs):
        return self.module.layer_norm(x, weight, bias, *args, **kwargs)


@pytest.fixture
def api(layer):
    return Api(*layer)


def raises(exc, message):
    """pytest.raises for `exc` whose message contains `message` (taken literally)."""
    return pytest.raises(exc, match=re.escape(message))


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
    with raises(ValueError, f"eps: expected a finite float > 0, got {eps}"):
        api.rms_norm(api.array((2, 4)), api.array((4,)), eps)


@pytest.mark.parametrize("eps", [math.nan, math.inf])
def test_eps_not_finite(api, eps):
    with raises(ValueError, f"eps: expected a finite float > 0, got {eps}"):
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
    with raises(ValueError, "eps: expected a finite float > 0, got 0.0"):
        api.module.add_rms_norm(api.array((2, 4)), api.array((2, 4)), api.array((4,)), 0.0)


# --- gated linear units --------------------------------------------------------------------

@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_glu_odd_last_dim(api, op):
    with raises(ValueError, "x: expected an even last dimension > 0 (2F: the gate and up halves), got shape (2, 5)"):
        getattr(api.module, op)(api.array((2, 5)))


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
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


# --- softmax ----------------------------------------------------------------------------------

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
    with raises(ValueError, f"scale: expected a finite float, got {scale}"):
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



# --- rotary position embedding ------------------------------------------------------------

def rope_args(api, x=(2, 3, 4, 8), cos=(3, 8), sin=None, dtype="float32", cos_dtype="float32", sin_dtype=None):
    return (api.array(x, dtype), api.array(cos, cos_dtype),
            api.array(cos if sin is None else sin, cos_dtype if sin_dtype is None else sin_dtype))


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_rope_x_dtype(api, dtype):
    with raises(TypeError, f"x: expected dtype float32, float16 or bfloat16, got {dtype}"):
        api.module.rope(*rope_args(api, dtype=dtype))


@pytest.mark.parametrize("argument", ["x", "cos", "sin"])
def test_rope_not_an_array(api, argument):
    args = dict(zip(("x", "cos", "sin"), rope_args(api)))
    args[argument] = [1.0, 2.0]
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"{argument}: expected a {kind}, got list"):
        api.module.rope(args["x"], args["cos"], args["sin"])


def test_rope_layout_and_interleaved(api):
    with raises(ValueError, "layout: expected 'bshd' or 'bhsd', got 'bsnd'"):
        api.module.rope(*rope_args(api), layout="bsnd")
    with raises(TypeError, "layout: expected 'bshd' or 'bhsd', got int"):
        api.module.rope(*rope_args(api), layout=0)
    with raises(TypeError, "interleaved: expected a bool, got int"):
        api.module.rope(*rope_args(api), interleaved=1)


def test_rope_x_shape(api):
    with raises(ValueError, "x: expected shape [B, S, N, D] or [S, N, D] (layout 'bshd'), got shape (3, 8)"):
        api.module.rope(*rope_args(api, x=(3, 8)))
    with raises(ValueError, "x: expected shape [B, N, S, D] or [N, S, D] (layout 'bhsd'), got shape (1, 2, 3, 4, 8)"):
        api.module.rope(*rope_args(api, x=(1, 2, 3, 4, 8)), layout="bhsd")
    with raises(ValueError, "x: the head dim D (last dimension) must be > 0, got shape (2, 3, 4, 0)"):
        api.module.rope(*rope_args(api, x=(2, 3, 4, 0)))


def test_rope_table_dtypes(api):
    with raises(TypeError, "cos: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        api.module.rope(*rope_args(api, dtype="bfloat16", cos_dtype="float16"))
    with raises(TypeError, "cos: expected dtype float32, float16 or bfloat16, got int32"):
        api.module.rope(*rope_args(api, cos_dtype="int32"))
    with raises(TypeError, "sin: expected dtype float32 (the dtype of cos), got bfloat16"):
        api.module.rope(*rope_args(api, dtype="bfloat16", sin_dtype="bfloat16"))


@pytest.mark.parametrize("rotary", [7, 10, 0])
def test_rope_rotary_dim(api, rotary):
    with raises(ValueError, f"cos: the rotary dim R (last dimension) must be even and in [2, D=8], got shape (3, {rotary})"):
        api.module.rope(*rope_args(api, cos=(3, rotary)))


def test_rope_table_shapes(api):
    with raises(ValueError, "cos: expected shape [S, R] or [B, S, R], got shape (8,)"):
        api.module.rope(*rope_args(api, cos=(8,)))
    with raises(ValueError, "cos: expected shape [S, R] (x has no batch dim), got shape (1, 3, 8)"):
        api.module.rope(*rope_args(api, x=(3, 4, 8), cos=(1, 3, 8)))
    with raises(ValueError, "cos: expected 3 positions (S, dim 1 of x (2, 3, 4, 8)), got shape (4, 8)"):
        api.module.rope(*rope_args(api, cos=(4, 8)))
    with raises(ValueError, "cos: expected 4 positions (S, dim 2 of x (2, 3, 4, 8)), got shape (3, 8)"):
        api.module.rope(*rope_args(api), layout="bhsd")
    with raises(ValueError, "cos: expected a batch of 2 (B, dim 0 of x (2, 3, 4, 8)), got shape (3, 3, 8)"):
        api.module.rope(*rope_args(api, cos=(3, 3, 8)))
    with raises(ValueError, "sin: expected shape (3, 8) (the shape of cos), got (3, 6)"):
        api.module.rope(*rope_args(api, sin=(3, 6)))


# --- torch only -----------------------------------------------------------------------------

@pytest.fixture
def torch():
    import_layer("torch")
    import torch

    return torch


@pytest.mark.parametrize("argument", ["weight", "bias"])
def test_torch_mixed_devices(torch, argument):
    from fuselet.torch import layer_norm

    args = {"x": torch.ones(2, 4), "weight": torch.ones(4), "bias": torch.zeros(4)}
    args[argument] = args[argument].to("meta")
    with raises(ValueError, f"{argument}: expected a tensor on cpu (the device of x), got meta"):
        layer_norm(args["x"], args["weight"], args["bias"])


def test_torch_op_direct_bad_hidden_size(torch):
    """The registered op checks its arguments too: a Python ValueError, not a crash."""
    with raises(ValueError, "weight: expected 4 elements (the hidden size of x), got 5"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4), torch.ones(5), 1e-6)


def test_torch_op_direct_bad_bias_and_eps(torch):
    with raises(ValueError, "bias: expected 4 elements (the hidden size of x), got 3"):
        torch.ops.fuselet.layer_norm_fwd(torch.ones(2, 4), torch.ones(4), torch.ones(3), 1e-5)
    with raises(ValueError, "eps: expected a finite number > 0"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4), torch.ones(4), -1.0)


def test_torch_op_direct_bad_dtype(torch):
    with raises(TypeError, "x: expected dtype float32, float16 or bfloat16"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), 1e-6)


def test_torch_op_direct_parameter_dtypes(torch):
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    with raises(ValueError, "weight: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        torch.ops.fuselet.rms_norm_fwd(x, torch.ones(4, dtype=torch.float16), 1e-6)
    with raises(ValueError, "bias: expected dtype float32 (the dtype of weight), got bfloat16"):
        torch.ops.fuselet.layer_norm_fwd(x, torch.ones(4), torch.ones(4, dtype=torch.bfloat16), 1e-5)
    with raises(ValueError, "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA needs a weight"):
        torch.ops.fuselet.rms_norm_fwd(x, None, 1e-6, True)


def test_torch_op_direct_add_rms_norm(torch):
    with raises(ValueError, "residual: expected 2 rows of 4 elements like x, got 2 rows of 3"):
        torch.ops.fuselet.add_rms_norm_fwd(torch.ones(2, 4), torch.ones(2, 3), torch.ones(4), 1e-6)
    with raises(ValueError, "dresidual_out: expected dtype float32 (the dtype of x), got bfloat16"):
        torch.ops.fuselet.add_rms_norm_bwd(torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(2, 4),
                                           torch.ones(4), torch.ones(2))


def test_torch_op_direct_glu(torch):
    with raises(ValueError, "x: expected an even last dimension > 0 (2F: the gate and up halves), got 5"):
        torch.ops.fuselet.swiglu_fwd(torch.ones(2, 5))
    with raises(ValueError, "approximate: expected 'none' or 'tanh', got 'fast'"):
        torch.ops.fuselet.geglu_fwd(torch.ones(2, 4), "fast")
    with raises(ValueError, "dy: expected 2 rows of 2 elements, got 2 rows of 4"):
        torch.ops.fuselet.swiglu_bwd(torch.ones(2, 4), torch.ones(2, 4))


def test_torch_op_direct_softmax(torch):
    with raises(ValueError, "flags: FUSELET_SOFTMAX_CAUSAL needs x of shape [..., Q, K]"):
        torch.ops.fuselet.softmax_fwd(torch.ones(4), 1.0, True)
    with raises(ValueError, "scale: expected a finite number"):
        torch.ops.fuselet.softmax_fwd(torch.ones(2, 4), float("nan"))
    with raises(ValueError, "dy: expected 2 rows of 4 elements, got 2 rows of 3"):
        torch.ops.fuselet.softmax_bwd(torch.ones(2, 3), torch.ones(2, 4))


@pytest.mark.parametrize("argument", ["cos", "sin"])
def test_torch_rope_mixed_devices(torch, argument):
    from fuselet.torch import rope

    args = {"x": torch.ones(2, 3, 4, 8), "cos": torch.ones(3, 8), "sin": torch.ones(3, 8)}
    args[argument] = args[argument].to("meta")
    with raises(ValueError, f"{argument}: expected a tensor on cpu (the device of x), got meta"):
        rope(args["x"], args["cos"], args["sin"])


def test_torch_op_direct_rope(torch):
    """The core's own checks, reached through the registered ops."""
    x = torch.ones(2, 3, 4, 8)
    with raises(ValueError, "cos: the rotary dim R (last dimension) must be even and in [2, D = 8], got shape [3, 7]"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(3, 7), torch.ones(3, 7))
    with raises(ValueError, "cos: expected 3 positions (S, dimension 1 of dy), got shape [4, 8]"):
        torch.ops.fuselet.rope_bwd(x, torch.ones(4, 8), torch.ones(4, 8))
    with raises(ValueError, "sin: expected shape [3, 8] (the shape of cos), got [2, 3, 8]"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(3, 8), torch.ones(2, 3, 8))
    with raises(ValueError, "cos: expected dtype float32 or bfloat16 (the dtype of x), got float16"):
        torch.ops.fuselet.rope_fwd(x.bfloat16(), torch.ones(3, 8, dtype=torch.float16), torch.ones(3, 8))
    with raises(ValueError, "x: expected shape [B, N, S, D] or [N, S, D], got [3, 8]"):
        torch.ops.fuselet.rope_fwd(torch.ones(3, 8), torch.ones(3, 8), torch.ones(3, 8), True)
