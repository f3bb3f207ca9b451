"""fuselet.torch softmax against the float64 reference (tests/reference.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
ops = torch.ops.fuselet

# x [..., Q, K] shapes for the causal mask: Q == K, Q < K (a KV cache), Q > K (rows fully masked).
CAUSAL_SHAPES = [(4, 4), (3, 7), (7, 3), (2, 3, 5, 127), (2, 130, 129), (1, 4097)]


def tensors(shape, dtype, device="cpu", seed=0) -> dict:
    a = ref.make_inputs(shape, dtype, seed)

    def to(v):
        return torch.from_numpy(v.astype(np.float32)).to(device=device, dtype=getattr(torch, dtype))

    return {"x": to(a["x"]).requires_grad_(True), "dy": to(a["dy"])}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def check(x, dy, dtype, scale, causal):
    y = ft.softmax(x, scale, causal)
    assert y.dtype == x.dtype and y.shape == x.shape
    expected = ref.softmax_fwd(f64(x), scale, causal)
    ref.assert_close(f64(y), expected, dtype, "out", name="y")
    y.backward(dy)
    assert x.grad.dtype == x.dtype and not torch.isnan(x.grad).any()
    # The gradient of the op as computed: from its own (rounded) output.
    ref.assert_close(f64(x.grad), ref.softmax_bwd(f64(dy), f64(y), scale), dtype, "out", name="dx")
    ref.assert_close(f64(x.grad), ref.softmax_bwd(f64(dy), expected, scale), dtype, "out", name="dx vs exact y")


@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_forward_backward(dtype, shape, scale, torch_device):
    t = tensors(shape, dtype, torch_device)
    check(t["x"], t["dy"], dtype, scale, False)


@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_causal(dtype, shape, torch_device):
    t = tensors(shape, dtype, torch_device)
    check(t["x"], t["dy"], dtype, 0.3, True)


def test_fully_masked_rows_are_zero():
    x = torch.randn(5, 2, requires_grad=True)
    y = ft.softmax(x, causal=True)  # query i sees keys j <= i - 3: rows 0..2 see none
    assert torch.equal(y[:3], torch.zeros(3, 2)) and torch.allclose(y[3:].sum(-1), torch.ones(2))
    y.sum().backward()
    assert torch.equal(x.grad[:3], torch.zeros(3, 2))


def test_large_values_and_negative_scale():
    x = torch.tensor([[1000.0, 999.0, -1000.0], [-50.0, -60.0, -70.0]], requires_grad=True)
    check(x, torch.ones(2, 3), "float32", -2.0, False)
    check(x.detach().requires_grad_(True), torch.ones(2, 3), "float32", 30.0, False)


@pytest.mark.parametrize("view", ["transposed", "every_other_row", "strided_last"])
def test_non_contiguous(view):
    base = tensors((12, 16), "float32")["x"].detach()
    x = {
        "strided_last": lambda a: torch.stack([a, a], -1).reshape(12, 32)[:, ::2],
        "every_other_row": lambda a: torch.cat([a, a], 1).reshape(24, 16)[::2],
        "transposed": lambda a: a.t().contiguous().t(),
    }[view](base)
    assert not x.is_contiguous() and torch.equal(x, base)
    check(x.detach().requires_grad_(True), torch.randn(12, 16), "float32", 0.5, True)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(dtype, shape):
    t = tensors(shape, dtype)
    y = ft.softmax(t["x"], causal=len(shape) > 1)
    assert y.shape == shape
    y.backward(t["dy"])
    assert t["x"].grad.shape == shape


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_opcheck(dtype):
    t = tensors((2, 3, 5, 8), dtype)
    x = t["x"].detach()
    y = ops.softmax_fwd(x, 0.5, True)
    for op, args in [
        (ops.softmax_fwd, (x.clone().requires_grad_(True), 0.5, True)),
        (ops.softmax_fwd, (x.clone().requires_grad_(True), 1.0, False)),
        (ops.softmax_bwd, (t["dy"], y, 0.5)),
    ]:
        torch.library.opcheck(op.default, args)


def test_torch_compile_fullgraph():
    """Causal attention with fuselet's softmax compiled with fullgraph=True matches eager."""
    torch.manual_seed(0)
    q0, k0, v0 = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)

    def attention(q, k, v):
        return ft.softmax(q @ k.transpose(-1, -2), scale=8**-0.5, causal=True) @ v

    def step(fn):
        q = q0.clone().requires_grad_(True)
        out = fn(q, k0, v0)
        (out * out).sum().backward()
        return out.detach(), q.grad

    eager = step(attention)
    torch._dynamo.reset()
    compiled = step(torch.compile(attention, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    reference = torch.nn.functional.scaled_dot_product_attention(q0, k0, v0, attn_mask=torch.from_numpy(ref.causal_mask(5, 7)))
    torch.testing.assert_close(eager[0], reference, rtol=1e-5, atol=1e-5)
