"""fuselet.torch.fused_linear_logprobs against the float64 reference (tests/reference.py): every
output, the gradients of the log-probabilities and the entropy, in every dtype, with temperature,
logit scale, softcap, bias and ignored tokens, over chunk sizes; under torch.compile."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")

OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
OPTIONS = {
    "plain": {},
    "temperature-bias": {"temperature": 0.7, "bias": True},
    "all": {"temperature": 1.3, "logit_scale": 0.6, "softcap": 3.0, "bias": True, "ignore_index": 2},
}
# (rtol, atol) of the outputs and of the gradients, per dtype: float32 math over logits that the
# matmul rounds to the inputs' dtype (|s| ~ 5 here: 2^-8 of it in bfloat16, a few % of p and so of
# the dlogits, which are held in that dtype too)
TOL = {"float32": (1e-5, 1e-5, 1e-4, 1e-5), "float16": (5e-3, 5e-3, 2e-2, 2e-2), "bfloat16": (5e-2, 5e-2, 1e-1, 1e-1)}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def inputs(n=37, h=16, v=29, dtype="float32", bias=False, seed=0, device="cpu", lead=(2,)):
    rng = np.random.default_rng(seed)
    dt = getattr(torch, dtype)

    def t(*shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape) * scale).to(device=device, dtype=dt).requires_grad_(True)

    hidden, weight = t(*lead, n, h), t(v, h, scale=h**-0.5 * 3)
    b = t(v) if bias else None
    target = torch.from_numpy(rng.integers(0, v, (*lead, n))).to(device)
    target.view(-1)[::5] = (hidden.reshape(-1, h) @ weight.T).argmax(-1).view(-1)[::5]  # argmax hits: is_top1 both ways
    return hidden, weight, b, target


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("v", [29, 400], ids=["tall", "wide"])  # wide, chunk 7: the backward by blocks of classes
def test_against_reference(dtype, options, chunk, v, torch_device):
    kw = dict(OPTIONS[options])
    hidden, weight, bias, target = inputs(v=v, dtype=dtype, bias=kw.pop("bias", False), device=torch_device)
    got = ft.fused_linear_logprobs(hidden, weight, target, bias=bias, outputs=OUTPUTS, chunk_size=chunk, **kw)
    assert isinstance(got, ft.LogProbs) and got.is_top1.dtype == torch.bool
    g_logp, g_entropy = (torch.linspace(a, 1.5, target.numel(), device=torch_device).reshape(target.shape) for a in (-1.0, 0.5))
    (got.log_probs * g_logp + got.entropy * g_entropy).sum().backward()
    h = hidden.shape[-1]
    want, grads = ref.fused_linear_logprobs(
        f64(hidden).reshape(-1, h),
        f64(weight),
        None if bias is None else f64(bias),
        target.reshape(-1).cpu().numpy(),
        f64(g_logp).reshape(-1),
        f64(g_entropy).reshape(-1),
        **kw,
    )
    rtol, atol, grtol, gatol = TOL[dtype]
    for name in ("log_probs", *OUTPUTS):
        value = getattr(got, name)
        assert value.shape == target.shape and value.dtype == (torch.bool if name == "is_top1" else torch.float32), name
        if name == "is_top1":
            assert 0 < int(value.sum()) < target.numel(), "is_top1: all or none, which tests nothing"
            agree = f64(value).reshape(-1) == want[name]
            assert agree.mean() >= (1.0 if dtype == "float32" else 0.9), name  # low precision: near ties may flip
        else:
            np.testing.assert_allclose(f64(value).reshape(-1), want[name], rtol=rtol, atol=atol, err_msg=name)
    for name, t, expected in (("hidden", hidden, grads[0]), ("weight", weight, grads[1]), ("bias", bias, grads[2])):
        if t is not None:
            assert t.grad.dtype == t.dtype, name
            np.testing.assert_allclose(f64(t.grad).reshape(expected.shape), expected, rtol=grtol, atol=gatol, err_msg=f"d{name}")


def test_ignored_tokens_are_zero_and_get_no_gradient():
    hidden, weight, _, target = inputs(n=10, lead=())
    target[::3] = -100
    got = ft.fused_linear_logprobs(hidden, weight, target, outputs=OUTPUTS)
    for name in ("log_probs", *OUTPUTS):
        assert not getattr(got, name)[::3].any(), name
    (got.log_probs.sum() + got.entropy.sum()).backward()
    assert not hidden.grad[::3].any() and hidden.grad[1].any()


def test_only_the_outputs_asked_for():
    hidden, weight, _, target = inputs(n=10, lead=())
    got = ft.fused_linear_logprobs(hidden, weight, target)
    assert got.entropy is None and got.is_top1 is None and got.log_probs.requires_grad
    got = ft.fused_linear_logprobs(hidden, weight, target, outputs=("mean_logits", "is_top1"))
    assert got.entropy is None and not got.mean_logits.requires_grad and got.is_top1 is not None


def test_entropy_alone_has_a_gradient():
    """A loss of the entropy alone (an entropy bonus) reaches hidden and weight."""
    hidden, weight, _, target = inputs(n=10, lead=())
    got = ft.fused_linear_logprobs(hidden, weight, target, outputs=("entropy",))
    got.entropy.sum().backward()
    want = ref.fused_linear_logprobs(f64(hidden), f64(weight), None, target.numpy(), None, np.ones(10))[1]
    np.testing.assert_allclose(f64(hidden.grad), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(f64(weight.grad), want[1], rtol=1e-4, atol=1e-5)


def test_compile_fullgraph():
    hidden, weight, bias, target = inputs(bias=True)
    kw = {"bias": bias, "temperature": 0.8, "softcap": 4.0, "outputs": ("entropy", "is_top1")}
    compiled = torch.compile(lambda h, w, t: ft.fused_linear_logprobs(h, w, t, **kw), fullgraph=True)
    got, want = compiled(hidden, weight, target), ft.fused_linear_logprobs(hidden, weight, target, **kw)
    torch.testing.assert_close(got.log_probs, want.log_probs)
    torch.testing.assert_close(got.entropy, want.entropy)
    assert torch.equal(got.is_top1, want.is_top1)
    (g,) = torch.autograd.grad(got.entropy.sum(), hidden)
    (w,) = torch.autograd.grad(want.entropy.sum(), hidden)
    torch.testing.assert_close(g, w)
