"""Bad input to cross_entropy (and its fused forward + backward): both layers' entry points and
the registered torch ops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


@pytest.mark.parametrize(("option", "value"), [("z_loss", 1e39), ("softcap", 1e39), ("softcap", 1e-50)])
def test_cross_entropy_options_beyond_float32(api, option, value):
    """A softcap of 1e-50 would be 0 in float32, the kernels' "no softcap": refused, not dropped."""
    with raises(ValueError, f"{option}: expected"):
        api.module.cross_entropy(api.array((2, 4)), api.array((2,), "int32"), **{option: value})


def targets(api, shape, values=None, dtype="int32"):
    values = np.zeros(shape, np.int64) if values is None else np.asarray(values)
    if api.framework == "torch":
        import torch

        return torch.from_numpy(values).to(getattr(torch, dtype))
    import jax.numpy as jnp

    return jnp.asarray(values, dtype=dtype)


def ce(api, logits=None, target=None, **kwargs):
    logits = api.array((2, 4)) if logits is None else logits
    target = targets(api, (2,)) if target is None else target
    return api.module.cross_entropy(logits, target, **kwargs)


def test_cross_entropy_bad_logits(api):
    with raises(TypeError, "logits: expected dtype float32, float16 or bfloat16, got float64"):
        ce(api, api.array((2, 4), "float64"))
    with raises(TypeError, "logits: expected dtype float32, float16 or bfloat16, got int32"):
        ce(api, api.array((2, 4), "int32"))
    with raises(ValueError, "logits: expected shape [..., V] with at least 1 dimension, got a 0-d array"):
        ce(api, api.array(()), targets(api, ()))
    with raises(ValueError, "logits: the number of classes (last dimension) must be > 0, got shape (2, 0)"):
        ce(api, api.array((2, 0)))
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"logits: expected a {kind}, got list"):
        ce(api, [[1.0, 2.0]])
    with raises(TypeError, f"target: expected a {kind}, got list"):
        ce(api, target=[0, 1])


def test_cross_entropy_bad_target(api):
    with raises(TypeError, "target: expected dtype int32 or int64 (class ids), got float32"):
        ce(api, target=api.array((2,)))
    with raises(ValueError, "target: expected shape (2,) (the shape of logits without its last dimension), got (3,)"):
        ce(api, target=targets(api, (3,)))
    with raises(ValueError, "target: expected shape (2, 3) (the shape of logits without its last dimension), got (6,)"):
        ce(api, api.array((2, 3, 4)), targets(api, (6,)))


@pytest.mark.parametrize("value", [4, -1, 100])
def test_cross_entropy_target_out_of_range(api, value):
    with raises(ValueError, f"target: element 1 is {value}, outside [0, 4) and not ignore_index (-100)"):
        ce(api, target=targets(api, (2,), [0, value]))


def test_cross_entropy_ignore_index(api):
    with raises(TypeError, "ignore_index: expected a Python int, got float"):
        ce(api, ignore_index=-100.0)
    with raises(TypeError, "ignore_index: expected a Python int, got bool"):
        ce(api, ignore_index=True)
    with raises(ValueError, f"ignore_index: expected an int64, got {2**63}"):
        ce(api, ignore_index=2**63)


@pytest.mark.parametrize("value", [1.5, -0.1, math.nan])
def test_cross_entropy_label_smoothing_range(api, value):
    with raises(ValueError, f"label_smoothing: expected a number in [0, 1], got {value}"):
        ce(api, label_smoothing=value)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_cross_entropy_z_loss_range(api, value):
    with raises(ValueError, f"z_loss: expected a finite number >= 0, got {value}"):
        ce(api, z_loss=value)


@pytest.mark.parametrize("value", [0.0, -30.0, math.inf, math.nan])
def test_cross_entropy_softcap_range(api, value):
    with raises(ValueError, f"softcap: expected None or a finite number > 0, got {value}"):
        ce(api, softcap=value)


