"""The post-training losses fused with the LM head, for JAX: preference losses (DPO's loss
types of TRL's DPOTrainer and their weighted sums, SimPO, CPO, ORPO), KTO's unpaired loss and
GRPO's policy loss, from the last hidden states and the head's weight without the [tokens,
vocab] logits.

Math: fuselet/_losses.py; argument rules: fuselet/spec/losses.py (both shared with fuselet.torch).
The per-token log-probabilities are -fused_linear_cross_entropy(reduction="none") (chunked over
tokens with XLA's matmul and fuselet's cross-entropy FFI call, custom_vjp); the reference model's
pass through lax.stop_gradient. Losses are float32; jit, grad and vmap apply.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fuselet import _losses
from fuselet.jax._checks import array_facts
from fuselet.jax.fused_linear_cross_entropy import fused_linear_cross_entropy
from fuselet.jax.fused_linear_logprobs import LogProbs, fused_linear_logprobs
from fuselet.spec import losses as spec


class _Jax:
    """The array functions fuselet/_losses.py's math calls."""

    logsigmoid = staticmethod(jax.nn.log_sigmoid)
    relu = staticmethod(jax.nn.relu)
    exp = staticmethod(jnp.exp)
    log1p = staticmethod(jnp.log1p)
    minimum = staticmethod(jnp.minimum)
    nan_to_num = staticmethod(jnp.nan_to_num)
    clip = staticmethod(jnp.clip)
    sigmoid = staticmethod(jax.nn.sigmoid)
    where = staticmethod(jnp.where)
    stop_gradient = staticmethod(jax.lax.stop_gradient)

    @staticmethod
    def at_least(x, low):
        return jnp.maximum(x, low)

    @staticmethod
    def sort(x):
        return jnp.sort(x, axis=0)

    @staticmethod
    def cumsum(x):
        return jnp.cumsum(x, axis=-1)

    @staticmethod
    def concatenate(xs):
        return jnp.concatenate(xs)

    floor = staticmethod(jnp.floor)

    @staticmethod
    def index(x):
        return x.astype(jnp.int32)


def _shape(name, a, optional=False):
    facts = array_facts(name, a, optional=optional)
    return None if facts is None else facts[0]


def _logps(hidden, weight, bias, target, ignore_index, chunk_size):
    return -fused_linear_cross_entropy(
        hidden, weight, target, bias=bias, ignore_index=ignore_index, reduction="none", chunk_size=chunk_size
    )


def _policy_and_reference(hidden, weight, bias, ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size):
    """(logp, ref_logp, mask): the policy's per-token log-probabilities, the reference model's
    under stop_gradient (None without one), and 1.0 where a token counts."""
    logp = _logps(hidden, weight, bias, target, ignore_index, chunk_size)
    ref_logp = None
    if ref_hidden is not None:
        ref_logp = jax.lax.stop_gradient(_logps(ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size))
    return logp, ref_logp, (target != ignore_index).astype(jnp.float32)


def fused_linear_preference_loss(
    hidden,
    weight,
    target,
    *,
    loss: str | list[str] = "dpo",
    bias=None,
    ref_hidden=None,
    ref_weight=None,
    ref_bias=None,
    beta: float = 0.1,
    gamma: float = 0.5,
    alpha: float = 1.0,
    label_smoothing: float = 0.0,
    loss_weights: list[float] | None = None,
    ld_alpha: float | None = None,
    f_divergence_type: str = "reverse_kl",
    f_alpha_divergence_coef: float = 0.5,
    discopop_tau: float = 0.05,
    use_weighting: bool = False,
    ignore_index: int = -100,
    chunk_size: int | None = None,
):
    """fuselet.torch.fused_linear_preference_loss for JAX (the same arguments and math: DPO's loss
    types of TRL's DPOTrainer, alone or a weighted list, with its options ld_alpha,
    f_divergence_type, discopop_tau; SimPO, CPO, ORPO): hidden [2B, T, H], B chosen then B
    rejected, weight [V, H], target [2B, T]. The float32 scalar loss; no gradient reaches the
    reference model's arrays."""
    shapes = {n: _shape(n, a) for n, a in (("hidden", hidden), ("target", target))}
    refs = (("ref_hidden", ref_hidden), ("ref_weight", ref_weight), ("ref_bias", ref_bias))
    reference = {n: _shape(n, a, optional=True) for n, a in refs}
    options = spec.preference(
        shapes["hidden"],
        shapes["target"],
        reference,
        loss,
        beta=beta,
        gamma=gamma,
        alpha=alpha,
        label_smoothing=label_smoothing,
        loss_weights=loss_weights,
        ld_alpha=ld_alpha,
        f_divergence_type=f_divergence_type,
        f_alpha_divergence_coef=f_alpha_divergence_coef,
        discopop_tau=discopop_tau,
        use_weighting=use_weighting,
    )
    logp, ref_logp, mask = _policy_and_reference(
        hidden, weight, bias, ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size
    )
    return _losses.preference_loss(_Jax, logp, mask, ref_logp, options)


