"""fused_linear_preference_loss, fused_linear_kto_loss and fused_linear_grpo_loss against the
same losses written the unfused way (the [tokens, V] logits, log_softmax and TRL's formulas in torch), in float32 and
bfloat16; gradients, torch.compile(fullgraph=True), the module forms, bad input."""

from __future__ import annotations

import math

import pytest

from tests.conftest import import_layer

torch = pytest.importorskip("torch")
ft = import_layer("torch")
F = torch.nn.functional

B, T, H, V = 2, 7, 16, 40


def inputs(dtype=torch.float32, seed=0, sequences=2 * B, h=H):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(sequences, T, h, generator=g) * 0.5).to(dtype).requires_grad_()
    weight = (torch.randn(V, h, generator=g) * 0.3).to(dtype).requires_grad_()
    target = torch.randint(0, V, (sequences, T), generator=g)
    target[:, :2] = -100  # the prompt
    target[1, -1] = -100  # padding
    return hidden, weight, target


def token_logps(hidden, weight, target, bias=None):
    """log p(target) per token the unfused way: the logits, log_softmax, gather; 0 where ignored."""
    logits = F.linear(hidden.float(), weight.float(), None if bias is None else bias.float())
    logp = logits.log_softmax(-1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    return logp * (target != -100)


def reference_preference(hidden, weight, target, loss, ref=None, beta=0.1, gamma=0.5, alpha=1.0, label_smoothing=0.0):
    """TRL's formulas (DPOTrainer's sigmoid / hinge / ipo, CPOTrainer's simpo / cpo, ORPOTrainer)."""
    mask = (target != -100).float()
    logp = token_logps(hidden, weight, target)
    average = loss in ("ipo", "simpo", "orpo")

    def seq(lp):
        s = lp.sum(-1)
        return s / mask.sum(-1) if average else s

    c, r = seq(logp).chunk(2)
    if ref is not None:
        with torch.no_grad():
            rc, rr = seq(token_logps(*ref, target)).chunk(2)
    else:
        rc = rr = torch.zeros(())
    logits = (c - r) - (rc - rr)
    if loss == "dpo":
        return (-F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing).mean()
    if loss == "hinge":
        return torch.relu(1 - beta * logits).mean()
    if loss == "ipo":
        return ((logits - 1 / (2 * beta)) ** 2).mean()
    if loss == "simpo":
        z = beta * (c - r) - gamma
        return (-F.logsigmoid(z) * (1 - label_smoothing) - F.logsigmoid(-z) * label_smoothing).mean()
    nll = -(logp.chunk(2)[0]).sum() / mask.chunk(2)[0].sum()
    if loss == "cpo":
        return (-F.logsigmoid(beta * (c - r))).mean() + alpha * nll
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    return nll - beta * F.logsigmoid(log_odds).mean()


def reference_dpo(
    hidden,
    weight,
    target,
    loss_types,
    ref=None,
    beta=0.1,
    label_smoothing=0.0,
    loss_weights=None,
    ld_alpha=None,
    f_divergence_type="reverse_kl",
    f_alpha_divergence_coef=0.5,
    discopop_tau=0.05,
):
    """TRL 1.16's DPOTrainer._compute_loss, its loss types and options, over the unfused per-token
    log-probabilities (its completion mask: target's); ref None: the reference's log-probs are 0."""
    mask = (target != -100).float()
    per_token_logps = token_logps(hidden, weight, target)
    if ref is not None:
        with torch.no_grad():
            ref_per_token_logps = token_logps(*ref, target)
    else:
        ref_per_token_logps = torch.zeros_like(per_token_logps)
    if ld_alpha is None:
        logps, ref_logps = per_token_logps.sum(1), ref_per_token_logps.sum(1)
    else:
        comp_pos = mask.cumsum(dim=1)
        chosen_lens, rejected_lens = mask.sum(dim=1).chunk(2)
        shared_lens = torch.minimum(chosen_lens, rejected_lens).repeat(2)
        shared_mask = (comp_pos > 0) & (comp_pos <= shared_lens.unsqueeze(1))
        tail_mask = comp_pos > shared_lens.unsqueeze(1)
        logps = (per_token_logps * shared_mask).sum(1) + ld_alpha * (per_token_logps * tail_mask).sum(1)
        ref_logps = (ref_per_token_logps * shared_mask).sum(1) + ld_alpha * (ref_per_token_logps * tail_mask).sum(1)
    chosen_logps, rejected_logps = logps.chunk(2)
    ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2)
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    if f_divergence_type == "forward_kl":
        f = lambda u: 1 - torch.exp(-u)  # noqa: E731
    elif f_divergence_type == "js_divergence":
        f = lambda u: math.log(2) + F.logsigmoid(u)  # noqa: E731
    elif f_divergence_type == "alpha_divergence" and abs(f_alpha_divergence_coef - 1.0) >= 1e-6:
        a = f_alpha_divergence_coef
        f = lambda u: (torch.exp(torch.clamp((a - 1.0) * u, max=80.0)) - 1.0) / (a - 1.0)  # noqa: E731
    else:
        f = lambda u: u  # noqa: E731
    chosen_scores, rejected_scores = f(chosen_logratios), f(rejected_logratios)
    delta_score = chosen_scores - rejected_scores
    chosen_mask, rejected_mask = mask.chunk(2)
    avg_delta = chosen_scores / chosen_mask.sum(1).clamp(min=1.0) - rejected_scores / rejected_mask.sum(1).clamp(min=1.0)
    e, cr, rr = label_smoothing, beta * chosen_logratios, beta * rejected_logratios

    def smoothed(delta):
        return -F.logsigmoid(beta * delta) * (1 - e) - F.logsigmoid(-beta * delta) * e

    losses = {
        "dpo": lambda: smoothed(delta_score),
        "sigmoid": lambda: -F.logsigmoid(beta * delta_score),
        "hinge": lambda: torch.relu(1 - beta * delta_score),
        "ipo": lambda: (avg_delta - 1 / (2 * beta)) ** 2,
        "exo_pair": lambda: (
            torch.sigmoid(beta * delta_score) * (F.logsigmoid(beta * delta_score) - math.log1p(-e))
            + torch.sigmoid(-beta * delta_score) * (F.logsigmoid(-beta * delta_score) - math.log(e))
        ),
        "nca_pair": lambda: -F.logsigmoid(cr) - 0.5 * F.logsigmoid(-cr) - 0.5 * F.logsigmoid(-rr),
        "robust": lambda: (-(1 - e) * F.logsigmoid(beta * delta_score) + e * F.logsigmoid(-beta * delta_score)) / (1 - 2 * e),
        "bco_pair": lambda: -F.logsigmoid(cr) - F.logsigmoid(-rr),
        "sppo_hard": lambda: (chosen_logratios - 0.5 / beta) ** 2 + (rejected_logratios + 0.5 / beta) ** 2,
        "aot": lambda: smoothed(
            torch.sort(chosen_logps - rejected_logps, 0)[0] - torch.sort(ref_chosen_logps - ref_rejected_logps, 0)[0]
        ),
        "aot_unpaired": lambda: smoothed(torch.sort(chosen_logratios, 0)[0] - torch.sort(rejected_logratios, 0)[0]),
        "apo_zero": lambda: 1 - torch.sigmoid(cr) + torch.sigmoid(rr),
        "apo_down": lambda: torch.sigmoid(cr) + 1 - torch.sigmoid(beta * (chosen_logratios - rejected_logratios)),
        "discopop": lambda: (
            -F.logsigmoid(beta * delta_score) * (1 - torch.sigmoid(beta * delta_score / discopop_tau))
            + torch.exp(-beta * delta_score) * torch.sigmoid(beta * delta_score / discopop_tau)
        ),
        "sft": lambda: -per_token_logps.chunk(2)[0][chosen_mask.bool()].mean(),
        "sigmoid_norm": lambda: -F.logsigmoid(beta * avg_delta),
    }
    loss_types = [loss_types] if isinstance(loss_types, str) else loss_types
    weights = loss_weights or [1.0] * len(loss_types)
    return sum(losses[t]().mean() * w for t, w in zip(loss_types, weights))


