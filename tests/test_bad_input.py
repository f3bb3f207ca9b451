"""Bad arguments to the public API of both layers: the exception type, and a message that
names the argument and what was expected (fuselet/_checks.py words it for both layers)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tests.conftest import import_layer

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


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


NINE_DIMS = (1,) * 8 + (4,)
ROW_OPS = {  # op -> (call on an x of `shape`, the argument that is x)
    "rms_norm": (lambda api, shape: api.module.rms_norm(api.array(shape)), "x"),
    "layer_norm": (lambda api, shape: api.module.layer_norm(api.array(shape)), "x"),
    "swiglu": (lambda api, shape: api.module.swiglu(api.array(shape)), "x"),
    "softmax": (lambda api, shape: api.module.softmax(api.array(shape)), "x"),
    "cross_entropy": (lambda api, shape: api.module.cross_entropy(api.array(shape), api.array(shape[:-1], "int32")), "logits"),
    "kl_div": (lambda api, shape: api.module.kl_div(api.array(shape), api.array(shape)), "input"),
}


@pytest.mark.parametrize("op", ROW_OPS)
def test_more_dimensions_than_the_kernels_take(api, op):
    call, argument = ROW_OPS[op]
    with raises(ValueError, f"{argument}: expected at most 8 dimensions, got 9"):
        call(api, NINE_DIMS)


@pytest.mark.parametrize("eps", [1e-50, 1e39, 10**400], ids=["rounds-to-0", "rounds-to-inf", "int-beyond-float"])
def test_eps_beyond_float32(api, eps):
    """The kernels take eps in float32: one that becomes 0 or inf there is refused at the call."""
    with raises(ValueError, "eps: expected"):
        api.rms_norm(api.array((2, 4)), api.array((4,)), eps)


def test_scale_beyond_float32(api):
    with raises(ValueError, "scale: expected"):
        api.module.softmax(api.array((2, 4)), 1e39)


@pytest.mark.parametrize(("option", "value"), [("z_loss", 1e39), ("softcap", 1e39), ("softcap", 1e-50)])
def test_cross_entropy_options_beyond_float32(api, option, value):
    """A softcap of 1e-50 would be 0 in float32, the kernels' "no softcap": refused, not dropped."""
    with raises(ValueError, f"{option}: expected"):
        api.module.cross_entropy(api.array((2, 4)), api.array((2,), "int32"), **{option: value})


JAX_OPS = {  # op -> (call with its arrays, the arrays by name)
    "rms_norm": (lambda fj, a: fj.rms_norm(a["x"], a["weight"]), {"x": (2, 4), "weight": (4,)}),
    "add_rms_norm": (lambda fj, a: fj.add_rms_norm(a["x"], a["residual"]), {"x": (2, 4), "residual": (2, 4)}),
    "swiglu": (lambda fj, a: fj.swiglu(a["x"]), {"x": (2, 4)}),
    "clamped_swiglu": (lambda fj, a: fj.clamped_swiglu(a["x"], interleaved=True), {"x": (2, 4)}),
    "softmax": (lambda fj, a: fj.softmax(a["x"]), {"x": (2, 4)}),
    "rope": (lambda fj, a: fj.rope(a["x"], a["cos"], a["sin"]), {"x": (1, 2, 1, 4), "cos": (2, 4), "sin": (2, 4)}),
    "cross_entropy": (lambda fj, a: fj.cross_entropy(a["logits"], a["target"]), {"logits": (2, 4), "target": (2,)}),
    "fused_linear_cross_entropy": (
        lambda fj, a: fj.fused_linear_cross_entropy(a["hidden"], a["weight"], a["target"]),
        {"hidden": (2, 4), "weight": (3, 4), "target": (2,)},
    ),
    "kl_div": (lambda fj, a: fj.kl_div(a["input"], a["target"]), {"input": (2, 4), "target": (2, 4)}),
    "jsd": (
        lambda fj, a: fj.jsd(a["input"], a["target"], labels=a["labels"]),
        {"input": (2, 4), "target": (2, 4), "labels": (2,)},
    ),
    "tvd": (lambda fj, a: fj.tvd(a["input"], a["target"]), {"input": (2, 4), "target": (2, 4)}),
    "fused_linear_preference_loss": (
        lambda fj, a: fj.fused_linear_preference_loss(a["hidden"], a["weight"], a["target"]),
        {"hidden": (2, 3, 4), "weight": (5, 4), "target": (2, 3)},
    ),
    "fused_linear_kto_loss": (
        lambda fj, a: fj.fused_linear_kto_loss(a["hidden"], a["weight"], a["target"], a["preference_labels"]),
        {"hidden": (2, 3, 4), "weight": (5, 4), "target": (2, 3), "preference_labels": (2,)},
    ),
    "fused_linear_grpo_loss": (
        lambda fj, a: fj.fused_linear_grpo_loss(a["hidden"], a["weight"], a["target"], a["advantages"]),
        {"hidden": (2, 3, 4), "weight": (5, 4), "target": (2, 3), "advantages": (2,)},
    ),
    "fused_linear_jsd": (
        lambda fj, a: fj.fused_linear_jsd(a["student_hidden"], a["student_weight"], a["teacher_hidden"], a["teacher_weight"]),
        {"student_hidden": (2, 4), "student_weight": (5, 4), "teacher_hidden": (2, 3), "teacher_weight": (5, 3)},
    ),
}


