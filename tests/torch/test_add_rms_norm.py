"""fuselet.torch residual add + RMSNorm against the float64 reference (tests/reference.py)."""

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
    """x, residual, weight, dy, dresidual_out of `shape` in `dtype`."""
    a = ref.make_inputs(shape, dtype, seed)
    b = ref.make_inputs(shape, dtype, seed + 1)
    values = {"x": a["x"], "residual": b["x"], "weight": a["weight"], "dy": a["dy"], "dresidual_out": b["dy"]}

    def to(v, grad):
        t = torch.from_numpy(v.astype(np.float32)).to(device=device, dtype=getattr(torch, dtype))
        return t.requires_grad_(grad)

    return {k: to(v, requires_grad and k in ("x", "residual", "weight")) for k, v in values.items()}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def check(t, y, h, dtype, weight=True, zc=False):
    w = f64(t["weight"]) if weight else None
    expected_y, expected_h, _ = ref.add_rms_norm_fwd(f64(t["x"]), f64(t["residual"]), w, EPS, dtype, zc)
    assert y.dtype == h.dtype == t["x"].dtype and y.shape == h.shape == t["x"].shape
    ref.assert_close(f64(h), expected_h, dtype, "out", name="residual_out")
    ref.assert_close(f64(y), expected_y, dtype, "out", name="y")
    (y.float() * t["dy"].float()).sum().add((h.float() * t["dresidual_out"].float()).sum()).backward()
    dx, dw = ref.add_rms_norm_bwd(f64(t["dy"]), f64(t["dresidual_out"]), expected_h, w, EPS, zc)
    for name in ("x", "residual"):
        assert t[name].grad.dtype == t[name].dtype
        ref.assert_close(f64(t[name].grad), dx, dtype, "out", name=f"d{name}")
    if weight:
        ref.assert_close(f64(t["weight"].grad), dw, dtype, "reduce", rows=ref.rows_of(t["x"].shape), name="dweight")


def test_forward_backward(dtype, shape, torch_device):
    t = tensors(shape, dtype, torch_device, requires_grad=True)
    y, h = ft.add_rms_norm(t["x"], t["residual"], t["weight"], EPS)
    check(t, y, h, dtype)


@pytest.mark.parametrize("zc", [False, True])
def test_no_weight_and_zero_centered(zc):
    t = tensors((5, 127), "bfloat16", requires_grad=True)
    weight = t["weight"] if zc else None
    y, h = ft.add_rms_norm(t["x"], t["residual"], weight, EPS, zero_centered_gamma=zc)
    check(t, y, h, "bfloat16", weight=zc, zc=zc)


def test_float32_weight_with_bfloat16_x():
    t = tensors((6, 64), "bfloat16", requires_grad=True)
    t["weight"] = t["weight"].detach().float().requires_grad_(True)
    y, h = ft.add_rms_norm(t["x"], t["residual"], t["weight"], EPS)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and t["weight"].grad.dtype == torch.float32


def test_only_y_used():
    """residual_out unused downstream: its cotangent is None and counts as zeros."""
    t = tensors((4, 32), "float32", requires_grad=True)
    y, _ = ft.add_rms_norm(t["x"], t["residual"], t["weight"], EPS)
    y.backward(t["dy"])
    h = f64(t["x"]) + f64(t["residual"])
    dx, _ = ref.add_rms_norm_bwd(f64(t["dy"]), np.zeros_like(h), h, f64(t["weight"]), EPS)
    ref.assert_close(f64(t["x"].grad), dx, "float32", "out", name="dx")


def test_non_contiguous():
    t = tensors((16, 24), "float32", requires_grad=True)
    x = torch.stack([t["x"], t["x"]], dim=-1).reshape(16, 48)[:, ::2]  # t["x"], last stride 2
    residual = t["residual"].t().contiguous().t()
    assert not x.is_contiguous()
    y, h = ft.add_rms_norm(x, residual, t["weight"], EPS)
    ref.assert_close(f64(h), f64(t["x"]) + f64(t["residual"]), "float32", "out", name="residual_out")
    y.sum().backward()
    assert t["x"].grad.shape == (16, 24) and t["residual"].grad.shape == (16, 24)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(dtype, shape):
    t = tensors(shape, dtype, requires_grad=True)
    y, h = ft.add_rms_norm(t["x"], t["residual"], t["weight"], EPS)
    assert y.shape == h.shape == t["x"].shape
    (y.sum() + h.sum()).backward()
    assert torch.equal(t["weight"].grad, torch.zeros_like(t["weight"]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", ["add_rms_norm_fwd", "add_rms_norm_bwd"])
def test_opcheck(op, dtype):
    t = tensors((2, 3, 8), dtype)
    _, h, rstd = ops.add_rms_norm_fwd(t["x"], t["residual"], t["weight"], EPS)
    grad = {k: t[k].detach().clone().requires_grad_(True) for k in ("x", "residual", "weight")}
    args = {
        "add_rms_norm_fwd": (grad["x"], grad["residual"], grad["weight"], EPS, False),
        "add_rms_norm_bwd": (t["dy"], t["dresidual_out"], h, t["weight"], rstd, False),
    }[op]
    torch.library.opcheck(getattr(ops, op).default, args)


def test_torch_compile_fullgraph():
    """A pre-norm residual block compiled with fullgraph=True matches eager, gradients included."""
    torch.manual_seed(0)
    lin, w = torch.nn.Linear(32, 32), torch.nn.Parameter(1 + 0.1 * torch.randn(32))
    x0, r0 = torch.randn(4, 5, 32), torch.randn(4, 5, 32)

    def block(x, r):
        y, h = ft.add_rms_norm(x, r, w, EPS)
        return h + lin(y)

    def step(fn):
        x, r = x0.clone().requires_grad_(True), r0.clone().requires_grad_(True)
        w.grad = None
        out = fn(x, r)
        (out * out).sum().backward()
        return out.detach(), x.grad, r.grad, w.grad.clone()

    eager = step(block)
    torch._dynamo.reset()
    compiled = step(torch.compile(block, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
