"""The post-training losses fused with the LM head, shared by both layers: the math over per-token
log-probabilities (their argument rules and options: fuselet/spec/losses.py). Each layer gets
those log-probabilities from its own fused_linear_cross_entropy(reduction="none") (log p(target) = -loss, chunked over tokens: no
[tokens, vocab] logits), and runs the math below with its array functions (an `xp` namespace:
fuselet.torch.losses / fuselet.jax.losses). The math follows TRL's trainers (DPO, CPO, ORPO,
KTO, GRPO), whose definitions the docs' ops reference repeats.
"""

from __future__ import annotations

import math

from fuselet.spec.losses import AVERAGED, GRPOOptions, KTOOptions, PreferenceOptions


def _smoothed(xp, z, label_smoothing):
    """-(1 - e) logsigmoid(z) - e logsigmoid(-z): the sigmoid loss with label smoothing e (TRL's)."""
    loss = -xp.logsigmoid(z)
    return loss if not label_smoothing else (1 - label_smoothing) * loss - label_smoothing * xp.logsigmoid(-z)


def preference_loss(xp, logp, mask, ref_logp, options: PreferenceOptions):
    """The loss of [2B, T] float32 per-token log-probabilities logp (mask: 1.0 where counted),
    ref_logp the reference model's or None: DPO's loss types (each loss_types' mean over the
    pairs, times its weight, summed: TRL's DPOTrainer), or SimPO, CPO, ORPO."""
    if options.loss in ("simpo", "cpo", "orpo"):
        return _reference_free(xp, logp, mask, options)
    pairs = _Pairs(xp, logp, mask, ref_logp, options)
    losses = [DPO_LOSSES[t](xp, pairs, options).mean() * w for t, w in zip(options.loss_types, options.weights)]
    return sum(losses[1:], losses[0])


def _reference_free(xp, logp, mask, options: PreferenceOptions):
    """SimPO (CPOTrainer's simpo with cpo_alpha 0), CPO, ORPO: no reference model."""
    loss, beta, gamma, alpha = options.loss, options.beta, options.gamma, options.alpha
    label_smoothing = options.label_smoothing
    per_token = 1 / xp.at_least(mask.sum(-1), 1) if loss in AVERAGED else 1
    policy = (logp * mask).sum(-1) * per_token
    b = logp.shape[0] // 2
    c, r = policy[:b], policy[b:]
    if loss == "simpo":
        return _smoothed(xp, beta * (c - r) - gamma, label_smoothing).mean()
    nll = _chosen_nll(xp, logp, mask)
    if loss == "cpo":
        return _smoothed(xp, beta * (c - r), label_smoothing).mean() + alpha * nll
    log_odds = (c - r) - (xp.log1p(-xp.exp(c)) - xp.log1p(-xp.exp(r)))  # orpo, c and r < 0: averaged logps
    return nll - beta * xp.logsigmoid(log_odds).mean()


def _chosen_nll(xp, logp, mask):
    """The mean over the chosen sequences' counted tokens of -log p(target)."""
    b = logp.shape[0] // 2
    chosen_mask = mask[:b]
    return -(logp[:b] * chosen_mask).sum() / xp.at_least(chosen_mask.sum(), 1)


# --- DPO's loss types (TRL's DPOTrainer._compute_loss, 1.16) --------------------------------------


def _once(f):
    """A property computed when first read, then kept (functools.cached_property takes a lock on
    Python 3.11, which torch.compile cannot trace)."""

    def read(self):
        if f.__name__ not in self._kept:
            self._kept[f.__name__] = f(self)
        return self._kept[f.__name__]

    return property(read, doc=f.__doc__)


