"""fuselet.jax's fused_linear_preference_loss, fused_linear_kto_loss and fused_linear_grpo_loss
against the unfused losses in jax.numpy (the [tokens, V] logits, log_softmax, TRL's formulas), under jit and grad;
vmap over a batch of problems; bad input."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import import_layer

jax = pytest.importorskip("jax")
jnp = jax.numpy
fj = import_layer("jax")

B, T, H, V = 2, 7, 16, 40


def inputs(seed=0, sequences=2 * B, h=H, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((sequences, T, h)) * 0.5, dtype)
    weight = jnp.asarray(rng.standard_normal((V, h)) * 0.3, dtype)
    target = rng.integers(0, V, (sequences, T)).astype(np.int32)
    target[:, :2] = -100
    target[1, -1] = -100
    return hidden, weight, jnp.asarray(target)


def token_logps(hidden, weight, target):
    logits = hidden.astype(jnp.float32) @ weight.astype(jnp.float32).T
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), jnp.maximum(target, 0)[..., None], -1)[..., 0]
    return logp * (target != -100)


def reference_preference(hidden, weight, target, loss, ref=None, beta=0.1, gamma=0.5, alpha=1.0):
    mask = (target != -100).astype(jnp.float32)
    logp = token_logps(hidden, weight, target)
    average = loss in ("ipo", "simpo", "orpo")

    def seq(lp):
        s = lp.sum(-1)
        return s / mask.sum(-1) if average else s

    b = hidden.shape[0] // 2
    c, r = seq(logp)[:b], seq(logp)[b:]
    ref_s = seq(jax.lax.stop_gradient(token_logps(*ref, target))) if ref is not None else jnp.zeros(2 * b)
    d = (c - r) - (ref_s[:b] - ref_s[b:])
    if loss == "dpo":
        return (-jax.nn.log_sigmoid(beta * d)).mean()
    if loss == "hinge":
        return jax.nn.relu(1 - beta * d).mean()
    if loss == "ipo":
        return ((d - 1 / (2 * beta)) ** 2).mean()
    if loss == "simpo":
        return (-jax.nn.log_sigmoid(beta * (c - r) - gamma)).mean()
    nll = -logp[:b].sum() / mask[:b].sum()
    if loss == "cpo":
        return (-jax.nn.log_sigmoid(beta * (c - r))).mean() + alpha * nll
    log_odds = (c - r) - (jnp.log1p(-jnp.exp(c)) - jnp.log1p(-jnp.exp(r)))
    return nll - beta * jax.nn.log_sigmoid(log_odds).mean()


def reference_kto(hidden, weight, target, labels, ref=None, kl=0.0, beta=0.1, desirable_weight=1.0, undesirable_weight=1.0):
    """TRL's KTOTrainer (loss_type="kto"): summed log-probabilities, chosen and rejected apart."""
    logps = token_logps(hidden, weight, target).sum(-1)
    ref_logps = jax.lax.stop_gradient(token_logps(*ref, target)).sum(-1) if ref is not None else jnp.zeros_like(logps)
    chosen, rejected = np.flatnonzero(labels), np.flatnonzero(~np.asarray(labels))
    chosen_losses = 1 - jax.nn.sigmoid(beta * ((logps[chosen] - ref_logps[chosen]) - kl))
    rejected_losses = 1 - jax.nn.sigmoid(beta * (kl - (logps[rejected] - ref_logps[rejected])))
    return jnp.concatenate([desirable_weight * chosen_losses, undesirable_weight * rejected_losses]).mean()


def reference_grpo(hidden, weight, target, advantages, old, ref, beta=0.04, loss_type="grpo", weighted=False):
    mask = (target != -100).astype(jnp.float32)
    logp = token_logps(hidden, weight, target)
    ratio = jnp.exp(logp - old)
    a = advantages[:, None]
    kl = jnp.exp(ref - logp) - (ref - logp) - 1
    per_token = -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a) + beta * (kl * ratio if weighted else kl)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum()
    return (per_token * mask).sum() / per_token.size


def assert_same(fused, reference, args):
    loss, grads = jax.jit(jax.value_and_grad(fused, argnums=(0, 1)))(*args)
    want, want_grads = jax.value_and_grad(reference, argnums=(0, 1))(*args)
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("loss", ["dpo", "hinge", "ipo", "simpo", "cpo", "orpo"])
def test_preference_loss_against_reference(loss):
    hidden, weight, target = inputs()
    ref = inputs(seed=1, h=12)[:2] if loss in ("dpo", "hinge", "ipo") else None
    kwargs = dict(ref_hidden=ref[0], ref_weight=ref[1]) if ref else {}
    assert_same(
        lambda h, w, t: fj.fused_linear_preference_loss(h, w, t, loss=loss, chunk_size=5, **kwargs),
        lambda h, w, t: reference_preference(h, w, t, loss, ref),
        (hidden, weight, target),
    )


