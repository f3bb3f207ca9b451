"""The instruction set of the CPU kernels (fuselet_cpu_isa / fuselet_set_cpu_isa and the
FUSELET_CPU_ISA environment variable): every copy of the row kernels gives the same bits."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import CPU_ISAS, import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")


def core():
    from fuselet import _core

    lib = _core.load()
    lib.fuselet_set_cpu_isa.argtypes = [ctypes.c_char_p]
    return lib


def available() -> list[str]:
    lib = core()
    found = [isa for isa in CPU_ISAS if lib.fuselet_set_cpu_isa(isa.encode()) == 0]
    lib.fuselet_set_cpu_isa(None)
    return found


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("FUSELET_CPU_ISA", "FUSELET_CPU_BASELINE")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


def outputs(op: str, shape, dtype: str) -> list[np.ndarray]:
    """Forward and backward results of `op` on the inputs of ref.make_inputs, as raw bits."""
    a = ref.make_inputs(shape, dtype, seed=1)
    t = {k: torch.from_numpy(v.astype(np.float32)).to(getattr(torch, dtype)).requires_grad_(True) for k, v in a.items()}
    x, w, b, dy = t["x"], t["weight"], t["bias"], t["dy"].detach()
    if op == "rms_norm":
        y = ft.rms_norm(x, w, 1e-6)
    elif op == "layer_norm":
        y = ft.layer_norm(x, w, b, 1e-5)
    elif op == "add_rms_norm":
        y, h = ft.add_rms_norm(x, t["bias"].detach().expand_as(x).contiguous().requires_grad_(True), w, 1e-6)
        y = y + h
    elif op.startswith("gated_rms_norm"):  # the gate: the bias values broadcast over the rows; groups of half a row
        z = t["bias"].detach().expand_as(x).contiguous().requires_grad_(True)
        y = ft.gated_rms_norm(x, z, w, 1e-6, shape[-1] // 2, norm_before_gate=op == "gated_rms_norm")
        b = z
    elif op.startswith("rope"):  # x [1, S = rows, 1, H], tables [S, H - 2] in float32: partial rotary
        rng = np.random.default_rng(2)
        cos, sin = (torch.from_numpy(rng.uniform(-1, 1, (shape[0], shape[1] - 2)).astype(np.float32)) for _ in range(2))
        y = ft.rope(x.view(1, shape[0], 1, shape[1]), cos, sin, interleaved=op == "rope_interleaved").view(shape)
    elif op == "swiglu":
        y = ft.swiglu(x)
        dy = dy[..., : y.shape[-1]].contiguous()
    elif op == "clamped_swiglu":  # interleaved, a limit inside the inputs' spread
        y = ft.clamped_swiglu(x, limit=1.0, interleaved=True)
        dy = dy[..., : y.shape[-1]].contiguous()
    elif op == "cross_entropy":
        target = torch.from_numpy(np.random.default_rng(3).integers(0, shape[-1], shape[:-1]))
        target[::5] = -100
        opts = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 5.0}
        y = ft.cross_entropy(x, target, reduction="none", **opts)
        dy = dy[..., 0].contiguous().float()
        from fuselet.torch.cross_entropy import fwd_bwd

        fused = fwd_bwd(x.detach(), target, grad_scale=0.5, **opts)
    elif op == "logprobs":  # every output and the gradient of log_probs and entropy, soft-capped
        from fuselet.torch.cross_entropy import logprobs_chunk, logprobs_chunk_grad_

        target = torch.from_numpy(np.random.default_rng(3).integers(0, shape[-1], shape[:-1]))
        target[::5] = -100
        xd = x.detach()
        every = {"entropy", "log_sum_sq_probs", "mean_logits", "is_top1"}
        out = logprobs_chunk(xd, target, ignore_index=-100, softcap=5.0, outputs=every)
        g, h = dy[..., 0].contiguous().float(), dy[..., 1].contiguous().float()
        dx = logprobs_chunk_grad_(xd.clone(), target, out["lse"], out["entropy"], g, h, ignore_index=-100, softcap=5.0)
        values = [*(v.to(torch.float32) for v in out.values()), dx]
        return [v.contiguous().view(torch.int16 if v.dtype != torch.float32 else torch.int32).numpy().copy() for v in values]
    elif op == "divergence":  # the per-row losses of every kind (exp and log in the kernel), both gradients
        target = x.detach().flip(0).contiguous().requires_grad_(True)
        rows = [torch.ops.fuselet.divergence_fwd(x, target, kind, True, beta) for kind, beta in ((0, 0.0), (1, 0.3), (2, 0.0))]
        y = torch.stack(rows, -1)
        dy = dy[..., :3].contiguous().float()
        b = target
    elif op == "divergence_logits":  # the one pass over logits: every kind, a scale, the gradient in place
        target = x.detach().flip(0).contiguous()
        rows, grads_in_place = [], []
        for kind, beta, scale in ((0, 0.0, 1.0), (1, 0.3, 0.5), (2, 0.0, 2.0)):
            logits = x.detach().clone()
            rows.append(
                torch.ops.fuselet.divergence_logits_(logits, target, dy[..., 0].contiguous().float(), kind, True, beta, scale)
            )
            grads_in_place.append(logits)
        return [
            v.contiguous().view(torch.int16 if v.dtype != torch.float32 else torch.int32).numpy().copy()
            for v in (torch.stack(rows, -1), *grads_in_place)
        ]
    else:
        y = ft.softmax(x, 0.5, True)
    params = [v for v in (x, w, b) if v.requires_grad]
    grads = torch.autograd.grad(y, params, dy, allow_unused=True)
    if op == "cross_entropy":
        grads = (*grads, *fused)
    return [
        v.detach().contiguous().view(torch.int16 if v.dtype != torch.float32 else torch.int32).numpy().copy()
        for v in (y, *grads)
        if v is not None
    ]


@pytest.mark.parametrize("shape", [(5, 6), (8, 4098), (256, 4096)], ids=["5x6", "8x4098", "256x4096"])
@pytest.mark.parametrize(
    "op",
    [
        "rms_norm",
        "layer_norm",
        "add_rms_norm",
        "gated_rms_norm",
        "gated_rms_norm_gate_first",
        "swiglu",
        "clamped_swiglu",
        "softmax",
        "rope",
        "rope_interleaved",
        "cross_entropy",
        "logprobs",
        "divergence",
        "divergence_logits",
    ],
)
def test_bit_identical_across_isas(op, dtype, shape):
    """No FMA contraction and a fixed reduction order: every ISA gives the baseline's bits."""
    isas = available()
    if len(isas) < 2:
        pytest.skip(f"only {isas} on this CPU: nothing to compare")
    lib = core()
    results = {}
    try:
        for isa in isas:
            assert lib.fuselet_set_cpu_isa(isa.encode()) == 0
            results[isa] = outputs(op, shape, dtype)
    finally:
        lib.fuselet_set_cpu_isa(None)
    for isa in isas[1:]:
        for i, (base, other) in enumerate(zip(results["baseline"], results[isa], strict=True)):
            assert np.array_equal(base, other), f"{op} output {i}: {isa} differs from baseline"