@pytest.mark.parametrize(("op", "argument"), [(op, name) for op, (_, arrays) in JAX_OPS.items() for name in arrays], ids="-".join)
def test_jax_given_a_torch_tensor(op, argument):
    """A torch.Tensor has .shape and .dtype too: named as what it is, not as a dtype JAX cannot read."""
    fj = import_layer("jax")
    torch = pytest.importorskip("torch")
    call, shapes = JAX_OPS[op]
    api = Api("jax", fj)
    ids = {"target", "labels"} if op not in ("kl_div", "jsd", "tvd") else {"labels"}  # class ids
    dtypes = {n: "int32" if n in ids else "bool" if n == "preference_labels" else "float32" for n in shapes}
    arrays = {n: api.array(s, dtypes[n]) for n, s in shapes.items()}
    torch_dtype = {"int32": torch.int64, "bool": torch.bool, "float32": torch.float32}[dtypes[argument]]
    arrays[argument] = torch.zeros(shapes[argument], dtype=torch_dtype)
    optional = " or None" if (op, argument) in (("rms_norm", "weight"), ("jsd", "labels")) else ""
    with raises(TypeError, f"{argument}: expected a jax.Array{optional}, got torch.Tensor"):
        call(fj, arrays)


# --- post-training losses (composed over fused_linear_cross_entropy) ---------------------


def test_fused_linear_preference_loss_rules(api):
    hidden, weight, target = api.array((4, 3, 4)), api.array((5, 4)), api.array((4, 3), "int32")
    loss = api.module.fused_linear_preference_loss
    with raises(ValueError, "loss: expected one of dpo, hinge, ipo, simpo, cpo, orpo, got 'sigmoid'"):
        loss(hidden, weight, target, loss="sigmoid")
    with raises(ValueError, "hidden: expected an even number of sequences > 0 (B chosen, then B rejected), got 3"):
        loss(api.array((3, 3, 4)), weight, api.array((3, 3), "int32"))
    with raises(ValueError, "target: expected shape (4, 3) (the sequences and positions of hidden (4, 3, 4)), got (4, 2)"):
        loss(hidden, weight, api.array((4, 2), "int32"))
    with raises(ValueError, "beta: expected a number > 0.0, got -1.0"):
        loss(hidden, weight, target, beta=-1.0)
    with raises(ValueError, "ref_weight: expected with ref_hidden"):
        loss(hidden, weight, target, ref_hidden=hidden)
    with raises(TypeError, "weight: expected dtype float32 (the dtype of hidden), got bfloat16"):
        loss(hidden, api.array((5, 4), "bfloat16"), target)


def test_fused_linear_kto_loss_rules(api):
    hidden, weight, target = api.array((3, 2, 4)), api.array((5, 4)), api.array((3, 2), "int32")
    labels = api.array((3,), "bool")
    loss = api.module.fused_linear_kto_loss
    with raises(ValueError, "preference_labels: expected shape (3,) (one per sequence of hidden (3, 2, 4)), got (2,)"):
        loss(hidden, weight, target, api.array((2,), "bool"))
    with raises(TypeError, "preference_labels: expected dtype bool (True: desirable, False: undesirable), got float32"):
        loss(hidden, weight, target, api.array((3,)))
    with raises(ValueError, "target: expected shape (3, 2) (the sequences and positions of hidden (3, 2, 4)), got (3, 1)"):
        loss(hidden, weight, api.array((3, 1), "int32"), labels)
    with raises(ValueError, "hidden: expected shape [sequences, T, H], got (6, 4)"):
        loss(api.array((6, 4)), weight, api.array((6,), "int32"), labels)
    with raises(ValueError, "hidden: expected at least one sequence, got shape (0, 2, 4)"):
        loss(api.array((0, 2, 4)), weight, api.array((0, 2), "int32"), api.array((0,), "bool"))
    with raises(ValueError, "kl: expected a scalar (a number or a 0-d array: the KL estimate), got shape (3,)"):
        loss(hidden, weight, target, labels, kl=api.array((3,)))
    with raises(TypeError, "kl: expected a floating-point dtype, got int32"):
        loss(hidden, weight, target, labels, kl=api.array((), "int32"))
    with raises(TypeError, "kl: expected None, a number or a 0-d array (the KL estimate), got str"):
        loss(hidden, weight, target, labels, kl="0.1")
    with raises(ValueError, "kl: expected a finite number, got nan"):
        loss(hidden, weight, target, labels, kl=math.nan)
    with raises(ValueError, "beta: expected a number > 0.0, got 0.0"):
        loss(hidden, weight, target, labels, beta=0.0)
    with raises(ValueError, "desirable_weight: expected a number >= 0.0, got -1.0"):
        loss(hidden, weight, target, labels, desirable_weight=-1.0)
    with raises(ValueError, "undesirable_weight: expected a finite number, got inf"):
        loss(hidden, weight, target, labels, undesirable_weight=math.inf)
    with raises(ValueError, "ref_hidden: expected with ref_weight"):
        loss(hidden, weight, target, labels, ref_weight=weight)
    with raises(ValueError, "ref_hidden: expected shape [3, 2, H_ref] (hidden's sequences and positions), got (2, 2, 4)"):
        loss(hidden, weight, target, labels, ref_hidden=api.array((2, 2, 4)), ref_weight=weight)
    with raises(ValueError, "ref_weight: expected shape [V, 6] (H_ref: the last dimension of ref_hidden (3, 2, 6)), got (5, 4)"):
        loss(hidden, weight, target, labels, ref_hidden=api.array((3, 2, 6)), ref_weight=weight)
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"preference_labels: expected a {kind}, got list"):
        loss(hidden, weight, target, [True, False, True])