LABELS = np.array([True, False, False, True, False])  # unpaired: 2 desirable, 3 undesirable


@pytest.mark.parametrize("kl", [None, 0.6, "array"])
def test_kto_loss_against_reference(kl):
    hidden, weight, target = inputs(sequences=5)
    ref = inputs(seed=1, sequences=5, h=12)[:2]
    labels = jnp.asarray(LABELS)
    kl_arg = jnp.asarray(1.1, jnp.float32) if kl == "array" else kl
    kl_value = 1.1 if kl == "array" else (kl or 0.0)
    opts = dict(beta=0.5, desirable_weight=1.33, undesirable_weight=0.8)
    assert_same(
        lambda h, w, t: fj.fused_linear_kto_loss(
            h, w, t, labels, ref_hidden=ref[0], ref_weight=ref[1], kl=kl_arg, chunk_size=5, **opts
        ),
        lambda h, w, t: reference_kto(h, w, t, LABELS, ref, kl_value, **opts),
        (hidden, weight, target),
    )


def test_kto_without_reference_and_kl_gets_no_gradient():
    hidden, weight, target = inputs(sequences=5)
    labels = jnp.asarray(LABELS)
    assert_same(
        lambda h, w, t: fj.fused_linear_kto_loss(h, w, t, labels, beta=0.3),
        lambda h, w, t: reference_kto(h, w, t, LABELS, beta=0.3),
        (hidden, weight, target),
    )
    dkl = jax.grad(lambda k: fj.fused_linear_kto_loss(hidden, weight, target, labels, kl=k))(jnp.float32(0.5))
    assert dkl == 0


