"""The post-training losses fused with the LM head, shared by both layers: the math over per-token
log-probabilities (their argument rules and options: fuselet/spec/losses.py). Each layer gets
those log-probabilities from its own fused_linear_cross_entropy(reduction="none") (log p(target) = -loss, chunked over tokens: no
[tokens, vocab] logits), and runs the math below with its array functions (an `xp` namespace:
fuselet.torch.losses / fuselet.jax.losses). The math follows TRL's trainers (DPO, CPO, ORPO,
KTO, GRPO), whose definitions the docs' ops reference repeats.
"""

from __future__ import annotations

from fuselet.spec.losses import AVERAGED, WITH_REFERENCE, GRPOOptions, KTOOptions, PreferenceOptions


def _smoothed(xp, z, label_smoothing):
    """-(1 - e) logsigmoid(z) - e logsigmoid(-z): the sigmoid loss with label smoothing e (TRL's)."""
    loss = -xp.logsigmoid(z)
    return loss if not label_smoothing else (1 - label_smoothing) * loss - label_smoothing * xp.logsigmoid(-z)


def preference_loss(xp, logp, mask, ref_logp, options: PreferenceOptions):
    """The loss of [2B, T] float32 per-token log-probabilities logp (mask: 1.0 where counted),
    ref_logp the reference model's or None."""
    loss, beta, gamma, alpha = options.loss, options.beta, options.gamma, options.alpha
    label_smoothing = options.label_smoothing
    count = mask.sum(-1)
    per_token = 1 / xp.at_least(count, 1) if loss in AVERAGED else 1

    def seqs(lp):
        return (lp * mask).sum(-1) * per_token

    b = logp.shape[0] // 2
    policy = seqs(logp)
    c, r = policy[:b], policy[b:]
    if loss in WITH_REFERENCE:
        ref = 0 if ref_logp is None else seqs(ref_logp)
        d = (c - r) - ((ref[:b] - ref[b:]) if ref_logp is not None else 0)
        if loss == "dpo":
            return _smoothed(xp, beta * d, label_smoothing).mean()
        if loss == "hinge":
            return xp.relu(1 - beta * d).mean()
        return ((d - 1 / (2 * beta)) ** 2).mean()  # ipo
    if loss == "simpo":
        return _smoothed(xp, beta * (c - r) - gamma, label_smoothing).mean()
    chosen_mask = mask[:b]
    nll = -(logp[:b] * chosen_mask).sum() / xp.at_least(chosen_mask.sum(), 1)
    if loss == "cpo":
        return _smoothed(xp, beta * (c - r), label_smoothing).mean() + alpha * nll
    log_odds = (c - r) - (xp.log1p(-xp.exp(c)) - xp.log1p(-xp.exp(r)))  # orpo, c and r < 0: averaged logps
    return nll - beta * xp.logsigmoid(log_odds).mean()


def kto_loss(xp, logp, mask, ref_logp, labels, kl, options: KTOOptions):
    """KTO's loss (TRL's KTOTrainer, loss_type="kto") of [B, T] float32 per-token log-probabilities
    (mask: 1.0 where counted), ref_logp the reference model's or None, labels [B] bool (True:
    desirable), kl the KL estimate (no gradient) or None. Each sequence's log-ratio is the sum of
    its counted log-probabilities less the reference's; 1 - sigmoid(z) is written sigmoid(-z)."""
    beta, desirable_weight, undesirable_weight = options.beta, options.desirable_weight, options.undesirable_weight
    ratio = (logp * mask).sum(-1)
    if ref_logp is not None:
        ratio = ratio - (ref_logp * mask).sum(-1)
    shift = ratio if kl is None else ratio - kl
    desirable = desirable_weight * xp.sigmoid(-beta * shift)
    undesirable = undesirable_weight * xp.sigmoid(beta * shift)
    return xp.where(labels, desirable, undesirable).mean()


def grpo_loss(xp, logp, mask, advantages, old_logp, ref_logp, options: GRPOOptions):
    """The GRPO loss of [B, T] float32 per-token log-probabilities (mask: 1.0 where counted);
    use_bias_correction_kl weights the KL term by the importance ratio (TRL's option of that
    name: the unbiased reverse-KL gradient, DeepSeek-V3.2), gradient included."""
    beta, epsilon_low, epsilon_high = options.beta, options.epsilon_low, options.epsilon_high
    loss_type, max_completion_length = options.loss_type, options.max_completion_length
    use_bias_correction_kl = options.use_bias_correction_kl
    old = xp.stop_gradient(logp) if old_logp is None else old_logp
    ratio = xp.exp(logp - old)
    a = advantages[:, None]
    per_token = -xp.minimum(ratio * a, xp.clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    if ref_logp is not None and beta:
        delta = ref_logp - logp
        kl = xp.exp(delta) - delta - 1
        per_token = per_token + beta * (kl * ratio if use_bias_correction_kl else kl)
    kept = per_token * mask
    if loss_type == "grpo":
        return (kept.sum(-1) / xp.at_least(mask.sum(-1), 1)).mean()
    if loss_type == "bnpo":
        return kept.sum() / xp.at_least(mask.sum(), 1)
    return kept.sum() / (logp.shape[0] * (max_completion_length or logp.shape[1]))  # dr_grpo
