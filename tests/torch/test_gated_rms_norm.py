"""fuselet.torch gated RMSNorm against the float64 reference (tests/reference.py): both gate
orders, groups, no weight, zero-centered gamma, opcheck, torch.compile, DTensor-free module use."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
ops = torch.ops.fuselet
EPS = 1e-6


def tensors(shape, dtype, device="cpu", seed=0, requires_grad=False) -> dict:
    """x, z, weight, dy of `shape` in `dtype`."""
    a, b = ref.make_inputs(shape, dtype, seed), ref.make_inputs(shape, dtype, seed + 1)
    values = {"x": a["x"], "z": b["x"], "weight": a["weight"], "dy": a["dy"]}

    def to(v, grad):
        t = torch.from_numpy(v.astype(np.float32)).to(device=device, dtype=getattr(torch, dtype))
        return t.requires_grad_(grad)

    return {k: to(v, requires_grad and k in ("x", "z", "weight")) for k, v in values.items()}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def group_of(shape):
    """A group size that divides the last dim (the last dim itself when it is odd)."""
    return shape[-1] // 2 if shape[-1] % 2 == 0 and shape[-1] > 1 else None


def check(t, y, dtype, group_size, norm_before_gate, weight=True, zc=False):
    w = f64(t["weight"]) if weight else None
    args = (EPS, group_size, norm_before_gate, zc)
    expected, _ = ref.gated_rms_norm_fwd(f64(t["x"]), f64(t["z"]), w, *args)
    assert y.dtype == t["x"].dtype and y.shape == t["x"].shape
    ref.assert_close(f64(y), expected, dtype, "out", name="y")
    (y.float() * t["dy"].float()).sum().backward()
    dx, dz, dw = ref.gated_rms_norm_bwd(f64(t["dy"]), f64(t["x"]), f64(t["z"]), w, *args)
    ref.assert_close(f64(t["x"].grad), dx, dtype, "out", name="dx")
    ref.assert_close(f64(t["z"].grad), dz, dtype, "out", name="dz")
    if weight:
        ref.assert_close(f64(t["weight"].grad), dw, dtype, "reduce", rows=ref.rows_of(t["x"].shape), name="dweight")


@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_then_gate", "gate_first"])
def test_forward_backward(dtype, shape, torch_device, norm_before_gate):
    t = tensors(shape, dtype, torch_device, requires_grad=True)
    group_size = group_of(shape)
    y = ft.gated_rms_norm(t["x"], t["z"], t["weight"], EPS, group_size, norm_before_gate)
    check(t, y, dtype, group_size, norm_before_gate)


@pytest.mark.parametrize("zc", [False, True])
@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_no_weight_and_zero_centered(zc, norm_before_gate):
    t = tensors((5, 64), "bfloat16", requires_grad=True)
    weight = t["weight"] if zc else None
    y = ft.gated_rms_norm(t["x"], t["z"], weight, EPS, 16, norm_before_gate, zero_centered_gamma=zc)
    check(t, y, "bfloat16", 16, norm_before_gate, weight=zc, zc=zc)


def test_group_of_one_element_and_of_the_row():
    """group_size=1 normalizes each element alone; group_size=H is group_size=None."""
    t = tensors((3, 8), "float32")
    whole = ft.gated_rms_norm(t["x"], t["z"], t["weight"], EPS, None)
    assert torch.equal(ft.gated_rms_norm(t["x"], t["z"], t["weight"], EPS, 8), whole)
    single = ft.gated_rms_norm(t["x"], t["z"], None, EPS, 1)
    expected = t["x"] / (t["x"].square() + EPS).sqrt() * torch.nn.functional.silu(t["z"])
    torch.testing.assert_close(single, expected)


def test_float32_weight_with_bfloat16_x():
    t = tensors((6, 64), "bfloat16", requires_grad=True)
    t["weight"] = t["weight"].detach().float().requires_grad_(True)
    y = ft.gated_rms_norm(t["x"], t["z"], t["weight"], EPS, 32)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and t["weight"].grad.dtype == torch.float32


def test_non_contiguous():
    t = tensors((16, 24), "float32", requires_grad=True)
    x = torch.stack([t["x"], t["x"]], dim=-1).reshape(16, 48)[:, ::2]  # t["x"], last stride 2
    z = t["z"].t().contiguous().t()
    y = ft.gated_rms_norm(x, z, t["weight"], EPS, 8)
    expected, _ = ref.gated_rms_norm_fwd(f64(t["x"]), f64(t["z"]), f64(t["weight"]), EPS, 8)
    ref.assert_close(f64(y), expected, "float32", "out", name="y")
    y.sum().backward()
    assert t["x"].grad.shape == (16, 24) and t["z"].grad.shape == (16, 24)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 128)], ids=["0x8", "2x0x128"])
def test_empty_batch(dtype, shape):
    t = tensors(shape, dtype, requires_grad=True)
    y = ft.gated_rms_norm(t["x"], t["z"], t["weight"], EPS, 4)
    assert y.shape == t["x"].shape
    y.sum().backward()
    assert torch.equal(t["weight"].grad, torch.zeros_like(t["weight"]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", ["gated_rms_norm_fwd", "gated_rms_norm_bwd"])
@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_opcheck(op, dtype, norm_before_gate):
    t = tensors((2, 3, 8), dtype)
    _, rstd = ops.gated_rms_norm_fwd(t["x"], t["z"], t["weight"], EPS, 4, norm_before_gate)
    assert rstd.shape == (2, 3, 2) and rstd.dtype == torch.float32
    grad = {k: t[k].detach().clone().requires_grad_(True) for k in ("x", "z", "weight")}
    args = {
        "gated_rms_norm_fwd": (grad["x"], grad["z"], grad["weight"], EPS, 4, norm_before_gate, False),
        "gated_rms_norm_bwd": (t["dy"], t["x"], t["z"], t["weight"], rstd, 4, norm_before_gate, False),
    }[op]
    torch.library.opcheck(getattr(ops, op).default, args)


def test_torch_compile_fullgraph():
    """Qwen3-Next's gated attention output (norm per head, gated by z) compiled with
    fullgraph=True matches eager, gradients included."""
    torch.manual_seed(0)
    norm = ft.GatedRMSNorm(64, group_size=16)
    proj = torch.nn.Linear(64, 64)
    x0, z0 = torch.randn(2, 5, 64), torch.randn(2, 5, 64)

    def block(x, z):
        return proj(norm(x, z)).square().mean()

    compiled = torch.compile(block, fullgraph=True)
    grads = []
    for fn in (block, compiled):
        x, z = x0.clone().requires_grad_(True), z0.clone().requires_grad_(True)
        loss = fn(x, z)
        loss.backward()
        grads.append((loss.detach(), x.grad, z.grad, norm.weight.grad.clone()))
        norm.weight.grad = None
    for eager, comp in zip(*grads):
        torch.testing.assert_close(comp, eager, rtol=1e-5, atol=1e-6)


def test_module_matches_transformers_form():
    """GatedRMSNorm(norm_before_gate=False) is Mamba2's MambaRMSNormGated, written in torch."""
    torch.manual_seed(1)
    x, z = torch.randn(3, 32), torch.randn(3, 32)
    module = ft.GatedRMSNorm(32, eps=1e-5, group_size=8, norm_before_gate=False)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    h = (x * torch.nn.functional.silu(z)).view(3, 4, 8)
    expected = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).view(3, 32) * module.weight
    torch.testing.assert_close(module(x, z), expected)
    assert "group_size=8, norm_before_gate=False" in repr(module)
