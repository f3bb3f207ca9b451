"""The post-training losses fused with the LM head, shared by both layers: argument rules and the
math over per-token log-probabilities. Each layer gets those log-probabilities from its own
fused_linear_cross_entropy(reduction="none") (log p(target) = -loss, chunked over tokens: no
[tokens, vocab] logits), and runs the math below with its array functions (an `xp` namespace:
fuselet.torch.losses / fuselet.jax.losses). The math follows TRL's trainers (DPO, CPO, ORPO,
KTO, GRPO), whose definitions the docs' ops reference repeats.
"""

from __future__ import annotations

import math

# loss= of fused_linear_preference_loss: DPO's sigmoid loss and its hinge / IPO variants, SimPO,
# CPO, ORPO. Those in AVERAGED use each sequence's mean log-probability per counted token.
PREFERENCE_LOSSES = ("dpo", "hinge", "ipo", "simpo", "cpo", "orpo")
AVERAGED = ("ipo", "simpo", "orpo")
# Losses against a reference model's log-probabilities (ref_hidden / ref_weight); the others take none.
WITH_REFERENCE = ("dpo", "hinge", "ipo")
# loss_type= of fused_linear_grpo_loss
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


def _number(name: str, v, low=None, high=None, low_open=False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{name}: expected a number {'>' if low_open else '>='} {low}, got {v!r}")
    if high is not None and v > high:
        raise ValueError(f"{name}: expected a number <= {high}, got {v!r}")


def _sequences(hidden_shape: tuple, target_shape: tuple) -> None:
    if len(hidden_shape) != 3:
        raise ValueError(f"hidden: expected shape [sequences, T, H], got {tuple(hidden_shape)}")
    if tuple(target_shape) != tuple(hidden_shape[:2]):
        raise ValueError(
            f"target: expected shape {tuple(hidden_shape[:2])} (the sequences and positions of hidden "
            f"{tuple(hidden_shape)}), got {tuple(target_shape)}"
        )


def check_preference_args(hidden_shape, target_shape, loss, beta, gamma, alpha, label_smoothing, reference: dict) -> None:
    """hidden [2B, T, H] (B chosen, then B rejected), target [2B, T]; loss one of
    PREFERENCE_LOSSES; reference: {"ref_hidden": shape or None, "ref_weight": ..., "ref_bias": ...}."""
    if loss not in PREFERENCE_LOSSES:
        raise ValueError(f"loss: expected one of {', '.join(PREFERENCE_LOSSES)}, got {loss!r}")
    _sequences(hidden_shape, target_shape)
    if hidden_shape[0] % 2 or hidden_shape[0] == 0:
        raise ValueError(
            f"hidden: expected an even number of sequences > 0 (B chosen, then B rejected), got {hidden_shape[0]} "
            f"(shape {tuple(hidden_shape)})"
        )
    _number("beta", beta, 0.0, low_open=True)
    _number("gamma", gamma)
    _number("alpha", alpha)
    _number("label_smoothing", label_smoothing, 0.0, 0.5)
    refused = None
    if loss not in WITH_REFERENCE:
        refused = f"ref_hidden: loss {loss!r} takes no reference model (those that do: {', '.join(WITH_REFERENCE)})"
    _reference(hidden_shape, reference, refused)


def _reference(hidden_shape, reference: dict, refused: str | None = None) -> None:
    """The reference model's arrays, {"ref_hidden": shape or None, "ref_weight": ..., "ref_bias": ...}:
    ref_hidden [sequences, T, H_ref] (hidden's sequences and positions) and ref_weight [V, H_ref]
    together or neither, ref_bias only with them; `refused`: the message when none is taken."""
    ref_hidden, ref_weight = reference.get("ref_hidden"), reference.get("ref_weight")
    if (ref_hidden is None) != (ref_weight is None):
        given, missing = ("ref_hidden", "ref_weight") if ref_hidden is not None else ("ref_weight", "ref_hidden")
        raise ValueError(f"{missing}: expected with {given} (the reference model's last hidden states and its lm_head weight)")
    if reference.get("ref_bias") is not None and ref_weight is None:
        raise ValueError("ref_bias: expected only with ref_hidden and ref_weight")
    if ref_hidden is not None:
        if refused is not None:
            raise ValueError(refused)
        if tuple(ref_hidden[:2]) != tuple(hidden_shape[:2]) or len(ref_hidden) != 3:
            raise ValueError(
                f"ref_hidden: expected shape [{hidden_shape[0]}, {hidden_shape[1]}, H_ref] (hidden's sequences and "
                f"positions), got {tuple(ref_hidden)}"
            )
        if len(ref_weight) != 2 or ref_weight[1] != ref_hidden[2]:
            raise ValueError(
                f"ref_weight: expected shape [V, {ref_hidden[2]}] (H_ref: the last dimension of ref_hidden "
                f"{tuple(ref_hidden)}), got {tuple(ref_weight)}"
            )


def check_grpo_args(
    hidden_shape,
    target_shape,
    advantages_shape,
    logps: dict,
    beta,
    epsilon_low,
    epsilon_high,
    loss_type,
    max_completion_length,
    use_bias_correction_kl=False,
):
    """hidden [B, T, H], target [B, T], advantages [B]; logps: {"old_logps": shape or None, "ref_logps": ...}, each [B, T]."""
    if not isinstance(use_bias_correction_kl, bool):
        raise TypeError(f"use_bias_correction_kl: expected a bool, got {type(use_bias_correction_kl).__name__}")
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"loss_type: expected one of {', '.join(GRPO_LOSS_TYPES)}, got {loss_type!r}")
    _sequences(hidden_shape, target_shape)
    if tuple(advantages_shape) != (hidden_shape[0],):
        raise ValueError(
            f"advantages: expected shape ({hidden_shape[0]},) (one per sequence of hidden {tuple(hidden_shape)}), "
            f"got {tuple(advantages_shape)}"
        )
    for name, shape in logps.items():
        if shape is not None and tuple(shape) != tuple(hidden_shape[:2]):
            raise ValueError(f"{name}: expected shape {tuple(hidden_shape[:2])} (target's), got {tuple(shape)}")
    _number("beta", beta, 0.0)
    _number("epsilon_low", epsilon_low, 0.0)
    _number("epsilon_high", epsilon_high, 0.0)
    if max_completion_length is not None and (
        isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int) or max_completion_length < 1
    ):
        raise ValueError(f"max_completion_length: expected None or an int >= 1, got {max_completion_length!r}")