def test_fused_linear_grpo_loss_rules(api):
    hidden, weight, target = api.array((2, 3, 4)), api.array((5, 4)), api.array((2, 3), "int32")
    loss = api.module.fused_linear_grpo_loss
    with raises(ValueError, "advantages: expected shape (2,) (one per sequence of hidden (2, 3, 4)), got (3,)"):
        loss(hidden, weight, target, api.array((3,)))
    with raises(ValueError, "ref_logps: expected shape (2, 3) (target's), got (2, 2)"):
        loss(hidden, weight, target, api.array((2,)), ref_logps=api.array((2, 2)))
    with raises(ValueError, "loss_type: expected one of grpo, bnpo, dr_grpo, got 'dapo'"):
        loss(hidden, weight, target, api.array((2,)), loss_type="dapo")


# --- divergences (kl_div, jsd, tvd) ---------------------------------------------------------


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
    with raises(ValueError, f"beta: expected a float in [0, 1], got {beta}"):
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
    with raises(raw_dtype_error(), "target: expected dtype float32 (the dtype of input), got bfloat16"):
        torch.ops.fuselet.divergence_bwd(r, x, x.bfloat16(), 1, True, 0.5, True)


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
    with raises(ValueError, "beta: expected a float in [0, 1], got 2.0"):
        loss(hs, ws, ht, wt, beta=2.0)
    with raises(ValueError, "temperature: expected a number > 0.0, got 0.0"):
        loss(hs, ws, ht, wt, temperature=0.0)
    with raises(ValueError, "chunk_size: expected None or an int >= 1, got 0"):
        loss(hs, ws, ht, wt, chunk_size=0)
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"teacher_weight: expected a {kind}, got list"):
        loss(hs, ws, ht, [1.0])


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
    return (
        api.array(x, dtype),
        api.array(cos, cos_dtype),
        api.array(cos if sin is None else sin, cos_dtype if sin_dtype is None else sin_dtype),
    )


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


# --- cross-entropy ----------------------------------------------------------------------------


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
    with raises(ValueError, f"label_smoothing: expected a float in [0, 1], got {value}"):
        ce(api, label_smoothing=value)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_cross_entropy_z_loss_range(api, value):
    with raises(ValueError, f"z_loss: expected a finite float >= 0, got {value}"):
        ce(api, z_loss=value)


@pytest.mark.parametrize("value", [0.0, -30.0, math.inf, math.nan])
def test_cross_entropy_softcap_range(api, value):
    with raises(ValueError, f"softcap: expected None or a finite float > 0, got {value}"):
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
    with raises(ValueError, "grad_scale: expected a finite float, got inf"):
        fwd_bwd(api.array((2, 4)), targets(api, (2,)), grad_scale=math.inf)
    with raises(ValueError, "label_smoothing: expected a float in [0, 1], got 2.0"):
        fwd_bwd(api.array((2, 4)), targets(api, (2,)), label_smoothing=2.0)


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


def raw_dtype_error():
    """What a raw torch.ops.fuselet call on real tensors raises for a wrong dtype (or None for a
    tensor): TypeError from the exact-ABI build; ValueError from the stable-ABI build, whose
    kernels can throw only standard C++ exceptions (the wrappers and the fake impls raise
    TypeError in both builds)."""
    import fuselet.torch

    return ValueError if fuselet.torch.BUILD_INFO["abi"] == "stable" else TypeError


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
    with raises(raw_dtype_error(), "x: expected dtype float32, float16 or bfloat16, got float64"):
        torch.ops.fuselet.rms_norm_fwd(torch.ones(2, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), 1e-6)


