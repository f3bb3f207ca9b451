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


# --- the per-token form: fused_linear_jsd_per_token ----------------------------------------------

PER_TOKEN_OPTIONS = {
    "plain": {},
    "temperature": {"temperature": 0.7},
    "scales": {"temperature": 1.3, "student_logit_scale": 0.5, "teacher_logit_scale": 2.0},
    "softcaps": {"student_softcap": 3.0, "teacher_softcap": 5.0, "temperature": 0.9},
    "biases": {"bias": True},
    "all": {"bias": True, "temperature": 0.8, "student_logit_scale": 1.5, "student_softcap": 4.0, "teacher_softcap": 2.5},
}


def per_token_unfused(hs, ws, ht, wt, bs, bt, beta, options: dict):
    """Each token's divergence and the student's entropy over the materialized logits (float64 where
    the inputs are), as TRL's ChunkedDivergenceFunction defines them: z = softcap(logit_scale *
    (h @ w.T + b)) / temperature per model."""
    temperature = options.get("temperature", 1.0)

    def log_probs(h, w, b, model):
        y = (h @ w.T + (0 if b is None else b)) * options.get(f"{model}_logit_scale", 1.0)
        cap = options.get(f"{model}_softcap")
        y = y if cap is None else cap * torch.tanh(y / cap)
        return (y / temperature).log_softmax(-1)

    s, t = log_probs(hs, ws, bs, "student"), log_probs(ht, wt, bt, "teacher")
    if beta == 0.0:
        rows = (t.exp() * (t - s)).sum(-1)
    elif beta == 1.0:
        rows = (s.exp() * (s - t)).sum(-1)
    else:
        m = torch.logaddexp(s + math.log(1 - beta), t + math.log(beta))
        rows = (beta * t.exp() * (t - m) + (1 - beta) * s.exp() * (s - m)).sum(-1)
    return rows, -(s.exp() * s).sum(-1)


def per_token_models(b=3, s=11, hs=16, ht=24, v=50, dtype=torch.float32, seed=0, bias=False):
    student, ws, teacher, wt, _ = models(b, s, hs, ht, v, dtype, seed)
    g = torch.Generator().manual_seed(seed + 100)
    bs = (torch.randn(v, generator=g)).to(dtype).requires_grad_(True) if bias else None
    bt = (torch.randn(v, generator=g)).to(dtype) if bias else None
    return student, ws, teacher, wt, bs, bt


def _per_token_kwargs(options):
    return {k: v for k, v in options.items() if k != "bias"}


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("case", list(PER_TOKEN_OPTIONS))
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_per_token_matches_unfused(beta, case, chunk_size):
    """float32 inputs against the same values in float64: every token's divergence and entropy, and
    the gradients of a weighted sum of the divergences to the student's hidden, weight and bias."""
    options = PER_TOKEN_OPTIONS[case]
    hs, ws, ht, wt, bs, bt = per_token_models(bias=options.get("bias", False))
    got = ft.fused_linear_jsd_per_token(
        hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=beta, with_entropy=True, chunk_size=chunk_size,
        **_per_token_kwargs(options),
    )  # fmt: skip
    params = [p for p in (hs, ws, bs) if p is not None]
    params64 = [p.detach().double().requires_grad_(True) for p in params]
    hs64, ws64, bs64 = (*params64, None)[:3]
    want, entropy = per_token_unfused(
        hs64, ws64, ht.double(), wt.double(), bs64, None if bt is None else bt.double(), beta, options
    )
    assert got.divergence.shape == got.entropy.shape == hs.shape[:-1] and got.divergence.dtype == torch.float32
    torch.testing.assert_close(got.divergence.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.entropy.double(), entropy.detach(), rtol=1e-5, atol=1e-6)
    assert not got.entropy.requires_grad
    weights = torch.randn(hs.shape[:-1], generator=torch.Generator().manual_seed(7))
    g = torch.autograd.grad((got.divergence * weights).sum(), params)
    w = torch.autograd.grad((want * weights.double()).sum(), params64)
    for a, b in zip(g, w):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_per_token_mean_is_fused_linear_jsd(beta):
    """The mean of the per-token divergences is fused_linear_jsd's loss, and so are its gradients."""
    hs, ws, ht, wt, _ = models(seed=3)
    per = ft.fused_linear_jsd_per_token(hs, ws, ht, wt, beta=beta, temperature=1.5, chunk_size=7)
    assert per.entropy is None
    mean = ft.fused_linear_jsd(hs, ws, ht, wt, beta=beta, temperature=1.5, chunk_size=7)
    torch.testing.assert_close(per.divergence.mean(), mean, rtol=1e-6, atol=1e-7)
    for a, b in zip(torch.autograd.grad(per.divergence.mean(), (hs, ws)), torch.autograd.grad(mean, (hs, ws))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)], ids=["bf16", "bf16-f32"])