def fused_linear_kto_loss(
    hidden,
    weight,
    target,
    preference_labels,
    *,
    bias=None,
    ref_hidden=None,
    ref_weight=None,
    ref_bias=None,
    kl=None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
):
    """fuselet.torch.fused_linear_kto_loss for JAX (the same arguments and math: TRL's KTOTrainer,
    loss_type="kto"): hidden [B, T, H], weight [V, H], target [B, T], preference_labels [B] bool,
    kl a number or a 0-d array (None: 0). The float32 scalar loss; no gradient reaches kl or the
    reference model's arrays."""
    shapes = {n: _shape(n, a) for n, a in (("hidden", hidden), ("target", target))}
    labels = array_facts("preference_labels", preference_labels)
    refs = (("ref_hidden", ref_hidden), ("ref_weight", ref_weight), ("ref_bias", ref_bias))
    reference = {n: _shape(n, a, optional=True) for n, a in refs}
    is_array = hasattr(kl, "shape") and hasattr(kl, "dtype")
    kl_facts = array_facts("kl", kl) if is_array else kl
    options = spec.kto(
        shapes["hidden"],
        shapes["target"],
        labels,
        kl_facts,
        reference,
        beta=beta,
        desirable_weight=desirable_weight,
        undesirable_weight=undesirable_weight,
    )
    logp, ref_logp, mask = _policy_and_reference(
        hidden, weight, bias, ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size
    )
    if is_array:
        kl = jax.lax.stop_gradient(jnp.asarray(kl, jnp.float32))
    return _losses.kto_loss(_Jax, logp, mask, ref_logp, preference_labels, kl, options)


def fused_linear_grpo_loss(
    hidden,
    weight,
    target,
    advantages,
    *,
    old_logps=None,
    ref_logps=None,
    bias=None,
    beta: float = 0.04,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    ignore_index: int = -100,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    use_bias_correction_kl: bool = False,
    importance_sampling_level: str = "token",
    delta: float | None = None,
    temperature: float = 1.0,
    num_items_in_batch=None,
    sapo_temperature_neg: float = 1.05,
    sapo_temperature_pos: float = 1.0,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    top_entropy_quantile: float = 1.0,
    entropy_coef: float = 0.0,
    return_per_token: bool = False,
    chunk_size: int | None = None,
):
    """fuselet.torch.fused_linear_grpo_loss for JAX (the same arguments and math: TRL's
    GRPOConfig options, name for name): hidden [B, T, H], weight [V, H], target [B, T], advantages
    [B]; num_items_in_batch a number or a 0-d array (no gradient). The float32 scalar loss, and
    with return_per_token=True (loss, LogProbs(log_probs, entropy)) [B, T] under stop_gradient."""
    shapes = {n: _shape(n, a) for n, a in (("hidden", hidden), ("target", target), ("advantages", advantages))}
    logps = {n: _shape(n, a, optional=True) for n, a in (("old_logps", old_logps), ("ref_logps", ref_logps))}
    items_is_array = hasattr(num_items_in_batch, "shape") and hasattr(num_items_in_batch, "dtype")
    options = spec.grpo(
        shapes["hidden"],
        shapes["target"],
        shapes["advantages"],
        logps,
        array_facts("num_items_in_batch", num_items_in_batch) if items_is_array else num_items_in_batch,
        beta=beta,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        loss_type=loss_type,
        max_completion_length=max_completion_length,
        use_bias_correction_kl=use_bias_correction_kl,
        importance_sampling_level=importance_sampling_level,
        delta=delta,
        temperature=temperature,
        sapo_temperature_neg=sapo_temperature_neg,
        sapo_temperature_pos=sapo_temperature_pos,
        vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos,
        vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg,
        top_entropy_quantile=top_entropy_quantile,
        entropy_coef=entropy_coef,
        return_per_token=return_per_token,
    )
    entropy = None
    if return_per_token or options.uses_entropy:
        logp, entropy = fused_linear_logprobs(
            hidden,
            weight,
            target,
            bias=bias,
            temperature=options.temperature,
            ignore_index=ignore_index,
            outputs=("entropy",),
            chunk_size=chunk_size,
        )[:2]
    else:
        if options.temperature != 1.0:  # (hidden / t) @ weight.T + bias / t: the logits / t
            hidden = hidden / jnp.asarray(options.temperature, hidden.dtype)
            bias = None if bias is None else bias / jnp.asarray(options.temperature, bias.dtype)
        logp = _logps(hidden, weight, bias, target, ignore_index, chunk_size)
    mask = (target != ignore_index).astype(jnp.float32)
    as32 = [None if a is None else jax.lax.stop_gradient(jnp.asarray(a, jnp.float32)) for a in (advantages, old_logps, ref_logps)]
    items = None
    if num_items_in_batch is not None:
        items = jax.lax.stop_gradient(jnp.asarray(num_items_in_batch, jnp.float32))
    loss = _losses.grpo_loss(_Jax, logp, mask, *as32, options, items, entropy)
    if return_per_token:
        return loss, LogProbs(jax.lax.stop_gradient(logp), jax.lax.stop_gradient(entropy))
    return loss