def test_cross_entropy_scalars_not_numbers(api):
    with raises(TypeError, "label_smoothing: expected a Python float, got str"):
        ce(api, label_smoothing="0.1")
    with raises(TypeError, "z_loss: expected a Python float, got NoneType"):
        ce(api, z_loss=None)
    with raises(TypeError, "softcap: expected None or a Python float, got str"):
        ce(api, softcap="30")
    with raises(TypeError, "return_z_loss: expected a bool, got int"):
        ce(api, return_z_loss=1)


def test_cross_entropy_reduction(api):
    with raises(ValueError, "reduction: expected 'none', 'sum' or 'mean', got 'avg'"):
        ce(api, reduction="avg")
    with raises(TypeError, "reduction: expected 'none', 'sum' or 'mean', got NoneType"):
        ce(api, reduction=None)


def test_cross_entropy_fwd_bwd_grad_scale(api):
    import importlib

    fwd_bwd = importlib.import_module(f"fuselet.{api.framework}.cross_entropy").fwd_bwd
    with raises(TypeError, "grad_scale: expected a Python float, got str"):
        fwd_bwd(api.array((2, 4)), targets(api, (2,)), grad_scale="1")
    with raises(ValueError, "grad_scale: expected a finite number, got inf"):
        fwd_bwd(api.array((2, 4)), targets(api, (2,)), grad_scale=math.inf)
    with raises(ValueError, "label_smoothing: expected a number in [0, 1], got 2.0"):
        fwd_bwd(api.array((2, 4)), targets(api, (2,)), label_smoothing=2.0)


# --- the log-probabilities of a chunk (cross_entropy.logprobs_chunk / logprobs_chunk_grad[_]) ----


def chunk(api, logits=None, target=None, **kwargs):
    import importlib

    fn = importlib.import_module(f"fuselet.{api.framework}.cross_entropy").logprobs_chunk
    logits = api.array((2, 4)) if logits is None else logits
    target = targets(api, (2,)) if target is None else target
    return fn(logits, target, **{"ignore_index": -100, "softcap": None, "outputs": set(), **kwargs})


def chunk_grad(api, dentropy=None, entropy=None, dlogp=None, target=None):
    import importlib

    module = importlib.import_module(f"fuselet.{api.framework}.cross_entropy")
    fn = module.logprobs_chunk_grad_ if api.framework == "torch" else module.logprobs_chunk_grad
    target = targets(api, (2,)) if target is None else target
    return fn(api.array((2, 4)), target, api.array((2,)), entropy, dlogp, dentropy, ignore_index=-100, softcap=None)


def test_logprobs_chunk_bad_arguments(api):
    with raises(TypeError, "logits: expected dtype float32, float16 or bfloat16, got float64"):
        chunk(api, api.array((2, 4), "float64"))
    with raises(ValueError, "logits: the number of classes (last dimension) must be > 0, got shape (2, 0)"):
        chunk(api, api.array((2, 0)))
    with raises(TypeError, "target: expected dtype int32 or int64 (class ids), got float32"):
        chunk(api, target=api.array((2,)))
    with raises(ValueError, "target: expected shape (2,) (the shape of logits without its last dimension), got (3,)"):
        chunk(api, target=targets(api, (3,)))
    with raises(ValueError, "target: element 1 is 4, outside [0, 4) and not ignore_index (-100)"):
        chunk(api, target=targets(api, (2,), [0, 4]))
    with raises(TypeError, "ignore_index: expected a Python int, got float"):
        chunk(api, ignore_index=-100.0)
    with raises(ValueError, "softcap: expected None or a finite number > 0, got -1.0"):
        chunk(api, softcap=-1.0)
    names = "a set of names among 'entropy', 'log_sum_sq_probs', 'mean_logits', 'is_top1'"
    with raises(TypeError, f"outputs: expected {names}, got str"):
        chunk(api, outputs="entropy")
    with raises(ValueError, f"outputs: expected {names}, got 'log_probs'"):
        chunk(api, outputs={"log_probs"})