def test_torch_op_direct_parameter_dtypes(torch):
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    with raises(raw_dtype_error(), "weight: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        torch.ops.fuselet.rms_norm_fwd(x, torch.ones(4, dtype=torch.float16), 1e-6)
    with raises(raw_dtype_error(), "bias: expected dtype float32 (the dtype of weight), got bfloat16"):
        torch.ops.fuselet.layer_norm_fwd(x, torch.ones(4), torch.ones(4, dtype=torch.bfloat16), 1e-5)
    with raises(ValueError, "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA needs a weight"):
        torch.ops.fuselet.rms_norm_fwd(x, None, 1e-6, True)


def test_torch_op_direct_add_rms_norm(torch):
    with raises(ValueError, "residual: expected 2 rows of 4 elements like x, got 2 rows of 3"):
        torch.ops.fuselet.add_rms_norm_fwd(torch.ones(2, 4), torch.ones(2, 3), torch.ones(4), 1e-6)
    with raises(raw_dtype_error(), "dresidual_out: expected dtype float32 (the dtype of residual_out), got bfloat16"):
        torch.ops.fuselet.add_rms_norm_bwd(
            torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(2, 4), torch.ones(4), torch.ones(2)
        )


def test_torch_op_direct_glu(torch):
    with raises(ValueError, "x: expected an even last dimension > 0 (2F: the gate and up halves), got 5"):
        torch.ops.fuselet.swiglu_fwd(torch.ones(2, 5))
    with raises(ValueError, "approximate: expected 'none' or 'tanh', got 'fast'"):
        torch.ops.fuselet.geglu_fwd(torch.ones(2, 4), "fast")
    with raises(ValueError, "dy: expected 2 rows of 2 elements, got 2 rows of 4"):
        torch.ops.fuselet.swiglu_bwd(torch.ones(2, 4), torch.ones(2, 4))
    with raises(ValueError, "limit: expected a finite number > 0, got 0"):
        torch.ops.fuselet.clamped_swiglu_fwd(torch.ones(2, 4), 1.702, 0.0, True)
    with raises(ValueError, "alpha: expected a finite number, got inf"):
        torch.ops.fuselet.clamped_swiglu_bwd(torch.ones(2, 2), torch.ones(2, 4), float("inf"), 7.0, False)


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
    with raises(raw_dtype_error(), "cos: expected dtype float32 or bfloat16 (the dtype of x), got float16"):
        torch.ops.fuselet.rope_fwd(x.bfloat16(), torch.ones(3, 8, dtype=torch.float16), torch.ones(3, 8))
    with raises(ValueError, "x: expected shape [B, N, S, D] or [N, S, D], got [3, 8]"):
        torch.ops.fuselet.rope_fwd(torch.ones(3, 8), torch.ones(3, 8), torch.ones(3, 8), True)


def test_torch_cross_entropy_only(torch):
    from fuselet.torch import cross_entropy

    with raises(TypeError, "inplace_backward: expected a bool, got str"):
        cross_entropy(torch.ones(2, 4), torch.zeros(2, dtype=torch.long), inplace_backward="yes")
    with raises(ValueError, "target: expected a tensor on cpu (the device of logits), got meta"):
        cross_entropy(torch.ones(2, 4), torch.zeros(2, dtype=torch.long, device="meta"))


def test_torch_op_direct_cross_entropy(torch):
    x, t, lse = torch.ones(2, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2)
    with raises(ValueError, "label_smoothing: expected a number in [0, 1], got 2"):
        torch.ops.fuselet.cross_entropy_fwd(x, t, -100, 2.0, 0.0, 0.0)
    with raises(ValueError, "softcap: expected a finite number > 0, or 0 for none, got -1"):
        torch.ops.fuselet.cross_entropy_fwd(x, t, -100, 0.0, 0.0, -1.0)
    with raises(ValueError, "z_loss: expected a finite number >= 0, got -1"):
        torch.ops.fuselet.cross_entropy_fwd_bwd(x, t, -100, 0.0, -1.0, 0.0, 1.0)
    with raises(raw_dtype_error(), "target: expected dtype int32 or int64 (class ids), got float32"):
        torch.ops.fuselet.cross_entropy_fwd(x, x[:, 0], -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "target: expected 2 elements (the rows of logits), got shape [3]"):
        torch.ops.fuselet.cross_entropy_fwd(x, torch.zeros(3, dtype=torch.long), -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "target: element 0 is 9, outside [0, 4)"):
        torch.ops.fuselet.cross_entropy_bwd_(torch.ones(2), x, torch.tensor([9, 0]), lse, -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "dloss: expected 2 elements, got shape [3]"):
        torch.ops.fuselet.cross_entropy_bwd(torch.ones(3), x, t, lse, -100, 0.0, 0.0, 0.0)
    with raises(ValueError, "grad_scale: expected a finite number, got inf"):
        torch.ops.fuselet.cross_entropy_fwd_bwd_(x, t, -100, 0.0, 0.0, 0.0, float("inf"))
    with raises(ValueError, "logits: the last dimension (classes) must be > 0, got 0"):
        torch.ops.fuselet.cross_entropy_fwd(torch.ones(2, 0), t, -100, 0.0, 0.0, 0.0)


def _bad_op_calls(torch):
    """(exception, message, op, args) of raw op calls that the op refuses: the message part is
    one that the op on CPU tensors and its fake impl (meta tensors, torch.compile) both give."""
    f = torch.ones
    t2, t3 = torch.zeros(2, dtype=torch.long), torch.zeros(3, dtype=torch.long)
    x, w, r = f(2, 4), f(4), f(2)
    q = f(2, 3, 4, 8)
    return [
        (ValueError, "weight: expected", "rms_norm_fwd", (x, f(5), 1e-6)),
        (TypeError, "x: expected dtype float32, float16 or bfloat16", "rms_norm_fwd", (x.double(), None, 1e-6)),
        (ValueError, "eps: expected a finite", "rms_norm_fwd", (x, w, -1.0)),
        (ValueError, "x: the hidden size (last dimension) must be > 0", "rms_norm_fwd", (f(2, 0), None, 1e-6)),
        (ValueError, "dy: expected", "rms_norm_bwd", (f(2, 3), x, w, r)),
        (ValueError, "rstd: expected", "rms_norm_bwd", (x, x, w, f(3))),
        (ValueError, "bias: expected", "layer_norm_fwd", (x, w, f(3), 1e-5)),
        (ValueError, "mean: expected", "layer_norm_bwd", (x, x, w, w, f(3), r)),
        (ValueError, "residual: expected", "add_rms_norm_fwd", (x, f(2, 3), w, 1e-6)),
        (ValueError, "dresidual_out: expected", "add_rms_norm_bwd", (x, f(2, 3), x, w, r)),
        (ValueError, "x: expected an even last dimension > 0", "swiglu_fwd", (f(2, 5),)),
        (ValueError, "dy: expected", "swiglu_bwd", (x, x)),
        (ValueError, "approximate: expected 'none' or 'tanh'", "geglu_fwd", (x, "fast")),
        (ValueError, "dy: expected", "geglu_bwd", (f(2, 3), x)),
        (ValueError, "limit: expected a finite number > 0", "clamped_swiglu_fwd", (x, 1.702, -1.0, False)),
        (ValueError, "dy: expected", "clamped_swiglu_bwd", (f(2, 3), x, 1.702, 7.0, True)),
        (ValueError, "needs x of shape [..., Q, K]", "softmax_fwd", (f(4), 1.0, True)),
        (ValueError, "scale: expected a finite", "softmax_fwd", (x, float("inf"))),
        (ValueError, "dy: expected", "softmax_bwd", (f(2, 3), x)),
        (ValueError, "cos: the rotary dim R (last dimension) must be even", "rope_fwd", (q, f(3, 7), f(3, 7))),
        (ValueError, "cos: expected 3 positions", "rope_bwd", (q, f(4, 8), f(4, 8))),
        (ValueError, "sin: expected shape", "rope_fwd", (q, f(3, 8), f(2, 3, 8))),
        (ValueError, "target: expected", "cross_entropy_fwd", (x, t3, -100, 0.0, 0.0, 0.0)),
        (TypeError, "target: expected dtype int32 or int64 (class ids)", "cross_entropy_fwd", (x, r, -100, 0.0, 0.0, 0.0)),
        (ValueError, "softcap: expected", "cross_entropy_fwd", (x, t2, -100, 0.0, 0.0, -1.0)),
        (ValueError, "dloss: expected", "cross_entropy_bwd", (f(3), x, t2, r, -100, 0.0, 0.0, 0.0)),
        (ValueError, "lse: expected", "cross_entropy_bwd_", (r, x, t2, f(3), -100, 0.0, 0.0, 0.0)),
        (ValueError, "label_smoothing: expected", "cross_entropy_fwd_bwd", (x, t2, -100, 2.0, 0.0, 0.0, 1.0)),
        (ValueError, "grad_scale: expected a finite", "cross_entropy_fwd_bwd_", (x, t2, -100, 0.0, 0.0, 0.0, float("inf"))),
        (ValueError, "kind: expected", "divergence_fwd", (x, x, 3, True, 0.0)),
        (ValueError, "log_target: expected", "divergence_fwd", (x, x, 2, False, 0.0)),
        (ValueError, "beta: expected", "divergence_fwd", (x, x, 1, True, 2.0)),
        (ValueError, "target: expected 2 rows of 4 elements", "divergence_fwd", (x, f(2, 3), 0, True, 0.0)),
        (ValueError, "dloss: expected", "divergence_bwd", (f(3), x, x, 0, True, 0.0, True)),
        (
            ValueError,
            "weight: expected shape [V, 4]",
            "fused_linear_cross_entropy_none",
            (x, f(5, 3), None, t2, -100, 0.0, 0.0, 0.0, 0),
        ),
        (
            ValueError,
            "target: expected shape (2,)",
            "fused_linear_cross_entropy_reduced",
            (x, f(5, 4), None, t3, -100, 0.0, 0.0, 0.0, True, 0),
        ),
        (ValueError, "z_loss: expected", "fused_linear_cross_entropy_none", (x, f(5, 4), None, t2, -100, 0.0, -1.0, 0.0, 0)),
        (
            ValueError,
            "lse: expected shape [2]",
            "fused_linear_cross_entropy_none_bwd",
            (r, x, f(5, 4), None, t2, f(3), -100, 0.0, 0.0, 0.0, 0),
        ),
    ]


def _on(torch, device, args):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def test_torch_op_direct_fake_impls_check(torch):
    """The fake impls (meta tensors, torch.compile's tracing) refuse what the ops refuse."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for exc, message, op, args in _bad_op_calls(torch):
        with raises(raw_dtype_error() if exc is TypeError else exc, message):
            getattr(torch.ops.fuselet, op)(*args)
        with raises(exc, message):
            getattr(torch.ops.fuselet, op)(*_on(torch, "meta", args))
        with FakeTensorMode() as mode:
            fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
            with raises(exc, message):
                getattr(torch.ops.fuselet, op)(*fake)


def test_torch_op_direct_trace_time_errors(torch):
    """torch.export and torch.compile meet the op's error while tracing, before any kernel runs."""

    class Norm(torch.nn.Module):
        def forward(self, x, w):
            return torch.ops.fuselet.rms_norm_fwd(x, w, 1e-6)[0]

    args = (torch.ones(2, 4), torch.ones(5))
    with raises(ValueError, "weight: expected shape (4,)"):
        torch.export.export(Norm(), args)
    with pytest.raises(Exception, match=re.escape("weight: expected shape (4,)")):
        torch.compile(Norm(), backend="eager", fullgraph=True)(*args)


def _mixed_calls(torch):
    """(argument, reference argument, op, args) of raw op calls with valid shapes."""
    f = torch.ones
    x, w, r, t = f(2, 4), f(4), f(2), torch.zeros(2, dtype=torch.long)
    q, c = f(2, 3, 4, 8), f(3, 8)
    return [
        ("weight", "x", "rms_norm_fwd", (x, w, 1e-6)),
        ("rstd", "x", "rms_norm_bwd", (x, x, w, r)),
        ("dy", "x", "rms_norm_bwd", (x, x, w, r)),
        ("bias", "x", "layer_norm_fwd", (x, w, w, 1e-5)),
        ("mean", "x", "layer_norm_bwd", (x, x, w, w, r, r)),
        ("bias", "x", "layer_norm_bwd", (x, x, w, w, r, r)),
        ("residual", "x", "add_rms_norm_fwd", (x, x, w, 1e-6)),
        ("weight", "residual_out", "add_rms_norm_bwd", (x, x, x, w, r)),
        ("dy", "x", "swiglu_bwd", (f(2, 2), x)),
        ("dy", "x", "geglu_bwd", (f(2, 2), x, "none")),
        ("dy", "x", "clamped_swiglu_bwd", (f(2, 2), x, 1.702, 7.0, True)),
        ("dy", "y", "softmax_bwd", (x, x, 1.0)),
        ("sin", "x", "rope_fwd", (q, c, c)),
        ("cos", "dy", "rope_bwd", (q, c, c)),
        ("target", "logits", "cross_entropy_fwd", (x, t, -100, 0.0, 0.0, 0.0)),
        ("target", "input", "divergence_fwd", (x, x, 0, True, 0.0)),
        ("dloss", "input", "divergence_bwd", (r, x, x, 1, True, 0.5, False)),
        ("lse", "logits", "cross_entropy_bwd", (r, x, t, r, -100, 0.0, 0.0, 0.0)),
        ("dloss", "logits", "cross_entropy_bwd_", (r, x, t, r, -100, 0.0, 0.0, 0.0)),
        ("target", "logits", "cross_entropy_fwd_bwd", (x, t, -100, 0.0, 0.0, 0.0, 1.0)),
        ("target", "logits", "cross_entropy_fwd_bwd_", (x, t, -100, 0.0, 0.0, 0.0, 1.0)),
        ("weight", "hidden", "fused_linear_cross_entropy_none", (x, f(5, 4), None, t, -100, 0.0, 0.0, 0.0, 0)),
        ("dloss", "hidden", "fused_linear_cross_entropy_none_bwd", (r, x, f(5, 4), None, t, r, -100, 0.0, 0.0, 0.0, 0)),
    ]


def _arg_names(torch, op):
    return [a.name for a in getattr(torch.ops.fuselet, op).default._schema.arguments]


def test_torch_op_direct_mixed_meta_devices(torch):
    """One tensor on meta, the others on the CPU (the dispatcher then runs the fake impl): the
    meta tensor is named, rather than uninitialised CPU outputs returned."""
    for name, ref, op, args in _mixed_calls(torch):
        names = _arg_names(torch, op)
        mixed = list(args)
        mixed[names.index(name)] = mixed[names.index(name)].to("meta")
        with raises(ValueError, f"{name}: expected a tensor on cpu (the device of {ref}), got meta"):
            getattr(torch.ops.fuselet, op)(*mixed)


@pytest.mark.parametrize(
    "call",
    [
        lambda F, x: F.rms_norm(x),
        lambda F, x: F.layer_norm(x),
        lambda F, x: F.add_rms_norm(x, x),
        lambda F, x: F.swiglu(x),
        lambda F, x: F.geglu(x),
        lambda F, x: F.clamped_swiglu(x),
        lambda F, x: F.softmax(x),
        lambda F, x: F.RMSNorm(4)(x),
        lambda F, x: F.LayerNorm(4)(x),
    ],
)
def test_torch_not_a_dense_tensor(torch, call):
    import fuselet.torch as F

    with raises(TypeError, "x: expected a torch.Tensor, got NoneType"):
        call(F, None)
    with raises(NotImplementedError, "x: expected a strided (dense) tensor, got layout torch.sparse_coo"):
        call(F, torch.ones(2, 4).to_sparse())
    with raises(NotImplementedError, "x: expected a strided (dense) tensor, got a nested tensor"):
        call(F, torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)], layout=torch.jagged))


