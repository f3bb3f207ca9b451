"""The post-training losses fused with the LM head, shared by both layers: the math over per-token
log-probabilities (their argument rules and options: fuselet/spec/losses.py). Each layer gets
those log-probabilities from its own fused_linear_cross_entropy(reduction="none") (log p(target) = -loss, chunked over tokens: no
[tokens, vocab] logits), and runs the math below with its array functions (an `xp` namespace:
fuselet.torch.losses / fuselet.jax.losses). The math follows TRL's trainers (DPO, CPO, ORPO,
KTO, GRPO), whose definitions the docs' ops reference repeats.
"""

from __future__ import annotations

import math

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


def _vespo_weights(xp, a, log_ratio, mask, options: GRPOOptions):
    """VESPO's per-sequence weight phi(w) = e^lambda w^k e^(-lambda w), [B, 1], no gradient: w the
    sequence's importance ratio exp(sum of its counted token log-ratios), each clipped to [-20, 20],
    the sum to [log 1e-8, 20]; (k, lambda) the _pos pair where the advantage >= 0, else the _neg
    one; lambda at least 1e-4 (TRL's get_gamma_weights)."""
    log_ratio = xp.stop_gradient(log_ratio)
    log_w = xp.clip((xp.clip(log_ratio, -20.0, 20.0) * mask).sum(-1)[:, None], math.log(1e-8), 20.0)
    nonneg = a >= 0
    k = xp.where(nonneg, options.vespo_k_pos, options.vespo_k_neg)
    lam = xp.at_least(xp.where(nonneg, options.vespo_lambda_pos, options.vespo_lambda_neg), 1e-4)
    phi = xp.exp(lam + k * log_w - lam * xp.exp(log_w))
    return xp.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def grpo_loss(xp, logp, mask, advantages, old_logp, ref_logp, options: GRPOOptions, num_items_in_batch=None):
    """The GRPO loss of [B, T] float32 per-token log-probabilities (mask: 1.0 where counted), as
    TRL's GRPOTrainer._compute_loss (1.16) for each loss_type; num_items_in_batch the count of
    tokens dapo / cispo / vespo divide by (None: mask's). use_bias_correction_kl weights the KL term
    by the importance ratio (the unbiased reverse-KL gradient, DeepSeek-V3.2), gradient included."""
    beta, epsilon_low, epsilon_high = options.beta, options.epsilon_low, options.epsilon_high
    loss_type, max_completion_length = options.loss_type, options.max_completion_length
    old = xp.stop_gradient(logp) if old_logp is None else old_logp
    log_ratio = logp - old
    if options.importance_sampling_level == "sequence":  # GSPO: one ratio per sequence, [B, 1]
        log_ratio_used = ((log_ratio * mask).sum(-1) / xp.at_least(mask.sum(-1), 1))[:, None]
    else:
        log_ratio_used = log_ratio
    ratio = xp.exp(log_ratio_used)
    a = advantages[:, None]
    if loss_type == "cispo":  # the clipped ratio, no gradient, weighs the log-probability
        per_token = -xp.stop_gradient(xp.clip(ratio, None, epsilon_high)) * a * logp
    elif loss_type == "sapo":  # a sigmoid gate for the clip, its temperature by the advantage's sign
        tau = xp.where(a > 0, options.sapo_temperature_pos, options.sapo_temperature_neg)
        per_token = -xp.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    elif loss_type == "vespo":
        per_token = -_vespo_weights(xp, a, log_ratio, mask, options) * a * logp
    else:  # grpo, bnpo, dr_grpo, dapo, luspo: PPO's clip; delta caps the unclipped ratio too
        clipped = xp.clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
        capped = ratio if options.delta is None else xp.clip(ratio, None, options.delta)
        per_token = -xp.minimum(capped * a, clipped * a)
    if ref_logp is not None and beta:
        d = ref_logp - logp
        kl = xp.exp(d) - d - 1
        per_token = per_token + beta * (kl * ratio if options.use_bias_correction_kl else kl)
    kept = per_token * mask
    if loss_type in ("grpo", "sapo"):
        return (kept.sum(-1) / xp.at_least(mask.sum(-1), 1)).mean()
    if loss_type == "bnpo":
        return kept.sum() / xp.at_least(mask.sum(), 1)
    if loss_type == "dr_grpo":
        return kept.sum() / (logp.shape[0] * (max_completion_length or logp.shape[1]))
    if loss_type == "luspo":
        return kept.sum(-1).mean()
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    return kept.sum() / xp.at_least(count, 1)  # dapo, cispo, vespo