def test_logprobs_chunk_grad_bad_arguments(api):
    with raises(ValueError, "entropy: expected a tensor (the forward's entropy, needed with dentropy)"):
        chunk_grad(api, dentropy=api.array((2,)))
    with raises(ValueError, "dlogp: expected 2 elements, got shape [3]"):
        chunk_grad(api, dlogp=api.array((3,)))
    with raises(ValueError, "dentropy: expected 2 elements, got shape [3]"):
        chunk_grad(api, dentropy=api.array((3,)), entropy=api.array((2,)))
    with raises(ValueError, "target: element 0 is -5, outside [0, 4)"):
        chunk_grad(api, dlogp=api.array((2,)), target=targets(api, (2,), [-5, 0]))


# --- torch only -----------------------------------------------------------------------------


def test_torch_cross_entropy_only(torch):
    from fuselet.torch import cross_entropy

    with raises(TypeError, "inplace_backward: expected a bool, got str"):
        cross_entropy(torch.ones(2, 4), torch.zeros(2, dtype=torch.long), inplace_backward="yes")
    with raises(ValueError, "target: expected a tensor on cpu (the device of logits), got meta"):
        cross_entropy(torch.ones(2, 4), torch.zeros(2, dtype=torch.long, device="meta"))


def test_torch_op_direct_cross_entropy(torch):
    x, t, lse = torch.ones(2, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2)
    with raises(ValueError, "label_smoothing: expected a number in [0, 1], got 2.0"):
        torch.ops.fuselet.cross_entropy_fwd(x, t, -100, 2.0, 0.0, 0.0)
    with raises(ValueError, "softcap: expected 0 (none) or a finite number > 0, got -1.0"):
        torch.ops.fuselet.cross_entropy_fwd(x, t, -100, 0.0, 0.0, -1.0)
    with raises(ValueError, "z_loss: expected a finite number >= 0, got -1.0"):
        torch.ops.fuselet.cross_entropy_fwd_bwd(x, t, -100, 0.0, -1.0, 0.0, 1.0)
    with raises(TypeError, "target: expected dtype int32 or int64 (class ids), got float32"):
        torch.ops.fuselet.cross_entropy_fwd(x, x[:, 0], -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "target: expected 2 elements (the rows of logits), got shape [3]"):
        torch.ops.fuselet.cross_entropy_fwd(x, torch.zeros(3, dtype=torch.long), -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "target: element 0 is 9, outside [0, 4)"):
        torch.ops.fuselet.cross_entropy_bwd_(torch.ones(2), x, torch.tensor([9, 0]), lse, -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "dloss: expected 2 elements, got shape [3]"):
        torch.ops.fuselet.cross_entropy_bwd(torch.ones(3), x, t, lse, -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "grad_scale: expected a finite number, got inf"):
        torch.ops.fuselet.cross_entropy_fwd_bwd_(x, t, -100, 0.0, 0.0, 0.0, float("inf"))
    with raises(ValueError, "logits: the number of classes (last dimension) must be > 0, got shape [2, 0]"):
        torch.ops.fuselet.cross_entropy_fwd(torch.ones(2, 0), t, -100, 0.0, 0.0, 0.0)


def test_torch_op_direct_logprobs(torch):
    x, t, r = torch.ones(2, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2)
    with raises(ValueError, "softcap: expected 0 (none) or a finite number > 0, got -1.0"):
        torch.ops.fuselet.logprobs_fwd(x, t, -100, -1.0, False, False)
    with raises(ValueError, "target: expected 2 elements (the rows of logits), got shape [3]"):
        torch.ops.fuselet.logprobs_fwd(x, torch.zeros(3, dtype=torch.long), -100, 0.0, True, True)
    with raises(ValueError, "target: element 0 is 9, outside [0, 4)"):
        torch.ops.fuselet.logprobs_bwd_(x, torch.tensor([9, 0]), r, None, r, None, -100, 0.0)
    with raises(TypeError, "dentropy: expected dtype float32, got float16"):
        torch.ops.fuselet.logprobs_bwd_(x, t, r, r, None, r.half(), -100, 0.0)
    with raises(ValueError, "lse: expected 2 elements, got shape [3]"):
        torch.ops.fuselet.logprobs_bwd_(x, t, torch.zeros(3), None, r, None, -100, 0.0)