def test_torch_other_arguments_not_dense(torch):
    import fuselet.torch as F

    x, c, t = torch.ones(2, 3, 4, 8), torch.ones(3, 8), torch.zeros(2, dtype=torch.long)
    sparse = "expected a strided (dense) tensor, got layout torch.sparse_coo"
    with raises(NotImplementedError, f"weight: {sparse}"):
        F.rms_norm(torch.ones(2, 4), torch.ones(4).to_sparse())
    with raises(NotImplementedError, f"residual: {sparse}"):
        F.add_rms_norm(torch.ones(2, 4), torch.ones(2, 4).to_sparse())
    with raises(NotImplementedError, f"cos: {sparse}"):
        F.rope(x, c.to_sparse(), c)
    with raises(NotImplementedError, f"x: {sparse}"):
        F.rope(x.to_sparse(), c, c)
    with raises(NotImplementedError, f"target: {sparse}"):
        F.cross_entropy(torch.ones(2, 4), t.to_sparse())
    with raises(NotImplementedError, f"logits: {sparse}"):
        F.cross_entropy(torch.ones(2, 4).to_sparse(), t)
    with raises(NotImplementedError, f"hidden: {sparse}"):
        F.fused_linear_cross_entropy(torch.ones(2, 4).to_sparse(), torch.ones(5, 4), t)
    with raises(NotImplementedError, f"weight: {sparse}"):
        F.fused_linear_cross_entropy(torch.ones(2, 4), torch.ones(5, 4).to_sparse(), t)
    with raises(TypeError, "logits: expected a torch.Tensor, got NoneType"):
        F.cross_entropy(None, t)
    with raises(TypeError, "hidden: expected a torch.Tensor, got NoneType"):
        F.fused_linear_cross_entropy(None, torch.ones(5, 4), t)


