"""ONNX export of fuselet ops (python/fuselet/torch/onnx.py): modules exported with the dynamo
exporter (translations()) and the TorchScript one (register_torchscript()), checked with
onnx.checker and run in onnxruntime at shapes other than the traced ones, against eager."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
onnx = pytest.importorskip("onnx", reason="onnx is not installed in this environment")
pytest.importorskip("onnxscript", reason="onnxscript is not installed in this environment")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed in this environment")
ft = import_layer("torch")
ops = torch.ops.fuselet
fonnx = pytest.importorskip("fuselet.torch.onnx")

H, V = 16, 24


def _param(*shape, seed=0, low=-1.0, high=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.rand(*shape, generator=g) * (high - low) + low)


class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = _param(H, low=0.5, high=1.5), _param(H, seed=1)

    def forward(self, x, residual):
        y, residual_out = ft.add_rms_norm(x, residual, self.w, eps=1e-5)
        return (
            ft.rms_norm(x, self.w),
            ft.rms_norm(x),
            ft.rms_norm(x, self.b, zero_centered_gamma=True),
            ft.layer_norm(x, self.w, self.b),
            ft.layer_norm(x),
            ft.layer_norm(x, self.b, zero_centered_gamma=True),
            y,
            residual_out,
            ft.gated_rms_norm(x, residual, self.w, group_size=4),
            ft.gated_rms_norm(x, residual, self.b, eps=1e-5, norm_before_gate=False, zero_centered_gamma=True),
            ft.gated_rms_norm(x, residual),
        )


class Glu(torch.nn.Module):
    def forward(self, x):
        clamped = (ft.clamped_swiglu(x, limit=0.5), ft.clamped_swiglu(x, alpha=1.0, limit=0.5, interleaved=True))
        return ft.swiglu(x), ft.geglu(x), ft.geglu(x, approximate="tanh"), *clamped


class Softmax(torch.nn.Module):
    def forward(self, x, wide, tall):
        """tall [..., Q > K]: its first Q - K rows are fully masked (zeros)."""
        return ft.softmax(x), ft.softmax(wide, scale=0.3, causal=True), ft.softmax(tall, causal=True)


class Rope(torch.nn.Module):
    def forward(self, x, cos, sin, cos_b, sin_b):
        """x [B, S, N, D]; cos / sin [S, R < D]; cos_b / sin_b [B, S, D]."""
        xt = x.transpose(1, 2)  # [B, N, S, D]
        return (
            ft.rope(x, cos, sin),
            ft.rope(x, cos, sin, interleaved=True),
            ft.rope(xt, cos_b, sin_b, layout="bhsd"),
            ft.rope(xt, cos, sin, layout="bhsd", interleaved=True),
            ft.rope(x, cos[..., :4], sin[..., :4], interleaved=True, pair_table=True),
            ft.rope(x, cos_b[..., :6], sin_b[..., :6], pair_table=True),
            ft.rope(xt, torch.stack((cos_b, sin_b)), torch.stack((sin_b, cos_b)), layout="bhsd", sections=(3, 5)),
            ft.rope(
                x,
                torch.stack((cos, sin, cos))[..., :6],
                torch.stack((sin, cos, sin))[..., :6],
                interleaved=True,
                pair_table=True,
                sections=(2, 2, 2),
                interleaved_sections=True,
            ),
        )


class CrossEntropy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head, self.bias = _param(V, H, seed=2), _param(V, seed=3)

    def forward(self, logits, target, hidden):
        return (
            ft.cross_entropy(logits, target, reduction="none"),
            ft.cross_entropy(
                logits, target.clamp(min=0).int(), ignore_index=3, label_smoothing=0.1, z_loss=1e-2, softcap=4.0, reduction="none"
            ),
            ft.cross_entropy(logits, target),  # the mean over the non-ignored tokens, in torch ops
            ft.fused_linear_cross_entropy(hidden, self.head, target, bias=self.bias, label_smoothing=0.2, reduction="none"),
            ft.fused_linear_cross_entropy(hidden, self.head, target, z_loss=1e-2, softcap=3.0),
            ft.fused_linear_cross_entropy(hidden, self.head, target, bias=self.bias, reduction="sum"),
        )


class LogProbs(torch.nn.Module):
    """fused_linear_logprobs: every output (is_top1 as a float to compare), with and without the
    options; the raw logprobs_fwd of its chunks on the materialized logits."""

    def __init__(self):
        super().__init__()
        self.head, self.bias = _param(V, H, seed=2), _param(V, seed=3)

    def forward(self, hidden, target):
        outputs = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
        plain = ft.fused_linear_logprobs(hidden, self.head, target, outputs=outputs)
        tempered = ft.fused_linear_logprobs(
            hidden, self.head, target, bias=self.bias, temperature=0.7, softcap=4.0, outputs=("entropy",)
        )
        raw = ops.logprobs_fwd(hidden @ self.head.t(), target.clamp(min=0), 3, 2.0, True, True)  # the kernels' op
        return (*plain[:4], plain.is_top1.float(), tempered.log_probs, tempered.entropy, *raw)


class Divergence(torch.nn.Module):
    """Distillation losses of student and teacher logits: every kind, reduced in torch ops."""

    def forward(self, student, teacher):
        s, t = student.log_softmax(-1), teacher.log_softmax(-1)
        return (
            ft.kl_div(s, t, log_target=True),
            ft.kl_div(s, t.exp(), reduction="sum"),
            ft.jsd(s, t, beta=0.3),
            ft.jsd(s, t, beta=0.0),
            ft.jsd(s, t, beta=1.0),
            ft.tvd(s, t),
        )


class Gradients(torch.nn.Module):
    """The ops that return gradients with the loss: all their outputs."""

    def __init__(self):
        super().__init__()
        self.head, self.bias = _param(V, H, seed=2), _param(V, seed=3)

    def forward(self, logits, target, hidden):
        flat, t = hidden.flatten(0, 1), target.flatten()
        return (
            *ft.cross_entropy.fwd_bwd(logits, target, label_smoothing=0.1, z_loss=1e-2, softcap=4.0, grad_scale=0.5),
            *ops.fused_linear_cross_entropy_reduced(flat, self.head, self.bias, t, -100, 0.1, 1e-2, 4.0, True, 4),
            *ops.fused_linear_cross_entropy_reduced(flat, self.head, None, t, -100, 0.0, 0.0, 0.0, False, 4),
        )


def _target(b, s, seed):
    t = torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))
    t[0, 0] = -100  # ignored
    t[-1, -1] = 3  # ignored where ignore_index=3
    return t


def _tables(*shape, seed):
    angles = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) * 6.0
    return angles.cos(), angles.sin()


# case -> (module, inputs(batch, seq, seed), dims: per input {dim: name} (dynamic batch "b" / sequence "s"))
CASES = {
    "norms": (Norms, lambda b, s, seed: (torch.randn(b, s, H) * 2 + 0.5, torch.randn(b, s, H)), [{0: "b", 1: "s"}] * 2),
    "glu": (Glu, lambda b, s, seed: (torch.randn(b, s, 2 * H) * 2,), [{0: "b", 1: "s"}]),
    "softmax": (
        Softmax,
        lambda b, s, seed: (torch.randn(b, s, V) * 3, torch.randn(b, 2, s, s + 3) * 3, torch.randn(b, s + 3, s) * 3),
        [{0: "b", 1: "s"}, {0: "b", 2: "s", 3: "s3"}, {0: "b", 1: "s3", 2: "s"}],
    ),
    "rope": (
        Rope,
        lambda b, s, seed: (torch.randn(b, s, 2, H), *_tables(s, H - 4, seed=seed), *_tables(b, s, H, seed=seed + 1)),
        [{0: "b", 1: "s"}, {0: "s"}, {0: "s"}, {0: "b", 1: "s"}, {0: "b", 1: "s"}],
    ),
    "cross_entropy": (
        CrossEntropy,
        lambda b, s, seed: (torch.randn(b, s, V) * 3, _target(b, s, seed), torch.randn(b, s, H)),
        [{0: "b", 1: "s"}] * 3,
    ),
    "logprobs": (
        LogProbs,
        lambda b, s, seed: (torch.randn(b, s, H), _target(b, s, seed)),
        [{0: "b", 1: "s"}] * 2,
    ),
    "divergence": (
        Divergence,
        lambda b, s, seed: (torch.randn(b, s, V) * 2, torch.randn(b, s, V) * 2),
        [{0: "b", 1: "s"}] * 2,
    ),
    "gradients": (
        Gradients,
        lambda b, s, seed: (torch.randn(b, s, V) * 3, _target(b, s, seed), torch.randn(b, s, H)),
        [{0: "b", 1: "s"}] * 3,
    ),
}
TRACED, RUN = (2, 3), (3, 5)  # (batch, seq) exported with, and run with


def _inputs(case, shape, seed, dtype=torch.float32):
    torch.manual_seed(seed)
    return tuple(a.to(dtype) if a.is_floating_point() else a for a in CASES[case][1](*shape, seed))


def _module(case, dtype=torch.float32):
    return CASES[case][0]().eval().to(dtype)


def export_dynamo(case, opset, dtype=torch.float32):
    _, _, dims = CASES[case]
    names = {}
    dynamic = tuple(
        {d: names.setdefault(n, torch.export.Dim(n, min=2) if n != "s3" else 3 + names["s"]) for d, n in spec.items()}
        for spec in dims
    )
    program = torch.onnx.export(
        _module(case, dtype),
        _inputs(case, TRACED, 0, dtype),
        dynamo=True,
        opset_version=opset,
        dynamic_shapes=dynamic,
        custom_translation_table=fonnx.translations(opset),
    )
    return program.model_proto


def export_torchscript(case, opset):
    _, _, dims = CASES[case]
    fonnx.register_torchscript()
    names = [f"in{i}" for i in range(len(dims))]
    f = io.BytesIO()
    torch.onnx.export(
        _module(case),
        _inputs(case, TRACED, 0),
        f,
        dynamo=False,
        opset_version=opset,
        input_names=names,
        dynamic_axes={n: {d: v for d, v in spec.items()} for n, spec in zip(names, dims)},
    )
    return onnx.load_from_string(f.getvalue())


def run(model, args):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    return session.run(None, feeds)


def check_against_eager(case, model, dtype=torch.float32):
    """float32: within float32 rounding of eager; float16: one float16 ulp (tests/reference.py's
    "out" tolerance; eager's float16 matmuls round where the graph's do, not always alike)."""
    onnx.checker.check_model(model, full_check=True)
    args = _inputs(case, RUN, 1, dtype)
    got = run(model, args)
    with torch.no_grad():
        expected = _module(case, dtype)(*args)
    assert len(got) == len(expected)
    rtol, atol = (1e-5, 2e-5) if dtype == torch.float32 else ref.tolerance("float16", "out")
    for i, (g, e) in enumerate(zip(got, expected)):
        e = e.numpy()
        assert g.shape == e.shape and g.dtype == e.dtype, (case, i)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"{case} output {i}")


def op_types(model) -> set:
    return {n.op_type for n in model.graph.node}


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("case,opset", [(c, 23) for c in CASES] + [("norms", 18), ("glu", 18), ("glu", 20)])
def test_dynamo_export_matches_eager(case, opset):
    model = export_dynamo(case, opset)
    assert not any(n.domain.startswith("fuselet") or n.op_type.startswith("fuselet") for n in model.graph.node)
    check_against_eager(case, model)
    if case == "norms":  # RMSNormalization from opset 23 on; LayerNormalization in every opset
        assert ("RMSNormalization" in op_types(model)) == (opset >= 23)
        assert "LayerNormalization" in op_types(model)
    if case == "glu":
        assert ("Gelu" in op_types(model)) == (opset >= 20)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("case", ["norms", "glu", "softmax", "rope", "cross_entropy"])
def test_dynamo_export_float16(case):
    """float16 in, float16 out (float32 inside, as the ops): the Casts are in the graph."""
    model = export_dynamo(case, 23, torch.float16)
    assert "Cast" in op_types(model)
    check_against_eager(case, model, torch.float16)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("case", CASES)
def test_torchscript_export_matches_eager(case):
    check_against_eager(case, export_torchscript(case, 20))


def test_every_fuselet_op_is_in_the_table():
    """A new op without a translation (or a stated reason) fails here, not in a user's export."""
    registered = {n.removeprefix("fuselet::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("fuselet::")}
    table = fonnx.translations()
    assert {op.name().removeprefix("fuselet::") for op in table} == registered


class SoftmaxGradient(torch.nn.Module):
    def forward(self, dy, y):
        return ops.softmax_bwd(dy, y, 0.5)


def test_op_without_translation_says_why():
    with pytest.raises(Exception, match="fuselet::softmax_bwd has no ONNX translation: a backward op"):
        torch.onnx.export(
            SoftmaxGradient(), (torch.randn(4, V), torch.rand(4, V)), dynamo=True, custom_translation_table=fonnx.translations()
        )


@pytest.mark.parametrize("opset", [17, "23", True])
def test_bad_opset_version(opset):
    for register in (fonnx.translations, fonnx.register_torchscript):
        with pytest.raises(ValueError, match=r"opset_version: expected an int >= 18"):
            register(opset)


KEPT_ENV = ("PYTHONPATH", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")


def test_importing_fuselet_torch_needs_no_onnx():
    code = "import sys, fuselet.torch, fuselet.torch.onnx; print(sorted({'onnx', 'onnxscript'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        # a bare environment, but for what brought fuselet (PYTHONPATH) and what a sanitized
        # build needs to load at all (the preloaded runtime and where its reports go)
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k in KEPT_ENV}},
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
