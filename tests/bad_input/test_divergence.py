"""Bad input to the divergences (kl_div, jsd, tvd): both layers' entry points and the registered
torch ops."""

from __future__ import annotations

import math

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


@pytest.mark.parametrize("op", ["kl_div", "jsd", "tvd"])
def test_divergence_input_and_target(api, op):
    fn = getattr(api.module, op)
    x = api.array((2, 4))
    with raises(TypeError, "input: expected dtype float32, float16 or bfloat16, got int32"):
        fn(api.array((2, 4), "int32"), x)
    with raises(TypeError, "target: expected dtype float32 (the dtype of input), got bfloat16"):
        fn(x, api.array((2, 4), "bfloat16"))
    with raises(TypeError, "target: expected dtype float32, float16 or bfloat16, got int32"):
        fn(x, api.array((2, 4), "int32"))
    with raises(ValueError, "target: expected shape (2, 4) (the shape of input), got (2, 5)"):
        fn(x, api.array((2, 5)))
    with raises(ValueError, "input: the number of classes (last dimension) must be > 0, got shape (2, 0)"):
        fn(api.array((2, 0)), api.array((2, 0)))
    with raises(ValueError, "input: expected shape [..., V] with at least 1 dimension, got a 0-d array"):
        fn(api.array(()), api.array(()))
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"target: expected a {kind}, got list"):
        fn(x, [1.0, 2.0])


def test_kl_div_options(api):
    x = api.array((2, 4))
    with raises(ValueError, "reduction: expected one of 'none', 'batchmean', 'sum', 'mean', got 'avg'"):
        api.module.kl_div(x, x, reduction="avg")
    with raises(TypeError, "log_target: expected a bool, got int"):
        api.module.kl_div(x, x, log_target=1)


@pytest.mark.parametrize("beta", [-0.1, 1.5, math.nan, math.inf])
def test_jsd_beta_range(api, beta):
    x = api.array((2, 4))
    with raises(ValueError, f"beta: expected a number in [0, 1], got {beta}"):
        api.module.jsd(x, x, beta=beta)


def test_jsd_tvd_labels(api):
    x = api.array((2, 4))
    for fn in (api.module.jsd, api.module.tvd):
        with raises(ValueError, "labels: expected shape (2,) (the shape of input without its last dimension), got (3,)"):
            fn(x, x, labels=api.array((3,), "int32"))
        with raises(TypeError, "labels: expected dtype int32 or int64 (class ids), got float32"):
            fn(x, x, labels=api.array((2,)))
        with raises(TypeError, "ignore_index: expected a Python int, got float"):
            fn(x, x, labels=api.array((2,), "int32"), ignore_index=-100.0)
    with raises(TypeError, "beta: expected a Python float, got str"):
        api.module.jsd(x, x, beta="0.5")


# --- torch only -----------------------------------------------------------------------------


def test_torch_op_direct_divergence(torch):
    x, r = torch.ones(2, 4), torch.ones(2)
    with raises(ValueError, "kind: expected"):
        torch.ops.fuselet.divergence_fwd(x, x, 7, True, 0.0)
    with raises(ValueError, "log_target: expected"):
        torch.ops.fuselet.divergence_fwd(x, x, 1, False, 0.5)
    with raises(ValueError, "beta: expected 0 (beta is JSD's)"):
        torch.ops.fuselet.divergence_fwd(x, x, 0, True, 0.5)
    with raises(ValueError, "target: expected 2 rows of 4 elements, got 2 rows of 3"):
        torch.ops.fuselet.divergence_fwd(x, torch.ones(2, 3), 2, True, 0.0)
    with raises(ValueError, "dloss: expected 2 elements, got shape [3]"):
        torch.ops.fuselet.divergence_bwd(torch.ones(3), x, x, 1, True, 0.5, False)
    with raises(TypeError, "target: expected dtype float32 (the dtype of input), got bfloat16"):
        torch.ops.fuselet.divergence_bwd(r, x, x.bfloat16(), 1, True, 0.5, True)
