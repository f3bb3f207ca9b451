"""fuselet.torch fused_linear_jsd against the unfused loss (both heads' logits materialized,
log_softmax, torch's own math of the generalized JSD)."""

from __future__ import annotations

import math

import pytest

from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
F = torch.nn.functional


def unfused(hs, ws, ht, wt, labels, beta, temperature, dtype=torch.float32):
    """TRL's generalized JSD over the materialized logits (computed in `dtype`), the mean over kept tokens."""
    s = (hs @ ws.T).to(dtype).div(temperature).log_softmax(-1).flatten(0, -2)
    t = (ht @ wt.T).to(dtype).div(temperature).log_softmax(-1).flatten(0, -2)
    if beta == 0.0:
        per = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1.0:
        per = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        mix = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
        per = beta * F.kl_div(mix, t, reduction="none", log_target=True) + (1 - beta) * F.kl_div(
            mix, s, reduction="none", log_target=True
        )
    rows = per.sum(-1)
    if labels is None:
        return rows.mean()
    keep = labels.flatten() != -100
    return rows[keep].sum() / keep.sum().clamp(min=1)


def models(b=3, s=11, hs=16, ht=24, v=50, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(b, s, hs, generator=g).to(dtype).requires_grad_(True)
    ws = (torch.randn(v, hs, generator=g) * 0.3).to(dtype).requires_grad_(True)
    teacher = torch.randn(b, s, ht, generator=g).to(dtype)
    wt = (torch.randn(v, ht, generator=g) * 0.3).to(dtype)
    labels = torch.randint(0, v, (b, s), generator=g)
    labels[0, :4] = -100
    return student, ws, teacher, wt, labels


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("chunk_size", [None, 4, 7, 1000])
def test_matches_unfused(beta, temperature, chunk_size):
    """float32 inputs against the unfused loss of the same values in float64."""
    hs, ws, ht, wt, labels = models()
    got = ft.fused_linear_jsd(hs, ws, ht, wt, labels, beta=beta, temperature=temperature, chunk_size=chunk_size)
    hs64, ws64 = (a.detach().double().requires_grad_(True) for a in (hs, ws))
    want = unfused(hs64, ws64, ht.double(), wt.double(), labels, beta, temperature, dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    g = torch.autograd.grad(got * 3.0, (hs, ws))
    w = torch.autograd.grad(want * 3.0, (hs64, ws64))
    for a, b in zip(g, w):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6)


def test_without_labels_and_bfloat16():
    hs, ws, ht, wt, _ = models(dtype=torch.bfloat16, seed=1)
    got = ft.fused_linear_jsd(hs, ws, ht, wt, beta=0.5, chunk_size=5)
    want = unfused(hs, ws, ht, wt, None, 0.5, 1.0)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
    (gh,) = torch.autograd.grad(got, hs)
    (wh,) = torch.autograd.grad(want, hs)
    assert gh.dtype == torch.bfloat16
    torch.testing.assert_close(gh.float(), wh.float(), rtol=5e-2, atol=5e-4)


def test_teacher_gets_no_gradient_and_no_logits_are_kept():
    """Only the student's two gradients are saved for the backward (nothing of [tokens, V])."""
    hs, ws, ht, wt, labels = models(v=512)
    ht.requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        loss = ft.fused_linear_jsd(hs, ws, ht, wt, labels, chunk_size=4)
    assert sorted(saved) == sorted([tuple(hs.flatten(0, 1).shape), tuple(ws.shape)])
    loss.backward()
    assert ht.grad is None and hs.grad is not None and ws.grad is not None


def test_all_tokens_ignored():
    hs, ws, ht, wt, labels = models()
    labels.fill_(-100)
    loss = ft.fused_linear_jsd(hs, ws, ht, wt, labels)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.equal(hs.grad, torch.zeros_like(hs))


def test_module_form():
    hs, ws, ht, wt, labels = models()
    loss = ft.FusedLinearJSD(beta=0.3, temperature=2.0)(hs, ws, ht, wt, labels)
    torch.testing.assert_close(loss, unfused(hs, ws, ht, wt, labels, 0.3, 2.0), rtol=1e-5, atol=1e-6)


def test_torch_compile_fullgraph():
    hs, ws, ht, wt, labels = models()

    def step(fn):
        h = hs.detach().clone().requires_grad_(True)
        loss = fn(h)
        loss.backward()
        return loss.detach(), h.grad

    def loss_fn(h):
        return ft.fused_linear_jsd(h, ws.detach(), ht, wt, labels, beta=0.3, chunk_size=8)

    eager = step(loss_fn)
    torch._dynamo.reset()
    compiled = step(torch.compile(loss_fn, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
