"""Bad input that crosses the op families: more dimensions than the kernels take, a torch.Tensor
given to the JAX layer, and in torch the raw ops' fake impls and tracing, mixed devices,
layouts other than strided, huge int scalars, arguments named in the raw ops' errors, no copy
before a refusal, and the thread count from the environment."""

from __future__ import annotations

import contextlib
import re

import pytest

from tests.bad_input.conftest import Api, raises
from tests.conftest import import_layer

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


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


JAX_OPS = {  # op -> (call with its arrays, the arrays by name)
    "rms_norm": (lambda fj, a: fj.rms_norm(a["x"], a["weight"]), {"x": (2, 4), "weight": (4,)}),
    "add_rms_norm": (lambda fj, a: fj.add_rms_norm(a["x"], a["residual"]), {"x": (2, 4), "residual": (2, 4)}),
    "gated_rms_norm": (lambda fj, a: fj.gated_rms_norm(a["x"], a["z"], a["weight"]), {"x": (2, 4), "z": (2, 4), "weight": (4,)}),
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
    "fused_linear_logprobs": (
        lambda fj, a: fj.fused_linear_logprobs(a["hidden"], a["weight"], a["target"], outputs=("entropy",)),
        {"hidden": (2, 4), "weight": (3, 4), "target": (2,)},
    ),
    "fused_linear_jsd": (
        lambda fj, a: fj.fused_linear_jsd(a["student_hidden"], a["student_weight"], a["teacher_hidden"], a["teacher_weight"]),
        {"student_hidden": (2, 4), "student_weight": (5, 4), "teacher_hidden": (2, 3), "teacher_weight": (5, 3)},
    ),
    "fused_linear_jsd_per_token": (
        lambda fj, a: fj.fused_linear_jsd_per_token(
            a["student_hidden"],
            a["student_weight"],
            a["teacher_hidden"],
            a["teacher_weight"],
            student_bias=a["student_bias"],
            teacher_bias=a["teacher_bias"],
        ),
        {
            "student_hidden": (2, 4),
            "student_weight": (5, 4),
            "teacher_hidden": (2, 3),
            "teacher_weight": (5, 3),
            "student_bias": (5,),
            "teacher_bias": (5,),
        },
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
    optional = (
        " or None"
        if (op, argument) in (("rms_norm", "weight"), ("gated_rms_norm", "weight"), ("jsd", "labels"))
        or argument.endswith("_bias")
        else ""
    )
    with raises(TypeError, f"{argument}: expected a jax.Array{optional}, got torch.Tensor"):
        call(fj, arrays)


# --- torch only -----------------------------------------------------------------------------


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
        (ValueError, "z: expected 2 rows of 4", "gated_rms_norm_fwd", (x, f(2, 3), w, 1e-6)),
        (ValueError, "group_size: expected 0 (the whole row) or a divisor of 4", "gated_rms_norm_fwd", (x, x, w, 1e-6, 3)),
        (ValueError, "rstd: expected 4 elements", "gated_rms_norm_bwd", (x, x, x, w, r, 2)),
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
        (ValueError, "softcap: expected", "logprobs_fwd", (x, t2, -100, -1.0, True, True)),
        (ValueError, "target: expected", "logprobs_fwd", (x, t3, -100, 0.0, False, False)),
        (ValueError, "dlogp: expected 2 elements", "logprobs_bwd_", (x, t2, r, None, f(3), None, -100, 0.0)),
        (ValueError, "entropy: expected a tensor (the forward's", "logprobs_bwd_", (x, t2, r, None, None, r, -100, 0.0)),
        (ValueError, "kind: expected", "divergence_fwd", (x, x, 3, True, 0.0)),
        (ValueError, "log_target: expected", "divergence_fwd", (x, x, 2, False, 0.0)),
        (ValueError, "beta: expected", "divergence_fwd", (x, x, 1, True, 2.0)),
        (ValueError, "target: expected 2 rows of 4 elements", "divergence_fwd", (x, f(2, 3), 0, True, 0.0)),
        (ValueError, "dloss: expected", "divergence_bwd", (f(3), x, x, 0, True, 0.0, True)),
        (ValueError, "scale: expected a finite number > 0", "divergence_logits_", (x, x, r, 1, True, 0.5, 0.0)),
        (ValueError, "log_target: expected", "divergence_logits_", (x, x, r, 0, False, 0.0, 1.0)),
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
        (ValueError, "outputs: expected flags in [0, 15]", "fused_linear_logprobs_fwd", (x, f(5, 4), None, t2, -100, 0.0, 99, 0)),
        (ValueError, "softcap: expected", "fused_linear_logprobs_fwd", (x, f(5, 4), None, t2, -100, -1.0, 0, 0)),
        (
            ValueError,
            "entropy: expected shape [2]",
            "fused_linear_logprobs_bwd",
            (None, r, x, f(5, 4), None, t2, r, f(3), -100, 0.0, 1, 0),
        ),
    ]


def _on(torch, device, args):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def test_torch_op_direct_fake_impls_check(torch):
    """The fake impls (meta tensors, torch.compile's tracing) refuse what the ops refuse."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for exc, message, op, args in _bad_op_calls(torch):
        with raises(exc, message):
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
        ("z", "x", "gated_rms_norm_fwd", (x, x, w, 1e-6)),
        ("rstd", "x", "gated_rms_norm_bwd", (x, x, x, w, r)),
        ("dy", "x", "swiglu_bwd", (f(2, 2), x)),
        ("dy", "x", "geglu_bwd", (f(2, 2), x, "none")),
        ("dy", "x", "clamped_swiglu_bwd", (f(2, 2), x, 1.702, 7.0, True)),
        ("dy", "y", "softmax_bwd", (x, x, 1.0)),
        ("sin", "x", "rope_fwd", (q, c, c)),
        ("cos", "dy", "rope_bwd", (q, c, c)),
        ("target", "logits", "cross_entropy_fwd", (x, t, -100, 0.0, 0.0, 0.0)),
        ("target", "logits", "logprobs_fwd", (x, t, -100, 0.0, True, True)),
        ("lse", "logits", "logprobs_bwd_", (x, t, r, r, r, r, -100, 0.0)),
        ("dentropy", "logits", "logprobs_bwd_", (x, t, r, r, None, r, -100, 0.0)),
        ("target", "input", "divergence_fwd", (x, x, 0, True, 0.0)),
        ("dloss", "input", "divergence_bwd", (r, x, x, 1, True, 0.5, False)),
        ("dloss", "input", "divergence_logits_", (x, x, r, 1, True, 0.5, 1.0)),
        ("lse", "logits", "cross_entropy_bwd", (r, x, t, r, -100, 0.0, 0.0, 0.0)),
        ("dloss", "logits", "cross_entropy_bwd_", (r, x, t, r, -100, 0.0, 0.0, 0.0)),
        ("target", "logits", "cross_entropy_fwd_bwd", (x, t, -100, 0.0, 0.0, 0.0, 1.0)),
        ("target", "logits", "cross_entropy_fwd_bwd_", (x, t, -100, 0.0, 0.0, 0.0, 1.0)),
        ("weight", "hidden", "fused_linear_cross_entropy_none", (x, f(5, 4), None, t, -100, 0.0, 0.0, 0.0, 0)),
        ("dloss", "hidden", "fused_linear_cross_entropy_none_bwd", (r, x, f(5, 4), None, t, r, -100, 0.0, 0.0, 0.0, 0)),
        ("weight", "hidden", "fused_linear_logprobs_fwd", (x, f(5, 4), None, t, -100, 0.0, 1, 0)),
        ("entropy", "hidden", "fused_linear_logprobs_bwd", (r, r, x, f(5, 4), None, t, r, r, -100, 0.0, 1, 0)),
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


def test_torch_op_direct_refusals_however_reached(torch):
    """A raw op's refusal is its Python exception with the message alone, however the op is
    reached: through autograd or not (torch.inference_mode), by its packet or its overload, a
    forward op (a Python autograd kernel above it) or a backward one. The stable build's kernels
    can throw only standard C++ exceptions, whose Python type each torch chooses (RuntimeError
    from torch 2.15 on): python/fuselet/torch/_errors.py raises the one they name."""
    ops, x = torch.ops.fuselet, torch.ones(2, 4)
    calls = [
        (
            ValueError,
            "weight: expected shape [4] to match the last dimension of x [2, 4], got [5]",
            ops.rms_norm_fwd,
            (x, torch.ones(5), 1e-6),
        ),
        (TypeError, "x: expected dtype float32, float16 or bfloat16, got float64", ops.rms_norm_fwd, (x.double(), None, 1e-6)),
        (
            ValueError,
            "y: expected shape [..., K] with at least 1 dimension, got a 0-d array",
            ops.softmax_bwd,
            (torch.ones(()), torch.ones(())),
        ),
        (TypeError, "dy: expected a tensor, got None", ops.rms_norm_bwd, (None, x, None, torch.ones(2))),
    ]
    for exc, message, packet, args in calls:
        for op in (packet, packet.default):
            for mode in (contextlib.nullcontext, torch.inference_mode):
                with mode(), pytest.raises(exc) as info:
                    op(*args)
                assert str(info.value) == message, (op, mode)


def test_torch_op_direct_names_the_argument(torch):
    """None for a required tensor, and checks of one argument reported under its own name."""
    ops, x, w, r = torch.ops.fuselet, torch.ones(2, 4), torch.ones(4), torch.ones(2)
    with raises(TypeError, "dy: expected a tensor, got None"):
        ops.rms_norm_bwd(None, x, w, r)
    with raises(TypeError, "x: expected a tensor, got None"):
        ops.rms_norm_fwd(None, w, 1e-6)
    with raises(TypeError, "rstd: expected a tensor, got None"):
        ops.layer_norm_bwd(x, x, w, w, r, None)
    with raises(TypeError, "target: expected a tensor, got None"):
        ops.cross_entropy_fwd(x, None, -100, 0.0, 0.0, 0.0)
    with raises(TypeError, "sin: expected a tensor, got None"):
        ops.rope_fwd(torch.ones(2, 3, 4, 8), torch.ones(3, 8), None)
    with raises(ValueError, "bias: expected"):
        ops.layer_norm_bwd(x, x, w, torch.ones(3), r, r)
    with raises(ValueError, "y: expected shape [..., K] with at least 1 dimension, got a 0-d array"):
        ops.softmax_bwd(torch.ones(()), torch.ones(()))
    with raises(ValueError, "residual_out: expected shape [..., H] with at least 1 dimension, got a 0-d array"):
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