def test_torch_huge_int_scalars(torch):
    """An int too large for a float is a ValueError naming the argument, not an OverflowError."""
    import fuselet.torch as F

    x, t, big = torch.ones(2, 4), torch.zeros(2, dtype=torch.long), 10**400
    for name, call in [
        ("eps", lambda: F.rms_norm(x, eps=big)),
        ("eps", lambda: F.layer_norm(x, eps=big)),
        ("eps", lambda: F.add_rms_norm(x, x, eps=big)),
        ("eps", lambda: F.RMSNorm(4, eps=big)(x)),
        ("eps", lambda: F.LayerNorm(4, eps=big)(x)),
        ("scale", lambda: F.softmax(x, scale=big)),
        ("scale", lambda: F.softmax(x, scale=-big)),
        ("z_loss", lambda: F.cross_entropy(x, t, z_loss=big)),
        ("softcap", lambda: F.cross_entropy(x, t, softcap=big)),
        ("grad_scale", lambda: F.cross_entropy.fwd_bwd(x, t, grad_scale=big)),
        ("z_loss", lambda: F.fused_linear_cross_entropy(x, torch.ones(5, 4), t, z_loss=big)),
    ]:
        with raises(ValueError, f"{name}: expected"):
            call()


def test_torch_op_direct_names_the_argument(torch):
    """None for a required tensor, and checks of one argument reported under its own name."""
    ops, x, w, r = torch.ops.fuselet, torch.ones(2, 4), torch.ones(4), torch.ones(2)
    with raises(raw_dtype_error(), "dy: expected a tensor, got None"):
        ops.rms_norm_bwd(None, x, w, r)
    with raises(raw_dtype_error(), "x: expected a tensor, got None"):
        ops.rms_norm_fwd(None, w, 1e-6)
    with raises(raw_dtype_error(), "rstd: expected a tensor, got None"):
        ops.layer_norm_bwd(x, x, w, w, r, None)
    with raises(raw_dtype_error(), "target: expected a tensor, got None"):
        ops.cross_entropy_fwd(x, None, -100, 0.0, 0.0, 0.0)
    with raises(raw_dtype_error(), "sin: expected a tensor, got None"):
        ops.rope_fwd(torch.ones(2, 3, 4, 8), torch.ones(3, 8), None)
    with raises(ValueError, "bias: expected"):
        ops.layer_norm_bwd(x, x, w, torch.ones(3), r, r)
    with raises(ValueError, "y: expected a tensor of shape [..., K], got a 0-d tensor"):
        ops.softmax_bwd(torch.ones(()), torch.ones(()))
    with raises(ValueError, "residual_out: expected a tensor of shape [..., H], got a 0-d tensor"):
        ops.add_rms_norm_bwd(torch.ones(()), torch.ones(()), torch.ones(()), None, torch.ones(()))
    with raises(ValueError, "dy: expected a tensor on cpu (the device of residual_out), got meta"):
        ops.add_rms_norm_bwd(x.to("meta"), x, x, w, r)