class _Pairs:
    """What DPO's loss types read of the B pairs (TRL's names), each computed when first read. A
    sequence's log-prob is the sum of its counted log-probabilities; with ld_alpha (LD-DPO) the
    tokens past the shorter completion of its pair count ld_alpha times. The arrays stay [2B]
    (chosen, then rejected) until a loss type reads a half (on DTensors, a gather each)."""

    def __init__(self, xp, logp, mask, ref_logp, options: PreferenceOptions):
        self.xp, self.logp, self.mask, self.ref_logp, self.options = xp, logp, mask, ref_logp, options
        self.b = logp.shape[0] // 2
        self._kept = {}

    @_once
    def _shared(self):
        """1.0 where a counted token lies within the shorter completion's length of its pair."""
        xp, mask, b = self.xp, self.mask, self.b
        count = mask.sum(-1)
        shared = xp.minimum(count[:b], count[b:])
        shared = xp.concatenate([shared, shared])
        return xp.where(xp.cumsum(mask) <= shared[:, None], mask, 0.0)

    def _sums(self, lp):
        if self.options.ld_alpha is None:
            return (lp * self.mask).sum(-1)
        shared = self._shared
        return (lp * shared).sum(-1) + self.options.ld_alpha * (lp * (self.mask - shared)).sum(-1)

    @_once
    def logps(self):
        return self._sums(self.logp)

    @_once
    def ref_logps(self):
        """The reference model's, None without one (reference-free: 0)."""
        return None if self.ref_logp is None else self._sums(self.ref_logp)

    @_once
    def logratios(self):
        return self.logps if self.ref_logps is None else self.logps - self.ref_logps

    @_once
    def chosen_logratios(self):
        return self.logratios[: self.b]

    @_once
    def rejected_logratios(self):
        return self.logratios[self.b :]

    @_once
    def scores(self):
        """f'(exp(log-ratio)) of the f-divergence (f-DPO), the log-ratio itself under reverse_kl."""
        return F_DIVERGENCES[self.options.f_divergence_type](self.xp, self.logratios, self.options)

    @_once
    def delta_score(self):
        return self.scores[: self.b] - self.scores[self.b :]

    @_once
    def avg_delta_score(self):
        """delta_score of the scores per counted token (ipo, sigmoid_norm)."""
        averaged = self.scores / self.xp.at_least(self.mask.sum(-1), 1)
        return averaged[: self.b] - averaged[self.b :]

    @_once
    def nll(self):
        return _chosen_nll(self.xp, self.logp, self.mask)


def _reverse_kl(xp, u, o):
    return u


def _forward_kl(xp, u, o):
    return 1 - xp.exp(-u)


def _js_divergence(xp, u, o):
    return math.log(2) + xp.logsigmoid(u)


def _alpha_divergence(xp, u, o):
    """(t^(a-1) - 1) / (a - 1), t = exp(u), its exponent at most 80; a within 1e-6 of 1: u (its limit)."""
    a = o.f_alpha_divergence_coef
    if abs(a - 1.0) < 1e-6:
        return u
    return (xp.exp(xp.clip((a - 1.0) * u, None, 80.0)) - 1.0) * (1.0 / (a - 1.0))


F_DIVERGENCES = {
    "reverse_kl": _reverse_kl,
    "forward_kl": _forward_kl,
    "js_divergence": _js_divergence,
    "alpha_divergence": _alpha_divergence,
}


# Each: the [B] per-pair losses (sft: a scalar) of _Pairs p, options o; e = label_smoothing.
def _dpo(xp, p, o):
    """The sigmoid loss, smoothed by e (the conservative DPO; TRL's sigmoid takes no e)."""
    return _smoothed(xp, o.beta * p.delta_score, o.label_smoothing)


def _sigmoid(xp, p, o):
    return -xp.logsigmoid(o.beta * p.delta_score)


def _hinge(xp, p, o):
    return xp.relu(1 - o.beta * p.delta_score)


def _ipo(xp, p, o):
    return (p.avg_delta_score - 1 / (2 * o.beta)) ** 2


def _exo_pair(xp, p, o):
    """KL(softmax(beta scores) over the pair || (1 - e, e)): EXO-pref, e > 0."""
    z, e = o.beta * p.delta_score, o.label_smoothing
    chosen = xp.sigmoid(z) * (xp.logsigmoid(z) - math.log1p(-e))
    return chosen + xp.sigmoid(-z) * (xp.logsigmoid(-z) - math.log(e))


def _nca_pair(xp, p, o):
    c, r = o.beta * p.chosen_logratios, o.beta * p.rejected_logratios
    return -xp.logsigmoid(c) - 0.5 * xp.logsigmoid(-c) - 0.5 * xp.logsigmoid(-r)


def _robust(xp, p, o):
    """The unbiased loss under labels flipped with probability e < 0.5 (rDPO)."""
    z, e = o.beta * p.delta_score, o.label_smoothing
    return (-(1 - e) * xp.logsigmoid(z) + e * xp.logsigmoid(-z)) / (1 - 2 * e)


def _bco_pair(xp, p, o):
    return -xp.logsigmoid(o.beta * p.chosen_logratios) - xp.logsigmoid(-o.beta * p.rejected_logratios)


def _sppo_hard(xp, p, o):
    return (p.chosen_logratios - 0.5 / o.beta) ** 2 + (p.rejected_logratios + 0.5 / o.beta) ** 2


def _aot(xp, p, o):
    """The smoothed sigmoid loss of the batch's policy and reference chosen-rejected log-prob
    differences, each sorted over the B pairs."""
    b = p.b
    delta = xp.sort(p.logps[:b] - p.logps[b:])
    if p.ref_logps is not None:
        delta = delta - xp.sort(p.ref_logps[:b] - p.ref_logps[b:])
    return _smoothed(xp, o.beta * delta, o.label_smoothing)