@pytest.mark.parametrize("weighted", [False, True], ids=["kl", "ratio-weighted-kl"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_grpo_loss_against_reference(loss_type, weighted):
    hidden, weight, target = inputs(sequences=3)
    rng = np.random.default_rng(3)
    advantages = jnp.asarray(rng.standard_normal(3), jnp.float32)
    now = token_logps(hidden, weight, target)
    old = now + jnp.asarray(rng.standard_normal(now.shape) * 0.3, jnp.float32)
    ref = now + jnp.asarray(rng.standard_normal(now.shape) * 0.2, jnp.float32)
    assert_same(
        lambda h, w, t: fj.fused_linear_grpo_loss(
            h, w, t, advantages, old_logps=old, ref_logps=ref, loss_type=loss_type, use_bias_correction_kl=weighted
        ),
        lambda h, w, t: reference_grpo(h, w, t, advantages, old, ref, loss_type=loss_type, weighted=weighted),
        (hidden, weight, target),
    )


GRPO_OPTIONS = {
    "dapo": {"loss_type": "dapo", "num_items_in_batch": 31.0},
    "dapo-array": {"loss_type": "dapo", "num_items_in_batch": np.float32(9.0), "epsilon_high": 0.28},
    "dapo-local": {"loss_type": "dapo"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    "temperature": {"loss_type": "bnpo", "temperature": 0.7, "bias": True},
    "delta": {"loss_type": "dr_grpo", "delta": 1.3},
    "cispo": {"loss_type": "cispo", "epsilon_high": 1.2, "num_items_in_batch": 20.0},
    "sapo": {"loss_type": "sapo", "sapo_temperature_pos": 0.6, "sapo_temperature_neg": 1.7},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    "vespo": {"loss_type": "vespo", "vespo_k_neg": 2.0, "vespo_lambda_pos": 2.0},
    "entropy-mask": {"loss_type": "grpo", "top_entropy_quantile": 0.4},
    "entropy-bonus": {"loss_type": "bnpo", "entropy_coef": 0.3, "temperature": 0.8, "bias": True},
    "entropy-mask-bonus": {"loss_type": "dapo", "top_entropy_quantile": 0.6, "entropy_coef": 0.1},
}


@pytest.mark.parametrize("weighted", [False, True], ids=["kl", "ratio-weighted-kl"])
@pytest.mark.parametrize("case", list(GRPO_OPTIONS))
def test_grpo_options_same_as_torch(case, weighted):
    """TRL's loss types and options (fuselet.torch's checked against TRL itself, tests/torch/test_trl.py):
    fuselet.jax's loss and gradients under jit are the torch layer's on the same arrays."""
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    options = dict(GRPO_OPTIONS[case], use_bias_correction_kl=weighted)
    hidden, weight, target = inputs(sequences=3)
    rng = np.random.default_rng(5)
    bias = jnp.asarray(rng.standard_normal(V) * 0.2, jnp.float32) if options.pop("bias", False) else None
    advantages = jnp.asarray([0.8, -1.1, 0.5], jnp.float32)
    now = token_logps(hidden, weight, target)
    old = now + jnp.asarray(rng.standard_normal(now.shape) * 0.3, jnp.float32)
    ref = now + jnp.asarray(rng.standard_normal(now.shape) * 0.2, jnp.float32)

    def fused(h, w):
        return fj.fused_linear_grpo_loss(
            h, w, target, advantages, old_logps=old, ref_logps=ref, bias=bias, chunk_size=4, **options
        )

    loss, grads = jax.jit(jax.value_and_grad(fused, argnums=(0, 1)))(hidden, weight)
    t = {k: torch.from_numpy(np.array(v)) for k, v in dict(target=target, advantages=advantages, old=old, ref=ref).items()}
    h, w = (torch.from_numpy(np.array(x)).requires_grad_(True) for x in (hidden, weight))
    torch_options = {k: (float(v) if isinstance(v, np.floating) else v) for k, v in options.items()}
    want = ft.fused_linear_grpo_loss(
        h,
        w,
        t["target"].long(),
        t["advantages"],
        old_logps=t["old"],
        ref_logps=t["ref"],
        bias=None if bias is None else torch.from_numpy(np.array(bias)),
        **torch_options,
    )
    want_grads = torch.autograd.grad(want, (h, w))
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5, atol=1e-6)
    for g, wg in zip(grads, want_grads):
        np.testing.assert_allclose(g, wg.numpy(), rtol=1e-4, atol=1e-6)


def test_grpo_per_token_outputs_same_as_torch():
    """return_per_token: this policy's log-probabilities and entropies [B, T], as torch's, no gradient."""
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    hidden, weight, target = inputs(sequences=3)
    advantages = jnp.asarray([0.8, -1.1, 0.5], jnp.float32)
    loss, per_token = fj.fused_linear_grpo_loss(hidden, weight, target, advantages, entropy_coef=0.1, return_per_token=True)
    t = {k: torch.from_numpy(np.array(v)) for k, v in dict(hidden=hidden, weight=weight, advantages=advantages).items()}
    want_loss, want = ft.fused_linear_grpo_loss(
        t["hidden"],
        t["weight"],
        torch.from_numpy(np.array(target)).long(),
        t["advantages"],
        entropy_coef=0.1,
        return_per_token=True,
    )
    np.testing.assert_allclose(loss, want_loss.item(), rtol=1e-5)
    assert per_token[2:] == want[2:] == (None, None, None)
    for got, expected in zip(per_token[:2], want[:2]):
        assert got.shape == target.shape and not expected.requires_grad
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(per_token.log_probs, token_logps(hidden, weight, target), rtol=1e-5, atol=1e-6)


# DPO's loss types and options (fuselet.torch's checked against TRL's DPOTrainer itself,
# tests/torch/test_trl.py, and against the unfused loss, tests/torch/test_losses.py)
DPO_TYPES = ["dpo", "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot"]
DPO_TYPES += ["aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"]
DPO_OPTIONS = {
    **{
        t: {"loss": t, "label_smoothing": 0.1 if t in ("dpo", "exo_pair", "robust", "aot", "aot_unpaired") else 0.0}
        for t in DPO_TYPES
    },
    "mpo": {"loss": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]},
    "ld_alpha": {"loss": ["sigmoid", "ipo", "aot_unpaired", "nca_pair"], "ld_alpha": 0.3},
    "forward_kl": {"loss": ["sigmoid", "sigmoid_norm", "hinge", "sft"], "f_divergence_type": "forward_kl"},
    "js_divergence": {"loss": ["exo_pair", "robust", "ipo"], "f_divergence_type": "js_divergence", "label_smoothing": 0.2},
    "alpha_divergence": {
        "loss": ["sigmoid", "discopop"],
        "f_divergence_type": "alpha_divergence",
        "f_alpha_divergence_coef": 0.3,
        "discopop_tau": 0.4,
        "ld_alpha": 0.6,
    },
}


@pytest.mark.parametrize("reference", [True, False], ids=["reference", "reference-free"])
@pytest.mark.parametrize("case", list(DPO_OPTIONS))
def test_dpo_loss_types_same_as_torch(case, reference):
    """fuselet.jax's loss and gradients under jit are the torch layer's on the same arrays."""
    torch = pytest.importorskip("torch")
    ft = import_layer("torch")
    options = DPO_OPTIONS[case]
    hidden, weight, target = inputs(sequences=6)
    target = target.at[4, 3:].set(-100)  # completions of unequal lengths in each pair (ld_alpha)
    ref_hidden, ref_weight, _ = inputs(seed=1, sequences=6, h=12)
    refs = dict(ref_hidden=ref_hidden, ref_weight=ref_weight) if reference else {}

    def fused(h, w):
        return fj.fused_linear_preference_loss(h, w, target, chunk_size=4, **refs, **options)

    loss, grads = jax.jit(jax.value_and_grad(fused, argnums=(0, 1)))(hidden, weight)
    h, w = (torch.from_numpy(np.array(x)).requires_grad_(True) for x in (hidden, weight))
    torch_refs = {k: torch.from_numpy(np.array(v)) for k, v in refs.items()}
    want = ft.fused_linear_preference_loss(h, w, torch.from_numpy(np.array(target)).long(), **torch_refs, **options)
    want_grads = torch.autograd.grad(want, (h, w))
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5, atol=1e-6)
    for g, wg in zip(grads, want_grads):  # by the gradient's scale (forward_kl's reach exp(18) without a reference)
        scale = max(1.0, float(wg.abs().max()))
        np.testing.assert_allclose(np.asarray(g) / scale, wg.numpy() / scale, rtol=1e-4, atol=1e-6)