_NO_COPY_CHILD = r"""
import resource, torch, fuselet.torch as F
ops = torch.ops.fuselet
def big(*shape, dtype=torch.float32):  # no memory: every element is the one of torch.empty(1)
    return torch.empty(1, dtype=dtype).expand(*shape)
n = 2**24  # rows of 8 float32: a 512 MiB contiguous copy
calls = [
    lambda: F.rms_norm(big(2**31, dtype=torch.bfloat16)),  # H >= 2^31: refused by the core
    lambda: ops.rms_norm_fwd(big(2**31, dtype=torch.bfloat16), None, 1e-6),
    lambda: ops.rms_norm_fwd(big(n, 8), torch.ones(5), 1e-6),
    lambda: ops.layer_norm_fwd(big(n, 8), torch.ones(8), torch.ones(5), 1e-5),
    lambda: ops.layer_norm_bwd(big(n, 8), big(n, 8), None, torch.ones(3), big(n), big(n)),
    lambda: ops.add_rms_norm_fwd(big(n, 8), big(n, 4), None, 1e-6),
    lambda: ops.add_rms_norm_bwd(big(n, 8), big(n, 4), big(n, 8), None, big(n)),
    lambda: ops.swiglu_fwd(big(n, 7)),
    lambda: ops.geglu_bwd(big(n, 8), big(n, 8)),
    lambda: ops.clamped_swiglu_fwd(big(n, 8), 1.702, 0.0, True),
    lambda: ops.softmax_bwd(big(n, 4), big(n, 8)),
    lambda: ops.rope_fwd(big(2, n // 8, 4, 8), torch.ones(3, 8), torch.ones(3, 8)),
    lambda: ops.cross_entropy_fwd(big(n, 8), torch.zeros(3, dtype=torch.long), -100, 0.0, 0.0, 0.0),
    lambda: ops.cross_entropy_fwd_bwd(big(n, 8), torch.zeros(3, dtype=torch.long), -100, 0.0, 0.0, 0.0, 1.0),
    lambda: ops.cross_entropy_bwd(big(n), big(n, 8), big(n, dtype=torch.long), big(3), -100, 0.0, 0.0, 0.0),
]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for i, call in enumerate(calls):
    try:
        call()
        print("call", i, "was not refused")
    except (ValueError, TypeError):
        pass
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
    print("call", i, "grew", grown, "MiB")
"""