def reference_kto(hidden, weight, target, labels, ref=None, kl=None, beta=0.1, desirable_weight=1.0, undesirable_weight=1.0):
    """TRL's KTOTrainer (loss_type="kto"): summed log-probabilities, chosen and rejected apart."""
    logps = token_logps(hidden, weight, target).sum(-1)
    if ref is not None:
        with torch.no_grad():
            ref_logps = token_logps(*ref, target).sum(-1)
    else:
        ref_logps = torch.zeros_like(logps)
    kl = torch.zeros(()) if kl is None else torch.as_tensor(kl).detach()
    chosen_idx, rejected_idx = labels.nonzero().view(-1), (~labels).nonzero().view(-1)
    chosen_logratios = logps.index_select(0, chosen_idx) - ref_logps.index_select(0, chosen_idx)
    rejected_logratios = logps.index_select(0, rejected_idx) - ref_logps.index_select(0, rejected_idx)
    chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
    rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
    return torch.cat((desirable_weight * chosen_losses, undesirable_weight * rejected_losses), 0).mean()


def reference_grpo(
    hidden, weight, target, advantages, old=None, ref=None, beta=0.04, eps_low=0.2, eps_high=0.2, loss_type="grpo", weighted=False
):
    """TRL's GRPOTrainer._compute_loss (weighted: its use_bias_correction_kl)."""
    mask = (target != -100).float()
    logp = token_logps(hidden, weight, target)
    old = logp.detach() if old is None else old
    ratio = torch.exp(logp - old)
    a = advantages[:, None]
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
    if ref is not None and beta:
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        per_token = per_token + beta * (kl * ratio if weighted else kl)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    return (per_token * mask).sum() / (per_token.shape[0] * per_token.shape[1])