def test_vmap_over_problems():
    problems = [inputs(seed=s) for s in range(3)]
    hidden, weight, target = (jnp.stack(parts) for parts in zip(*problems))
    batched = jax.vmap(lambda h, w, t: fj.fused_linear_preference_loss(h, w, t, loss="simpo"))(hidden, weight, target)
    one_by_one = [fj.fused_linear_preference_loss(*p, loss="simpo") for p in problems]
    np.testing.assert_allclose(batched, jnp.stack(one_by_one), rtol=1e-5, atol=1e-6)


def test_bfloat16_inputs_float32_loss():
    hidden, weight, target = inputs(dtype=jnp.bfloat16)
    loss = fj.fused_linear_preference_loss(hidden, weight, target, loss="orpo")
    want = reference_preference(hidden, weight, target, "orpo")
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(loss, want, rtol=2e-2, atol=2e-2)


def test_bad_input():
    hidden, weight, target = inputs()
    with pytest.raises(ValueError, match=r"loss: expected one of dpo, sigmoid, hinge, ipo, .*, got 'dpo2'"):
        fj.fused_linear_preference_loss(hidden, weight, target, loss="dpo2")
    with pytest.raises(ValueError, match=r"f_divergence_type: expected reverse_kl with loss type 'aot'"):
        fj.fused_linear_preference_loss(hidden, weight, target, loss=["sigmoid", "aot"], f_divergence_type="forward_kl")
    with pytest.raises(ValueError, match=r"use_weighting: expected False"):
        fj.fused_linear_preference_loss(hidden, weight, target, use_weighting=True)
    with pytest.raises(ValueError, match=r"hidden: expected an even number of sequences > 0"):
        fj.fused_linear_preference_loss(hidden[:3], weight, target[:3])
    with pytest.raises(ValueError, match=r"ref_hidden: expected with ref_weight"):
        fj.fused_linear_preference_loss(hidden, weight, target, ref_weight=weight)
    with pytest.raises(TypeError, match=r"hidden: expected a jax.Array, got NoneType"):
        fj.fused_linear_preference_loss(None, weight, target)
    with pytest.raises(ValueError, match=r"advantages: expected shape \(4,\)"):
        fj.fused_linear_grpo_loss(hidden, weight, target, jnp.zeros(3))
    with pytest.raises(TypeError, match=r"advantages: expected a jax.Array, got NoneType"):
        fj.fused_linear_grpo_loss(hidden, weight, target, None)
    labels = jnp.asarray([True, False, True, False])
    with pytest.raises(ValueError, match=r"preference_labels: expected shape \(4,\)"):
        fj.fused_linear_kto_loss(hidden, weight, target, labels[:3])
    with pytest.raises(TypeError, match=r"preference_labels: expected dtype bool"):
        fj.fused_linear_kto_loss(hidden, weight, target, labels.astype(jnp.int32))
    with pytest.raises(ValueError, match=r"kl: expected a scalar"):
        fj.fused_linear_kto_loss(hidden, weight, target, labels, kl=jnp.zeros(4))
    with pytest.raises(TypeError, match=r"kl: expected None, a number or a 0-d array \(the KL estimate\), got list"):
        fj.fused_linear_kto_loss(hidden, weight, target, labels, kl=[0.1])
    with pytest.raises(ValueError, match=r"beta: expected a number > 0.0"):
        fj.fused_linear_kto_loss(hidden, weight, target, labels, beta=-0.1)
    with pytest.raises(ValueError, match=r"loss_type: expected one of grpo, bnpo, dr_grpo"):
        fj.fused_linear_grpo_loss(hidden, weight, target, jnp.zeros(4), loss_type="x")