def check_kto_options(beta, desirable_weight, undesirable_weight) -> None:
    _number("beta", beta, 0.0, low_open=True)
    _number("desirable_weight", desirable_weight, 0.0)
    _number("undesirable_weight", undesirable_weight, 0.0)


def check_kto_args(hidden_shape, target_shape, labels, kl, beta, desirable_weight, undesirable_weight, reference: dict):
    """hidden [B, T, H] (B > 0), target [B, T]; labels: (shape, dtype) of preference_labels, [B]
    bool; kl: None, a Python number, or (shape, dtype) of a 0-d floating-point array (anything
    else: refused by its type); reference as check_preference_args's."""
    _sequences(hidden_shape, target_shape)
    if hidden_shape[0] == 0:
        raise ValueError(f"hidden: expected at least one sequence, got shape {tuple(hidden_shape)}")
    labels_shape, labels_dtype = labels
    if labels_dtype != "bool":
        raise TypeError(f"preference_labels: expected dtype bool (True: desirable, False: undesirable), got {labels_dtype}")
    if tuple(labels_shape) != (hidden_shape[0],):
        raise ValueError(
            f"preference_labels: expected shape ({hidden_shape[0]},) (one per sequence of hidden {tuple(hidden_shape)}), "
            f"got {tuple(labels_shape)}"
        )
    if isinstance(kl, tuple):
        kl_shape, kl_dtype = kl
        if not str(kl_dtype).startswith(("float", "bfloat")):
            raise TypeError(f"kl: expected a floating-point dtype, got {kl_dtype}")
        if tuple(kl_shape) != ():
            raise ValueError(f"kl: expected a scalar (a number or a 0-d array: the KL estimate), got shape {tuple(kl_shape)}")
    elif kl is not None:
        if isinstance(kl, bool) or not isinstance(kl, (int, float)):
            raise TypeError(f"kl: expected None, a number or a 0-d array (the KL estimate), got {type(kl).__name__}")
        _number("kl", kl)
    check_kto_options(beta, desirable_weight, undesirable_weight)
    _reference(hidden_shape, reference)


def _smoothed(xp, z, label_smoothing):
    """-(1 - e) logsigmoid(z) - e logsigmoid(-z): the sigmoid loss with label smoothing e (TRL's)."""
    loss = -xp.logsigmoid(z)
    return loss if not label_smoothing else (1 - label_smoothing) * loss - label_smoothing * xp.logsigmoid(-z)