def test_per_token_lower_precision(dtypes):
    """bfloat16 (and a float32 teacher beside a bfloat16 student): each head's logits in its dtype, the
    kernels' math in float32; against float64 within bfloat16's rounding. The gradients keep the
    student's dtype."""
    hs, ws, _, _, bs, _ = per_token_models(dtype=dtypes[0], seed=1, bias=True)
    _, _, ht, wt, _, bt = per_token_models(dtype=dtypes[1], seed=1, bias=True)
    options = {"temperature": 0.8, "student_softcap": 4.0, "teacher_logit_scale": 1.5}
    got = ft.fused_linear_jsd_per_token(
        hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=0.5, with_entropy=True, chunk_size=5, **options
    )
    student64 = [t.detach().double().requires_grad_(True) for t in (hs, ws, bs)]
    want, entropy = per_token_unfused(*student64[:2], ht.double(), wt.double(), student64[2], bt.double(), 0.5, options)
    torch.testing.assert_close(got.divergence.double(), want.detach(), rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(got.entropy.double(), entropy.detach(), rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(got.divergence.sum(), (hs, ws, bs))
    wants = torch.autograd.grad(want.sum(), student64)
    for a, b in zip(grads, wants):
        assert a.dtype == dtypes[0]
        torch.testing.assert_close(a.double(), b, rtol=5e-2, atol=5e-3)


def test_per_token_saves_its_inputs_alone_and_the_teacher_gets_no_gradient():
    """The backward keeps the six inputs and nothing of [tokens, V]; the teacher's hidden, weight and
    bias get no gradient."""
    hs, ws, ht, wt, bs, bt = per_token_models(v=512, bias=True)
    for t in (ht, wt, bt):
        t.requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        got = ft.fused_linear_jsd_per_token(
            hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, student_softcap=3.0, with_entropy=True, chunk_size=4
        )
    assert sorted(saved) == sorted(tuple(t.shape) for t in (hs.flatten(0, 1), ws, bs, ht.flatten(0, 1), wt, bt))
    (got.divergence.sum() + got.entropy.sum()).backward()
    assert all(t.grad is None for t in (ht, wt, bt)) and all(t.grad is not None for t in (hs, ws, bs))


def test_per_token_no_tokens():
    hs, ws, ht, wt, _, _ = per_token_models()
    hs, ht = hs.detach()[:, :0].requires_grad_(True), ht[:, :0]
    got = ft.fused_linear_jsd_per_token(hs, ws, ht, wt, with_entropy=True)
    assert got.divergence.shape == got.entropy.shape == (3, 0)
    got.divergence.sum().backward()
    assert hs.grad.shape == hs.shape and torch.equal(ws.grad, torch.zeros_like(ws))


def test_per_token_torch_compile_fullgraph():
    hs, ws, ht, wt, bs, bt = per_token_models(bias=True)

    def step(fn):
        h = hs.detach().clone().requires_grad_(True)
        divergence, entropy = fn(h)
        (divergence * 2.0).sum().backward()
        return divergence.detach(), entropy, h.grad

    def loss_fn(h):
        return ft.fused_linear_jsd_per_token(
            h, ws.detach(), ht, wt, student_bias=bs.detach(), teacher_bias=bt, beta=0.3, student_softcap=3.0,
            with_entropy=True, chunk_size=8,
        )  # fmt: skip

    eager = step(loss_fn)
    torch._dynamo.reset()
    compiled = step(torch.compile(loss_fn, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