def test_torch_op_refuses_before_copying(torch):
    """A refused call costs no copy of its arguments: stride-0 views of 2^24..2^31 elements
    (no memory of their own) are refused before they are made contiguous."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_COPY_CHILD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    calls = _NO_COPY_CHILD.count("\n    lambda: ")
    assert len(lines) == calls and not any("not refused" in line for line in lines), out.stdout
    assert int(lines[-1].split()[-2]) < 100, out.stdout


_THREADS_CHILD = r"""
import torch, fuselet.torch as F
x = torch.randn(256, 1024)
torch.testing.assert_close(F.softmax(x), torch.softmax(x, -1))
from fuselet import _core
print(_core.load().fuselet_get_num_threads())
"""


def test_torch_thread_count_from_the_environment_is_bounded(torch):
    """FUSELET_NUM_THREADS beyond FUSELET_MAX_THREADS (1024) is clamped, with a warning: the
    kernels run and compute right (it hung, a half-built pool of ~900 threads unwinding)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "FUSELET_NUM_THREADS": "2147483647"}
    out = subprocess.run([sys.executable, "-c", _THREADS_CHILD], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1024"], out.stdout
    assert "FUSELET_NUM_THREADS=2147483647 is above the bound of 1024 threads; using 1024" in out.stderr, out.stderr
