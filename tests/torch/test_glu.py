"""fuselet.torch SwiGLU / GeGLU / clamped SwiGLU against the float64 reference (tests/reference.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
ops = torch.ops.fuselet

# name -> (call, reference activation, the reference's options)
CLAMPED = {"alpha": 1.702, "limit": 1.5}  # a limit inside the inputs' spread: both sides of each clamp
GLUS = {
    "swiglu": (lambda x: ft.swiglu(x), "silu", {}),
    "geglu": (lambda x: ft.geglu(x), "gelu", {}),
    "geglu_tanh": (lambda x: ft.geglu(x, approximate="tanh"), "gelu_tanh", {}),
    "clamped_swiglu": (lambda x: ft.clamped_swiglu(x, **CLAMPED), "silu_clamped", CLAMPED),
    "clamped_swiglu_interleaved": (
        lambda x: ft.clamped_swiglu(x, **CLAMPED, interleaved=True),
        "silu_clamped",
        {**CLAMPED, "interleaved": True},
    ),
    "clamped_swiglu_gpt_oss": (lambda x: ft.clamped_swiglu(x), "silu_clamped", {}),  # alpha 1.702, limit 7
}


@pytest.fixture(params=GLUS)
def glu(request):
    return GLUS[request.param]


def tensors(shape, dtype, device="cpu", seed=0) -> dict:
    """x [..., 2F] (F = shape[-1]) and dy [..., F] in `dtype`."""
    a = ref.make_inputs((*shape[:-1], 2 * shape[-1]), dtype, seed)
    b = ref.make_inputs(shape, dtype, seed + 1)

    def to(v):
        return torch.from_numpy(v.astype(np.float32)).to(device=device, dtype=getattr(torch, dtype))

    return {"x": to(a["x"]).requires_grad_(True), "dy": to(b["dy"])}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def check(glu, x, dy, dtype):
    call, kind, options = glu
    y = call(x)
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], x.shape[-1] // 2)
    ref.assert_close(f64(y), ref.glu_fwd(f64(x), kind, **options), dtype, "out", name="y")
    y.backward(dy)
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
    ref.assert_close(f64(x.grad), ref.glu_bwd(f64(dy), f64(x), kind, **options), dtype, "out", name="dx")


def test_forward_backward(glu, dtype, shape, torch_device):
    t = tensors(shape, dtype, torch_device)
    check(glu, t["x"], t["dy"], dtype)


def test_large_and_tiny_gates(glu):
    """Gates far out in both tails (the activations saturate) stay finite and accurate."""
    g = torch.tensor([-80.0, -30.0, -8.0, -1e-3, 0.0, 1e-3, 8.0, 30.0, 80.0])
    x = torch.cat([g, torch.linspace(-2, 2, 9)]).requires_grad_(True)
    check(glu, x, torch.ones(9), "float32")


@pytest.mark.parametrize("view", ["strided_last", "every_other_row", "transposed"])
def test_non_contiguous(glu, view):
    t = tensors((16, 12), "float32")
    base = t["x"].detach()
    x = {
        "strided_last": lambda a: torch.stack([a, a], -1).reshape(16, 48)[:, ::2],
        "every_other_row": lambda a: torch.cat([a, a], 1).reshape(32, 24)[::2],
        "transposed": lambda a: a.t().contiguous().t(),
    }[view](base)
    assert not x.is_contiguous() and torch.equal(x, base)
    check(glu, x.detach().requires_grad_(True), t["dy"], "float32")


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(glu, dtype, shape):
    t = tensors(shape, dtype)
    y = glu[0](t["x"])
    assert y.shape == shape
    y.backward(t["dy"])
    assert t["x"].grad.shape == t["x"].shape


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_opcheck(dtype):
    t = tensors((2, 3, 8), dtype)
    x, dy = t["x"].detach(), t["dy"]
    cases = [
        (ops.swiglu_fwd, (x.clone().requires_grad_(True),)),
        (ops.swiglu_bwd, (dy, x)),
        (ops.geglu_fwd, (x.clone().requires_grad_(True), "none")),
        (ops.geglu_fwd, (x, "tanh")),
        (ops.geglu_bwd, (dy, x, "tanh")),
        (ops.clamped_swiglu_fwd, (x.clone().requires_grad_(True), 1.702, 1.5, True)),
        (ops.clamped_swiglu_bwd, (dy, x, 1.702, 1.5, False)),
    ]
    for op, args in cases:
        torch.library.opcheck(op.default, args)


def test_torch_compile_fullgraph():
    """An MLP block with SwiGLU and GeGLU compiled with fullgraph=True matches eager."""
    torch.manual_seed(0)
    up, down = torch.nn.Linear(16, 64), torch.nn.Linear(32, 16)
    x0 = torch.randn(4, 5, 16)

    def mlp(x):
        h = up(x)
        return down(ft.swiglu(h)) + down(ft.geglu(h, approximate="tanh")) + down(ft.clamped_swiglu(h, interleaved=True))

    def step(fn):
        x = x0.clone().requires_grad_(True)
        out = fn(x)
        (out * out).sum().backward()
        return out.detach(), x.grad

    eager = step(mlp)
    torch._dynamo.reset()
    compiled = step(torch.compile(mlp, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_clamped_swiglu_is_gpt_oss_gate():
    """ft.clamped_swiglu(interleaved=True) is transformers' GptOssExperts._apply_gate, values and
    gradients, gates and ups beyond the clamps included."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss", reason="transformers is not installed")
    config = gpt_oss.GptOssConfig(hidden_size=8, intermediate_size=16, num_local_experts=2)
    experts = gpt_oss.GptOssExperts(config)
    torch.manual_seed(0)
    x0 = 6.0 * torch.randn(5, 32)
    assert (x0 > config.swiglu_limit).any() and (x0 < -config.swiglu_limit).any()
    dy = torch.randn(5, 16)
    x1, x2 = x0.clone().requires_grad_(True), x0.clone().requires_grad_(True)
    want = experts._apply_gate(x1)
    got = ft.clamped_swiglu(x2, alpha=config.swiglu_alpha, limit=config.swiglu_limit, interleaved=True)
    want.backward(dy)
    got.backward(dy)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-6, atol=1e-6)