def _aot_unpaired(xp, p, o):
    """aot of the chosen and the rejected log-ratios, each sorted over the batch."""
    delta = xp.sort(p.chosen_logratios) - xp.sort(p.rejected_logratios)
    return _smoothed(xp, o.beta * delta, o.label_smoothing)


def _apo_zero(xp, p, o):
    return (1 - xp.sigmoid(o.beta * p.chosen_logratios)) + xp.sigmoid(o.beta * p.rejected_logratios)


def _apo_down(xp, p, o):
    c, r = p.chosen_logratios, p.rejected_logratios
    return xp.sigmoid(o.beta * c) + (1 - xp.sigmoid(o.beta * (c - r)))


def _discopop(xp, p, o):
    """The logistic and exponential losses, mixed by sigmoid(z / discopop_tau) (DiscoPOP)."""
    z = o.beta * p.delta_score
    modulation = xp.sigmoid(z / o.discopop_tau)
    return -xp.logsigmoid(z) * (1 - modulation) + xp.exp(-z) * modulation


def _sft(xp, p, o):
    return p.nll


def _sigmoid_norm(xp, p, o):
    return -xp.logsigmoid(o.beta * p.avg_delta_score)


DPO_LOSSES = {
    "dpo": _dpo,
    "sigmoid": _sigmoid,
    "hinge": _hinge,
    "ipo": _ipo,
    "exo_pair": _exo_pair,
    "nca_pair": _nca_pair,
    "robust": _robust,
    "bco_pair": _bco_pair,
    "sppo_hard": _sppo_hard,
    "aot": _aot,
    "aot_unpaired": _aot_unpaired,
    "apo_zero": _apo_zero,
    "apo_down": _apo_down,
    "discopop": _discopop,
    "sft": _sft,
    "sigmoid_norm": _sigmoid_norm,
}


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


def _masked_quantile(xp, x, mask, q):
    """The q-quantile of x's entries where mask > 0 (torch.quantile's linear interpolation between
    the two nearest ranks), +inf where none counts; sorted with the others at +inf, so that no
    array's shape depends on the mask."""
    flat = xp.where(mask > 0, x, math.inf).reshape(-1)
    ranked = xp.sort(flat)
    k = mask.reshape(-1).sum()
    pos = q * xp.at_least(k - 1, 0)
    low = xp.floor(pos)
    frac = pos - low
    low = xp.index(low)
    high = xp.index(xp.minimum(xp.floor(pos) + 1, xp.at_least(k - 1, 0)))
    a, b = ranked[low], ranked[high]
    value = a + frac * xp.where(b > a, b - a, 0.0)  # b == a: no inf - inf
    return xp.where(k > 0, value, math.inf)


def _entropy_mask(xp, entropy, mask, top_entropy_quantile):
    """1.0 where a counted token's entropy is at or above the (1 - top_entropy_quantile) quantile
    of the counted tokens' (TRL's GRPOTrainer.get_high_entropy_mask, one process)."""
    entropy = xp.stop_gradient(entropy)
    threshold = _masked_quantile(xp, entropy, mask, 1 - top_entropy_quantile)
    return xp.where((entropy * mask >= threshold) & (mask > 0), 1.0, 0.0)


def grpo_loss(xp, logp, mask, advantages, old_logp, ref_logp, options: GRPOOptions, num_items_in_batch=None, entropy=None):
    """The GRPO loss of [B, T] float32 per-token log-probabilities (mask: 1.0 where counted), as
    TRL's GRPOTrainer._compute_loss (1.16) for each loss_type; num_items_in_batch the count of
    tokens dapo / cispo / vespo divide by (None: mask's). use_bias_correction_kl weights the KL term
    by the importance ratio (the unbiased reverse-KL gradient, DeepSeek-V3.2), gradient included.
    entropy: the [B, T] per-token entropies (with their gradient), which top_entropy_quantile < 1
    (the policy loss on the high-entropy tokens alone) and entropy_coef (minus entropy_coef times
    their mean over the tokens the loss acts on) take."""
    keep = None
    if options.top_entropy_quantile < 1.0:
        keep = _entropy_mask(xp, entropy, mask, options.top_entropy_quantile)
    loss = _grpo_policy(xp, logp, mask, advantages, old_logp, ref_logp, options, num_items_in_batch, keep)
    if options.entropy_coef:
        acting = mask if keep is None else mask * keep
        loss = loss - options.entropy_coef * (entropy * acting).sum() / xp.at_least(acting.sum(), 1)
    return loss


def _grpo_policy(xp, logp, mask, advantages, old_logp, ref_logp, options: GRPOOptions, num_items_in_batch, keep):
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
    if keep is not None:  # the high-entropy tokens alone, before the KL term (TRL's order)
        per_token = per_token * keep
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