def assert_same(fused_fn, reference_fn, tensors, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    loss = fused_fn()
    grads = torch.autograd.grad(loss, tensors)
    want = reference_fn()
    want_grads = torch.autograd.grad(want, tensors)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss, want.float(), **tol)
    for name, g, w in zip(("hidden", "weight"), grads, want_grads):
        scale = max(1.0, float(w.float().abs().max()))
        torch.testing.assert_close(g.float() / scale, w.float() / scale, **tol, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("loss", ["dpo", "hinge", "ipo", "simpo", "cpo", "orpo"])
def test_preference_loss_against_reference(loss, dtype):
    hidden, weight, target = inputs(dtype)
    ref = None
    kwargs = {}
    if loss in ("dpo", "hinge", "ipo"):
        ref_hidden, ref_weight, _ = inputs(dtype, seed=1, h=12)  # the reference model's hidden size differs
        ref = (ref_hidden.detach(), ref_weight.detach())
        kwargs = dict(ref_hidden=ref[0], ref_weight=ref[1])
    assert_same(
        lambda: ft.fused_linear_preference_loss(hidden, weight, target, loss=loss, chunk_size=5, **kwargs),
        lambda: reference_preference(hidden, weight, target, loss, ref),
        (hidden, weight),
        dtype,
    )


def test_preference_options_and_no_reference():
    hidden, weight, target = inputs()
    for loss, opts in (("dpo", dict(beta=0.3, label_smoothing=0.2)), ("simpo", dict(beta=2.0, gamma=1.0, label_smoothing=0.1))):
        assert_same(
            lambda loss=loss, opts=opts: ft.fused_linear_preference_loss(hidden, weight, target, loss=loss, **opts),
            lambda loss=loss, opts=opts: reference_preference(hidden, weight, target, loss, None, **opts),
            (hidden, weight),
            torch.float32,
        )
    assert_same(
        lambda: ft.fused_linear_preference_loss(hidden, weight, target, loss="cpo", beta=0.5, alpha=0.3),
        lambda: reference_preference(hidden, weight, target, "cpo", None, beta=0.5, alpha=0.3),
        (hidden, weight),
        torch.float32,
    )


# DPO's loss types (TRL's DPOTrainer) and their options: every type alone, then the options
DPO_TYPES = ["sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot"]
DPO_TYPES += ["aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"]
DPO_OPTIONS = {
    **{t: {"loss": t, "label_smoothing": 0.1 if t in ("exo_pair", "robust", "aot", "aot_unpaired") else 0.0} for t in DPO_TYPES},
    "mpo": {"loss": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]},
    "unweighted": {"loss": ("hinge", "nca_pair", "dpo"), "label_smoothing": 0.2},
    "ld_alpha": {"loss": ["sigmoid", "ipo", "aot", "sppo_hard"], "ld_alpha": 0.3},
    "ld_alpha-0": {"loss": "apo_down", "ld_alpha": 0.0},
    # 1 - exp(-u) of log-ratios u near -10: ipo's difference of two such scores loses float32's digits
    "forward_kl": {"loss": ["sigmoid", "sigmoid_norm", "hinge", "sft"], "f_divergence_type": "forward_kl"},
    "js_divergence": {
        "loss": ["exo_pair", "robust", "discopop", "ipo"],
        "f_divergence_type": "js_divergence",
        "label_smoothing": 0.1,
    },
    "alpha_divergence": {"loss": ["sigmoid", "ipo"], "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.3},
    # an exponent past 80: clamped (no gradient through it), as TRL does
    "alpha_divergence-clamped": {
        "loss": "sigmoid",
        "f_divergence_type": "alpha_divergence",
        "f_alpha_divergence_coef": -40.0,
        "beta": 1e-34,
    },
    "alpha_divergence-1": {"loss": "hinge", "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 1.0 + 1e-7},
    "discopop_tau": {"loss": "discopop", "discopop_tau": 0.6, "ld_alpha": 0.5, "beta": 0.3},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(DPO_OPTIONS))
def test_dpo_loss_types_against_reference(case, dtype):
    """Against a reference model whose hidden size differs, and without one (its log-probs 0)."""
    options = DPO_OPTIONS[case]
    hidden, weight, target = inputs(dtype, sequences=6)
    target[4, 3:] = -100  # completions of unequal lengths in each pair (ld_alpha)
    ref_hidden, ref_weight, _ = inputs(dtype, seed=1, h=12, sequences=6)
    ref = (ref_hidden.detach(), ref_weight.detach())
    want = dict(options, loss_types=options["loss"])
    del want["loss"]
    for r in (ref, None):
        kwargs = {} if r is None else dict(ref_hidden=r[0], ref_weight=r[1])
        assert_same(
            lambda kwargs=kwargs: ft.fused_linear_preference_loss(hidden, weight, target, chunk_size=5, **kwargs, **options),
            lambda r=r: reference_dpo(hidden, weight, target, ref=r, **want),
            (hidden, weight),
            dtype,
        )


def test_dpo_is_sigmoid_smoothed():
    """ "dpo" is "sigmoid" smoothed by label_smoothing (the conservative DPO), which "sigmoid" ignores (TRL's)."""
    hidden, weight, target = inputs()
    ref_hidden, ref_weight, _ = inputs(seed=1)
    kwargs = dict(ref_hidden=ref_hidden, ref_weight=ref_weight, beta=0.3)
    plain = ft.fused_linear_preference_loss(hidden, weight, target, loss="dpo", **kwargs)
    torch.testing.assert_close(ft.fused_linear_preference_loss(hidden, weight, target, loss="sigmoid", **kwargs), plain)
    smoothed = ft.fused_linear_preference_loss(hidden, weight, target, loss="dpo", label_smoothing=0.2, **kwargs)
    sigmoid = ft.fused_linear_preference_loss(hidden, weight, target, loss="sigmoid", label_smoothing=0.2, **kwargs)
    torch.testing.assert_close(sigmoid, plain)
    assert abs(smoothed.item() - plain.item()) > 1e-3


def test_reference_model_gets_no_gradient():
    hidden, weight, target = inputs()
    ref_hidden, ref_weight, _ = inputs(seed=1)
    loss = ft.fused_linear_preference_loss(hidden, weight, target, ref_hidden=ref_hidden, ref_weight=ref_weight)
    loss.backward()
    assert ref_hidden.grad is None and ref_weight.grad is None and hidden.grad is not None


LABELS = torch.tensor([True, False, False, True, False])  # unpaired: 2 desirable, 3 undesirable


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_kto_loss_against_reference(dtype):
    hidden, weight, target = inputs(dtype, sequences=5)
    ref_hidden, ref_weight, _ = inputs(dtype, seed=1, sequences=5, h=12)  # the reference model's hidden size differs
    ref = (ref_hidden.detach(), ref_weight.detach())
    kl = torch.tensor(2.0)
    opts = dict(beta=0.5, desirable_weight=1.33, undesirable_weight=0.8)
    assert_same(
        lambda: ft.fused_linear_kto_loss(
            hidden, weight, target, LABELS, ref_hidden=ref[0], ref_weight=ref[1], kl=kl, chunk_size=5, **opts
        ),
        lambda: reference_kto(hidden, weight, target, LABELS, ref, kl, **opts),
        (hidden, weight),
        dtype,
    )


def test_kto_kl_bias_and_no_reference():
    """kl as a number, a tensor or None (0); a bias on both heads; all desirable or all undesirable."""
    hidden, weight, target = inputs(sequences=5)
    g = torch.Generator().manual_seed(4)
    bias, ref_bias = torch.randn(V, generator=g).requires_grad_(), torch.randn(V, generator=g)
    ref_hidden, ref_weight, _ = inputs(seed=2, sequences=5)

    def unfused(labels, kl):
        logps = token_logps(hidden, weight, target, bias).sum(-1)
        with torch.no_grad():
            ref_logps = token_logps(ref_hidden, ref_weight, target, ref_bias).sum(-1)
        z = 0.1 * (logps - ref_logps - kl)
        return torch.where(labels, 1 - torch.sigmoid(z), 1 - torch.sigmoid(-z)).mean()

    for labels, kl in ((LABELS, 2.5), (torch.ones(5, dtype=torch.bool), torch.tensor(3.0)), (~LABELS, 0.0)):
        got = ft.fused_linear_kto_loss(
            hidden, weight, target, labels, bias=bias, ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias, kl=kl
        )
        want = unfused(labels, kl)
        torch.testing.assert_close(got, want)
        grads = torch.autograd.grad(got, (hidden, weight, bias))
        for g_got, g_want in zip(grads, torch.autograd.grad(want, (hidden, weight, bias))):
            torch.testing.assert_close(g_got, g_want)
    assert_same(
        lambda: ft.fused_linear_kto_loss(hidden, weight, target, LABELS, beta=0.3),
        lambda: reference_kto(hidden, weight, target, LABELS, beta=0.3),
        (hidden, weight),
        torch.float32,
    )


def test_kto_no_gradient_to_kl_or_reference():
    hidden, weight, target = inputs(sequences=5)
    ref_hidden, ref_weight, _ = inputs(seed=1, sequences=5)
    kl = torch.tensor(0.5, requires_grad=True)
    loss = ft.fused_linear_kto_loss(hidden, weight, target, LABELS, ref_hidden=ref_hidden, ref_weight=ref_weight, kl=kl)
    loss.backward()
    assert kl.grad is None and ref_hidden.grad is None and ref_weight.grad is None and hidden.grad is not None


@pytest.mark.parametrize("weighted", [False, True], ids=["kl", "ratio-weighted-kl"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_grpo_loss_against_reference(loss_type, dtype, weighted):
    hidden, weight, target = inputs(dtype, sequences=B + 1)
    g = torch.Generator().manual_seed(3)
    advantages = torch.randn(B + 1, generator=g)
    with torch.no_grad():
        now = token_logps(hidden, weight, target)
    old = now + 0.3 * torch.randn(now.shape, generator=g)  # ratios away from 1: the clip matters
    ref = now + 0.2 * torch.randn(now.shape, generator=g)
    assert_same(
        lambda: ft.fused_linear_grpo_loss(
            hidden, weight, target, advantages, old_logps=old, ref_logps=ref, loss_type=loss_type, use_bias_correction_kl=weighted
        ),
        lambda: reference_grpo(hidden, weight, target, advantages, old, ref, loss_type=loss_type, weighted=weighted),
        (hidden, weight),
        dtype,
    )


def test_grpo_on_policy_without_reference():
    hidden, weight, target = inputs(sequences=3)
    advantages = torch.tensor([1.0, -0.5, 0.25])
    assert_same(
        lambda: ft.fused_linear_grpo_loss(hidden, weight, target, advantages, beta=0.0),
        lambda: reference_grpo(hidden, weight, target, advantages),
        (hidden, weight),
        torch.float32,
    )


GRPO_ONE_PASS = {
    "grpo": dict(),
    "bnpo-delta": dict(loss_type="bnpo", delta=1.3),
    "dr_grpo-temperature": dict(loss_type="dr_grpo", temperature=0.7, max_completion_length=12),
    "dapo-items": dict(loss_type="dapo", num_items_in_batch=torch.tensor(40.0)),
    "cispo": dict(loss_type="cispo", epsilon_high=0.3),
    "sapo": dict(loss_type="sapo"),
    "luspo-weighted-kl": dict(loss_type="luspo", use_bias_correction_kl=True),
    "on-policy": dict(old=False, beta=0.0),
}


@pytest.mark.parametrize("frozen", ["none", "weight", "hidden"])
@pytest.mark.parametrize("case", list(GRPO_ONE_PASS))
def test_grpo_one_pass_equals_per_token_path(case, frozen, monkeypatch):
    """A token-separable GRPO loss takes one pass over the head (the gradients made in the forward,
    no logits recomputed): the same loss and gradients as the per-token path, bias and a frozen
    weight or hidden included, the upstream gradient applied; the other forms do not take it."""
    from fuselet.torch import losses

    options = dict(GRPO_ONE_PASS[case])
    with_old = options.pop("old", True)
    hidden, weight, target = inputs(sequences=4)
    bias = (torch.randn(V, generator=torch.Generator().manual_seed(3)) * 0.1).requires_grad_()
    hidden.requires_grad_(frozen != "hidden")
    weight.requires_grad_(frozen != "weight")
    g = torch.Generator().manual_seed(2)
    advantages = torch.randn(4, generator=g)
    old = -torch.rand(4, T, generator=g) * 3 if with_old else None
    ref = -torch.rand(4, T, generator=g) * 3
    tensors = [t for t in (hidden, weight, bias) if t.requires_grad]
    calls = []
    one_pass = losses.separable_logp_loss
    monkeypatch.setattr(losses, "separable_logp_loss", lambda *a, **k: calls.append(1) or one_pass(*a, **k))

    def run():
        loss = ft.fused_linear_grpo_loss(hidden, weight, target, advantages, old_logps=old, ref_logps=ref, bias=bias, **options)
        return loss, torch.autograd.grad(loss * 2.5, tensors)

    loss, grads = run()
    assert calls, "the one pass did not run"
    monkeypatch.setattr(losses, "_one_pass", lambda *a: False)
    want, want_grads = run()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    for got, w in zip(grads, want_grads):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)


def test_grpo_two_passes_where_the_tokens_are_few(monkeypatch):
    """14 tokens beside 200 classes in chunks of 4 (spec one_pass_for: tokens <= V / 8): a
    token-separable loss takes the forward and the backward by blocks of classes instead of the one
    pass; the same loss and gradients as the one pass."""
    from fuselet.torch import losses

    g = torch.Generator().manual_seed(4)
    hidden = (torch.randn(2, T, H, generator=g) * 0.5).requires_grad_()
    weight = (torch.randn(200, H, generator=g) * 0.3).requires_grad_()
    target = torch.randint(0, 200, (2, T), generator=g)
    target[:, :2] = -100
    advantages, old = torch.randn(2, generator=g), -torch.rand(2, T, generator=g) * 3
    calls = []
    one_pass = losses.separable_logp_loss
    monkeypatch.setattr(losses, "separable_logp_loss", lambda *a, **k: calls.append(1) or one_pass(*a, **k))

    def run():
        loss = ft.fused_linear_grpo_loss(hidden, weight, target, advantages, old_logps=old, loss_type="dapo", chunk_size=4)
        return loss, torch.autograd.grad(loss, (hidden, weight))

    loss, grads = run()
    assert not calls, "one pass where the tokens are few beside the classes"
    monkeypatch.setattr(losses, "one_pass_for", lambda *a: True)
    want, want_grads = run()
    assert calls, "the one pass did not run"
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    for got, w in zip(grads, want_grads):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [dict(importance_sampling_level="sequence"), dict(loss_type="vespo"), dict(entropy_coef=0.1)])
def test_grpo_one_pass_not_for_inseparable_losses(options, monkeypatch):
    from fuselet.torch import losses

    monkeypatch.setattr(losses, "separable_logp_loss", lambda *a, **k: pytest.fail("one pass for an inseparable loss"))
    hidden, weight, target = inputs(sequences=4)
    loss = ft.fused_linear_grpo_loss(hidden, weight, target, torch.randn(4), old_logps=-torch.rand(4, T), **options)
    loss.backward()
    assert torch.isfinite(hidden.grad).all()


def test_torch_compile_fullgraph():
    hidden, weight, target = inputs()
    ref_hidden, ref_weight, _ = inputs(seed=1)
    compiled = torch.compile(ft.fused_linear_preference_loss, fullgraph=True)
    got = compiled(hidden, weight, target, ref_hidden=ref_hidden.detach(), ref_weight=ref_weight.detach())
    want = ft.fused_linear_preference_loss(hidden, weight, target, ref_hidden=ref_hidden.detach(), ref_weight=ref_weight.detach())
    torch.testing.assert_close(got, want)
    for options in (
        dict(loss=["aot", "ipo", "sft"], loss_weights=[1.0, 0.5, 0.1], ld_alpha=0.5, label_smoothing=0.1),
        dict(loss=["sigmoid", "discopop"], f_divergence_type="alpha_divergence", f_alpha_divergence_coef=0.3),
    ):
        refs = dict(ref_hidden=ref_hidden.detach(), ref_weight=ref_weight.detach())
        got = compiled(hidden, weight, target, **refs, **options)
        torch.testing.assert_close(got, ft.fused_linear_preference_loss(hidden, weight, target, **refs, **options))
    kto = torch.compile(ft.fused_linear_kto_loss, fullgraph=True)
    labels, kl = torch.tensor([True, False, False, True]), torch.tensor(0.3)
    torch.testing.assert_close(
        kto(hidden, weight, target, labels, ref_hidden=ref_hidden.detach(), ref_weight=ref_weight.detach(), kl=kl),
        ft.fused_linear_kto_loss(
            hidden, weight, target, labels, ref_hidden=ref_hidden.detach(), ref_weight=ref_weight.detach(), kl=kl
        ),
    )
    advantages = torch.randn(2 * B)
    grpo = torch.compile(ft.fused_linear_grpo_loss, fullgraph=True)
    torch.testing.assert_close(
        grpo(hidden, weight, target, advantages), ft.fused_linear_grpo_loss(hidden, weight, target, advantages)
    )


def test_module_forms():
    hidden, weight, target = inputs()
    dpo = ft.FusedLinearPreferenceLoss("orpo", beta=0.2)
    assert "loss='orpo', beta=0.2" in repr(dpo)
    torch.testing.assert_close(
        dpo(hidden, weight, target), ft.fused_linear_preference_loss(hidden, weight, target, loss="orpo", beta=0.2)
    )
    advantages = torch.randn(2 * B)
    grpo = ft.FusedLinearGRPOLoss(loss_type="bnpo")
    torch.testing.assert_close(
        grpo(hidden, weight, target, advantages), ft.fused_linear_grpo_loss(hidden, weight, target, advantages, loss_type="bnpo")
    )
    with pytest.raises(ValueError, match="loss: expected one of dpo, sigmoid, hinge, ipo, exo_pair, .*, got 'kto2'"):
        ft.FusedLinearPreferenceLoss("kto2")
    mpo = ft.FusedLinearPreferenceLoss(["sigmoid", "sft"], loss_weights=[0.8, 1.0], ld_alpha=0.5)
    assert "loss=['sigmoid', 'sft'], loss_weights=[0.8, 1.0], ld_alpha=0.5" in repr(mpo)
    torch.testing.assert_close(
        mpo(hidden, weight, target),
        ft.fused_linear_preference_loss(hidden, weight, target, loss=["sigmoid", "sft"], loss_weights=[0.8, 1.0], ld_alpha=0.5),
    )
    with pytest.raises(ValueError, match=r"loss_weights: expected 2 weight\(s\)"):
        ft.FusedLinearPreferenceLoss(["sigmoid", "sft"], loss_weights=[0.8])
    labels = torch.tensor([True, False, False, True])
    kto = ft.FusedLinearKTOLoss(beta=0.2, undesirable_weight=2.0)
    assert repr(kto) == "FusedLinearKTOLoss(beta=0.2, undesirable_weight=2.0)"
    torch.testing.assert_close(
        kto(hidden, weight, target, labels, kl=0.4),
        ft.fused_linear_kto_loss(hidden, weight, target, labels, kl=0.4, beta=0.2, undesirable_weight=2.0),
    )
    with pytest.raises(ValueError, match=r"desirable_weight: expected a number >= 0.0, got -1"):
        ft.FusedLinearKTOLoss(desirable_weight=-1)
    with pytest.raises(TypeError, match=r"bta: not an option of fused_linear_kto_loss"):
        ft.FusedLinearKTOLoss(bta=0.1)


def test_bad_input():
    hidden, weight, target = inputs()
    pref = ft.fused_linear_preference_loss
    cases = [
        (lambda: pref(hidden, weight, target, loss="dpo2"), ValueError, r"loss: expected one of dpo, sigmoid, hinge"),
        (lambda: pref(hidden, weight, target, loss=["dpo", "cpo"]), ValueError, r"loss: expected DPO's loss types in a list"),
        (lambda: pref(hidden, weight, target, loss="robust", label_smoothing=0.5), ValueError, r"label_smoothing: expected a"),
        (lambda: pref(hidden, weight, target, loss_weights=[1.0, 2.0]), ValueError, r"loss_weights: expected 1 weight\(s\)"),
        (lambda: pref(hidden, weight, target, ld_alpha=-0.1), ValueError, r"ld_alpha: expected None or a number in"),
        (
            lambda: pref(hidden, weight, target, loss="bco_pair", f_divergence_type="js_divergence"),
            ValueError,
            r"f_divergence_type: expected reverse_kl with loss type 'bco_pair'",
        ),
        (lambda: pref(hidden, weight, target, use_weighting=True), ValueError, r"use_weighting: expected False \(WPO's"),
        (lambda: pref(hidden[:3], weight, target[:3]), ValueError, r"hidden: expected an even number of sequences > 0"),
        (lambda: pref(hidden[0], weight, target[0]), ValueError, r"hidden: expected shape \[sequences, T, H\]"),
        (lambda: pref(hidden, weight, target[:, :3]), ValueError, r"target: expected shape \(4, 7\)"),
        (lambda: pref(hidden, weight, target, beta=0.0), ValueError, r"beta: expected a number > 0.0, got 0.0"),
        (lambda: pref(hidden, weight, target, beta=float("nan")), ValueError, r"beta: expected a finite number"),
        (lambda: pref(hidden, weight, target, label_smoothing=0.7), ValueError, r"label_smoothing: expected a number <= 0.5"),
        (lambda: pref(hidden, weight, target, ref_hidden=hidden), ValueError, r"ref_weight: expected with ref_hidden"),
        (
            lambda: pref(hidden, weight, target, loss="simpo", ref_hidden=hidden, ref_weight=weight),
            ValueError,
            r"ref_hidden: loss 'simpo' takes no reference",
        ),
        (
            lambda: pref(hidden, weight, target, ref_hidden=hidden[:, :3], ref_weight=weight),
            ValueError,
            r"ref_hidden: expected shape \[4, 7, H_ref\]",
        ),
        (lambda: pref(None, weight, target), TypeError, r"hidden"),
        (lambda: pref(hidden, weight.double(), target), TypeError, r"weight: expected dtype float32"),
    ]
    labels = torch.tensor([True, False, True, False])
    kto = ft.fused_linear_kto_loss
    cases += [
        (lambda: kto(hidden, weight, target, labels[:3]), ValueError, r"preference_labels: expected shape \(4,\) \(one per"),
        (lambda: kto(hidden, weight, target, labels.long()), TypeError, r"preference_labels: expected dtype bool"),
        (lambda: kto(hidden, weight, target, None), TypeError, r"preference_labels: expected a torch.Tensor"),
        (lambda: kto(hidden, weight, target, labels, kl=torch.zeros(4)), ValueError, r"kl: expected a scalar"),
        (lambda: kto(hidden, weight, target, labels, kl=torch.tensor(1)), TypeError, r"kl: expected a floating-point dtype"),
        (lambda: kto(hidden, weight, target, labels, kl="0.1"), TypeError, r"kl: expected None, a number or a 0-d array"),
        (lambda: kto(hidden, weight, target, labels, kl=float("inf")), ValueError, r"kl: expected a finite number"),
        (lambda: kto(hidden, weight, target, labels, beta=0), ValueError, r"beta: expected a number > 0.0, got 0"),
        (
            lambda: kto(hidden, weight, target, labels, undesirable_weight=-0.5),
            ValueError,
            r"undesirable_weight: expected a number >= 0.0",
        ),
        (
            lambda: kto(hidden, weight, target, labels, desirable_weight=float("nan")),
            ValueError,
            r"desirable_weight: expected a finite",
        ),
        (lambda: kto(hidden, weight, target, labels, ref_weight=weight), ValueError, r"ref_hidden: expected with ref_weight"),
        (lambda: kto(hidden, weight, target, labels, ref_bias=weight[:, 0]), ValueError, r"ref_bias: expected only with"),
        (
            lambda: kto(hidden, weight, target, labels, ref_hidden=hidden, ref_weight=weight[:, :3]),
            ValueError,
            r"ref_weight: expected shape \[V, 16\]",
        ),
        (lambda: kto(hidden[:0], weight, target[:0], labels[:0]), ValueError, r"hidden: expected at least one sequence"),
        (lambda: kto(hidden, weight, target[:, :3], labels), ValueError, r"target: expected shape \(4, 7\)"),
    ]
    advantages = torch.zeros(2 * B)
    grpo = ft.fused_linear_grpo_loss
    cases += [
        (lambda: grpo(hidden, weight, target, advantages[:3]), ValueError, r"advantages: expected shape \(4,\)"),
        (
            lambda: grpo(hidden, weight, target, advantages, old_logps=target.float()[:, :2]),
            ValueError,
            r"old_logps: expected shape \(4, 7\)",
        ),
        (
            lambda: grpo(hidden, weight, target, advantages, loss_type="dapo2"),
            ValueError,
            r"loss_type: expected one of grpo, bnpo, dr_grpo",
        ),
        (lambda: grpo(hidden, weight, target, advantages, epsilon_low=-1), ValueError, r"epsilon_low: expected a number >= 0.0"),
        (
            lambda: grpo(hidden, weight, target, advantages, use_bias_correction_kl=1),
            TypeError,
            r"use_bias_correction_kl: expected a bool, got int",
        ),
        (
            lambda: grpo(hidden, weight, target, advantages, max_completion_length=0),
            ValueError,
            r"max_completion_length: expected None or an int >= 1",
        ),
        (lambda: grpo(hidden, weight, target, None), TypeError, r"advantages"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