def test_large_output_matches_reference(cpu_isa):
    """Outputs past the huge-page threshold (32 MiB: y, then dx) against the float64 reference."""
    a = ref.make_inputs((2048, 4096), "float32", seed=2)
    x, w, dy = (torch.from_numpy(a[k].astype(np.float32)) for k in ("x", "weight", "dy"))
    x.requires_grad_(True)
    y = ft.rms_norm(x, w, 1e-6)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    x64, w64 = a["x"].astype(np.float64), a["weight"].astype(np.float64)
    ref.assert_close(y.detach().double().numpy(), ref.rms_norm_fwd(x64, w64, 1e-6)[0], "float32", "out", name="y")
    ref.assert_close(
        dx.double().numpy(), ref.rms_norm_bwd(a["dy"].astype(np.float64), x64, w64, 1e-6)[0], "float32", "out", name="dx"
    )


def test_default_is_the_best_available():
    assert core().fuselet_cpu_isa().decode() == available()[-1]


def test_set_unknown_isa_names_the_values():
    lib = core()
    assert lib.fuselet_set_cpu_isa(b"sse9") == 1  # FUSELET_ERR_INVALID_ARGUMENT
    assert lib.fuselet_last_error().decode() == "isa: expected one of baseline, avx2, avx512, got 'sse9'"


def test_set_missing_isa_is_refused():
    missing = [isa for isa in CPU_ISAS if isa not in available()]
    if not missing:
        pytest.skip("this CPU has every ISA fuselet is built for")
    lib = core()
    assert lib.fuselet_set_cpu_isa(missing[0].encode()) == 2  # FUSELET_ERR_UNSUPPORTED
    assert f"this CPU lacks {missing[0]}" in lib.fuselet_last_error().decode()


CHECK = (
    "import fuselet, fuselet.torch as ft, torch\n"
    "print(fuselet.report()['core']['cpu_isa'])\n"
    "print(round(float(ft.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6).sum()), 3))\n"
)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"FUSELET_CPU_ISA": "baseline"}, "baseline"),
        ({"FUSELET_CPU_BASELINE": "1"}, "baseline"),
        ({"FUSELET_CPU_ISA": "avx2", "FUSELET_CPU_BASELINE": "1"}, "avx2"),
    ],
)
def test_environment_picks_a_lower_isa(env, expected):
    if expected not in available():
        pytest.skip(f"this CPU lacks {expected}")
    out = run_python(CHECK, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [expected, "16.0"]


def test_environment_clamps_a_missing_isa_with_a_warning():
    missing = [isa for isa in CPU_ISAS if isa not in available()]
    if not missing:
        pytest.skip("this CPU has every ISA fuselet is built for")
    out = run_python(CHECK, FUSELET_CPU_ISA=missing[0])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == available()[-1]
    assert f"FUSELET_CPU_ISA={missing[0]}: this CPU lacks {missing[0]}" in out.stderr


def test_environment_rejects_an_unknown_isa():
    out = run_python(CHECK, FUSELET_CPU_ISA="avx1024")
    message = "FUSELET_CPU_ISA: expected one of baseline, avx2, avx512, got 'avx1024'"
    assert out.returncode != 0
    assert out.stdout.splitlines()[0] == f"ERROR: {message}"
    assert message in out.stderr  # the op's exception