def preference_loss(xp, logp, mask, ref_logp, loss, beta, gamma, alpha, label_smoothing):
    """The loss of [2B, T] float32 per-token log-probabilities logp (mask: 1.0 where counted),
    ref_logp the reference model's or None."""
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


def kto_loss(xp, logp, mask, ref_logp, labels, kl, beta, desirable_weight, undesirable_weight):
    """KTO's loss (TRL's KTOTrainer, loss_type="kto") of [B, T] float32 per-token log-probabilities
    (mask: 1.0 where counted), ref_logp the reference model's or None, labels [B] bool (True:
    desirable), kl the KL estimate (no gradient) or None. Each sequence's log-ratio is the sum of
    its counted log-probabilities less the reference's; 1 - sigmoid(z) is written sigmoid(-z)."""
    ratio = (logp * mask).sum(-1)
    if ref_logp is not None:
        ratio = ratio - (ref_logp * mask).sum(-1)
    shift = ratio if kl is None else ratio - kl
    desirable = desirable_weight * xp.sigmoid(-beta * shift)
    undesirable = undesirable_weight * xp.sigmoid(beta * shift)
    return xp.where(labels, desirable, undesirable).mean()


def grpo_loss(
    xp,
    logp,
    mask,
    advantages,
    old_logp,
    ref_logp,
    beta,
    epsilon_low,
    epsilon_high,
    loss_type,
    max_completion_length,
    use_bias_correction_kl=False,
):
    """The GRPO loss of [B, T] float32 per-token log-probabilities (mask: 1.0 where counted);
    use_bias_correction_kl weights the KL term by the importance ratio (TRL's option of that
    name: the unbiased reverse-KL gradient, DeepSeek-V3.2), gradient included."""
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


def check_linear_jsd_args(
    student_hidden, student_weight, teacher_hidden, teacher_weight, labels, beta, temperature, ignore_index, chunk_size
):
    """fused_linear_jsd: student_hidden [..., Hs] and student_weight [V, Hs] of one float dtype,
    teacher_hidden [..., Ht] (the student's leading dims) and teacher_weight [V, Ht] of one float
    dtype, labels (shape, dtype) of the leading dims, int32/int64, or None; each array as (shape,
    dtype). beta in [0, 1]; temperature a finite number > 0; chunk_size None or an int >= 1."""
    from fuselet._checks import check_divergence_args, check_dtype

    (hs, hs_dtype), (ws, _), (ht, ht_dtype), (wt, _) = student_hidden, student_weight, teacher_hidden, teacher_weight
    for name, (shape, dtype), like in (
        ("student_hidden", student_hidden, None),
        ("student_weight", student_weight, ("student_hidden", hs_dtype)),
        ("teacher_hidden", teacher_hidden, None),
        ("teacher_weight", teacher_weight, ("teacher_hidden", ht_dtype)),
    ):
        check_dtype(name, dtype)
        if like is not None and dtype != like[1]:
            raise TypeError(f"{name}: expected dtype {like[1]} (the dtype of {like[0]}), got {dtype}")
        if len(shape) == 0 or shape[-1] == 0:
            raise ValueError(f"{name}: expected shape [..., H] with H > 0, got {tuple(shape)}")
    if len(ws) != 2 or ws[1] != hs[-1]:
        raise ValueError(f"student_weight: expected shape [V, {hs[-1]}] (student_hidden's H), got {tuple(ws)}")
    if tuple(ht[:-1]) != tuple(hs[:-1]):
        raise ValueError(
            f"teacher_hidden: expected shape [{', '.join(map(str, hs[:-1]))}, H_teacher] (student_hidden's tokens), "
            f"got {tuple(ht)}"
        )
    if len(wt) != 2 or tuple(wt) != (ws[0], ht[-1]):
        raise ValueError(
            f"teacher_weight: expected shape [{ws[0]}, {ht[-1]}] (student_weight's V, teacher_hidden's H), got {tuple(wt)}"
        )
    # beta, labels and ignore_index as jsd takes them (over logits [..., V])
    logits = (*hs[:-1], ws[0])
    check_divergence_args("jsd", logits, "float32", logits, "float32", beta=beta, labels=labels, ignore_index=ignore_index)
    _number("temperature", temperature, 0.0, low_open=True)
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size: expected None or an int >= 1, got {chunk_size!r}")
