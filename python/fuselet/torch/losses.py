"""The post-training losses fused with the LM head, for PyTorch: preference losses (DPO's loss
types of TRL's DPOTrainer and their weighted sums, SimPO, CPO, ORPO), KTO's unpaired loss and
GRPO's policy loss, from the last hidden states and the head's weight without the [tokens,
vocab] logits.

Math: fuselet/_losses.py; argument rules: fuselet/spec/losses.py (both shared with fuselet.jax).
The per-token log-probabilities are -fused_linear_cross_entropy(reduction="none"): chunked over
tokens with torch's matmul and fuselet's cross-entropy kernel, its fused backward included; the
reference model's run under no_grad. Losses are float32; hidden and weight float32, float16 or bfloat16.
"""

from __future__ import annotations

import torch

from fuselet import _losses
from fuselet.spec import losses as spec
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for, one_pass_for
from fuselet.torch._args import check_dense, check_same_device, dtype_name
from fuselet.torch._dtensor import check_dtensors, is_dtensor
from fuselet.torch.fused_linear_cross_entropy import fused_linear_cross_entropy, separable_logp_loss
from fuselet.torch.fused_linear_logprobs import LogProbs, fused_linear_logprobs


class _Torch:
    """The array functions fuselet/_losses.py's math calls."""

    relu = staticmethod(torch.relu)
    exp = staticmethod(torch.exp)
    log1p = staticmethod(torch.log1p)
    minimum = staticmethod(torch.minimum)
    nan_to_num = staticmethod(torch.nan_to_num)
    sigmoid = staticmethod(torch.sigmoid)
    where = staticmethod(torch.where)

    @staticmethod
    def logsigmoid(x):
        # -log(1 + exp(-x)) through logaddexp: the same values and gradients as
        # torch.nn.functional.logsigmoid, and ops that DTensor has rules for (it has none for
        # log_sigmoid's backward)
        return -torch.logaddexp(torch.zeros_like(x), -x)

    @staticmethod
    def clip(x, low, high):
        return x.clamp(low, high)

    @staticmethod
    def at_least(x, low):
        return x.clamp(min=low)

    @staticmethod
    def stop_gradient(x):
        return x.detach()

    @staticmethod
    def sort(x):
        return torch.sort(x, 0).values

    @staticmethod
    def cumsum(x):
        return torch.cumsum(x, -1)

    @staticmethod
    def concatenate(xs):
        return torch.cat(xs)

    floor = staticmethod(torch.floor)

    @staticmethod
    def index(x):
        return x.long()


def _shape(t):
    return None if t is None else tuple(t.shape)


def _logps(hidden, weight, bias, target, ignore_index, chunk_size, process_group=None):
    """log p(target) per token, [sequences, T] float32 (0 where target is ignore_index); with
    process_group, weight and bias this rank's rows of the head (vocab-parallel)."""
    return -fused_linear_cross_entropy(
        hidden,
        weight,
        target,
        bias=bias,
        ignore_index=ignore_index,
        reduction="none",
        chunk_size=chunk_size,
        process_group=process_group,
    )


def _one_pass(separable: bool, process_group, hidden, weight, bias, target, chunk_size) -> bool:
    """Whether a loss of the per-token log-probabilities takes fused_linear_cross_entropy's one
    pass (separable_logp_loss): a token-separable loss of dense tensors in eager autograd whose
    head's gradients are wanted, where spec.fused_linear_cross_entropy.one_pass_for prefers it;
    otherwise the per-token path (reduction="none"), whose backward recomputes the logits."""
    tensors = [t for t in (hidden, weight, bias, target) if t is not None]
    n, vocab = target.numel(), weight.shape[0]
    return (
        separable
        and one_pass_for(n, vocab, chunk_size or chunk_size_for(n, hidden.shape[-1], vocab))
        and process_group is None
        and torch.is_grad_enabled()
        and (hidden.requires_grad or weight.requires_grad)
        and not torch.compiler.is_compiling()
        and not any(is_dtensor(t) for t in tensors)
    )


def _policy_and_reference(
    hidden, weight, bias, ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size, process_group=None
):
    """(logp, ref_logp, mask): the policy's per-token log-probabilities, the reference model's
    under no_grad (None without one), and 1.0 where a token counts. With process_group, both
    heads (and biases) are this rank's rows of the classes."""
    logp = _logps(hidden, weight, bias, target, ignore_index, chunk_size, process_group)
    ref_logp = None
    if ref_hidden is not None:
        with torch.no_grad():
            ref_logp = _logps(ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size, process_group)
    return logp, ref_logp, (target != ignore_index).to(torch.float32)


def fused_linear_preference_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    loss: str | list[str] = "dpo",
    bias: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
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
    process_group=None,
) -> torch.Tensor:
    """A preference loss of the policy's hidden [2B, T, H] (B chosen sequences, then B rejected:
    TRL's concatenated layout) through the head weight [V, H] (and bias), target [2B, T] aligned
    with hidden (target[t] labels position t; ignore_index drops it). The float32 scalar loss;
    gradients flow to hidden, weight and bias only.

    - loss: DPO's loss types, against the reference model ref_hidden [2B, T, H_ref] / ref_weight /
      ref_bias (or none: log-ratios of the policy alone): TRL's DPOConfig.loss_type (1.16), name for
      name: "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard",
      "aot", "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"; and "dpo",
      the sigmoid loss smoothed by label_smoothing (the conservative DPO; TRL's "sigmoid" takes
      none). A list of them (MPO): their losses summed, weighted by loss_weights (None: 1 each).
      Or, reference-free and alone: "simpo" (gamma: its margin, CPOConfig's simpo_gamma), "cpo"
      (alpha: the chosen NLL's weight, its cpo_alpha), "orpo".
    - DPOConfig's options under its names: beta; label_smoothing (dpo, robust: < 0.5, exo_pair:
      > 0, aot, aot_unpaired); ld_alpha (LD-DPO: the tokens past the shorter completion of a
      pair count ld_alpha times in both sequences' log-probs, policy and reference); f_divergence_type
      ("reverse_kl"; "forward_kl", "js_divergence", "alpha_divergence" with
      f_alpha_divergence_coef, for dpo, sigmoid, sigmoid_norm, hinge, ipo, exo_pair, robust,
      discopop, sft); discopop_tau. use_weighting (WPO) is refused: its weights need each
      token's sum of squared probabilities, from logits never formed here.
    - process_group: vocab-parallel (docs/tensor_parallel.md): weight, bias, ref_weight and
      ref_bias are this rank's rows of the classes, the other tensors alike on every rank."""
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias), ("target", target)):
        check_dense(name, t, optional=name == "bias")
    for name, t in (("ref_hidden", ref_hidden), ("ref_weight", ref_weight), ("ref_bias", ref_bias)):
        check_dense(name, t, optional=True)
    reference = {"ref_hidden": _shape(ref_hidden), "ref_weight": _shape(ref_weight), "ref_bias": _shape(ref_bias)}
    options = spec.preference(
        _shape(hidden),
        _shape(target),
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
    check_same_device("hidden", hidden, ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias)
    check_dtensors(
        hidden=hidden, weight=weight, bias=bias, target=target, ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias
    )
    logp, ref_logp, mask = _policy_and_reference(
        hidden, weight, bias, ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size, process_group
    )
    return _losses.preference_loss(_Torch, logp, mask, ref_logp, options)


def fused_linear_kto_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    preference_labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    kl: torch.Tensor | float | None = None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    process_group=None,
) -> torch.Tensor:
    """KTO's loss of unpaired examples: hidden [B, T, H] through the head weight [V, H] (and bias),
    target [B, T] aligned with hidden (target[t] labels position t; ignore_index drops it),
    preference_labels [B] bool (True: desirable, False: undesirable). A sequence's log-ratio r is
    the sum of its counted log-probabilities less the reference model's (ref_hidden [B, T, H_ref]
    / ref_weight / ref_bias, under no_grad; 0 without one); kl the KL estimate, a number or a 0-d
    tensor that no gradient flows through (None: 0). Per sequence: desirable_weight
    * (1 - sigmoid(beta (r - kl))) if desirable, undesirable_weight * (1 - sigmoid(beta (kl - r)))
    if not; the float32 scalar loss is their mean over the B sequences. This matches TRL's
    KTOTrainer with loss_type="kto" (its per-sequence losses, weights and mean; TRL computes the KL
    estimate and clamps it at 0, the caller does here) and Liger-Kernel's LigerFusedLinearKTOLoss
    (average_log_prob=False), which has no weights (both 1). process_group: vocab-parallel
    (docs/tensor_parallel.md): weight, bias, ref_weight and ref_bias are this rank's rows of the
    classes, the other tensors alike on every rank."""
    for name, t in (
        ("hidden", hidden),
        ("weight", weight),
        ("bias", bias),
        ("target", target),
        ("preference_labels", preference_labels),
    ):
        check_dense(name, t, optional=name == "bias")
    for name, t in (("ref_hidden", ref_hidden), ("ref_weight", ref_weight), ("ref_bias", ref_bias)):
        check_dense(name, t, optional=True)
    reference = {"ref_hidden": _shape(ref_hidden), "ref_weight": _shape(ref_weight), "ref_bias": _shape(ref_bias)}
    kl_facts = (_shape(kl), dtype_name(kl)) if isinstance(kl, torch.Tensor) else kl
    labels = (_shape(preference_labels), dtype_name(preference_labels))
    options = spec.kto(
        _shape(hidden),
        _shape(target),
        labels,
        kl_facts,
        reference,
        beta=beta,
        desirable_weight=desirable_weight,
        undesirable_weight=undesirable_weight,
    )
    kl_tensor = kl if isinstance(kl, torch.Tensor) else None
    check_same_device(
        "hidden",
        hidden,
        preference_labels=preference_labels,
        kl=kl_tensor,
        ref_hidden=ref_hidden,
        ref_weight=ref_weight,
        ref_bias=ref_bias,
    )
    check_dtensors(
        hidden=hidden,
        weight=weight,
        bias=bias,
        target=target,
        preference_labels=preference_labels,
        kl=kl_tensor,
        ref_hidden=ref_hidden,
        ref_weight=ref_weight,
        ref_bias=ref_bias,
    )
    logp, ref_logp, mask = _policy_and_reference(
        hidden, weight, bias, ref_hidden, ref_weight, ref_bias, target, ignore_index, chunk_size, process_group
    )
    if kl_tensor is not None:
        kl = kl_tensor.detach().to(torch.float32)
    return _losses.kto_loss(_Torch, logp, mask, ref_logp, preference_labels, kl, options)


def fused_linear_grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    advantages: torch.Tensor,
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
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
    num_items_in_batch: torch.Tensor | float | None = None,
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
    process_group=None,
) -> torch.Tensor | tuple[torch.Tensor, LogProbs]:
    """GRPO's policy loss of hidden [B, T, H] through the head weight [V, H] (and bias), target
    [B, T] (the completion tokens; ignore_index drops a position), advantages [B]; old_logps [B, T]
    the sampling policy's log-probabilities (None: this policy's, detached: ratio 1); ref_logps
    [B, T] the reference model's, for the beta-weighted KL term (None: no KL). The options are TRL's
    GRPOConfig's (1.16), name for name (epsilon_low is its `epsilon`; epsilon_high None: epsilon_low):

    - loss_type: "grpo" (per sequence, then over sequences), "bnpo" (over the batch's counted
      tokens), "dr_grpo" (over B * max_completion_length, default T), "dapo" (over
      num_items_in_batch: the accumulated batch's counted tokens as TRL's trainer gets them, divided
      by its processes and scaled by accumulation steps / steps_per_generation as TRL does; None:
      this batch's), "cispo" (the ratio clipped at epsilon_high, no gradient, times the
      advantage and log-probability; over num_items_in_batch), "sapo" (a sigmoid gate of
      temperature sapo_temperature_pos where the advantage is > 0, else sapo_temperature_neg; per
      sequence), "luspo" (each sequence's sum, then their mean), "vespo" (a sequence weight
      e^lambda w^k e^(-lambda w), no gradient, w the sequence's ratio, (k, lambda) vespo_k_pos /
      vespo_lambda_pos where the advantage is >= 0, else the _neg pair; over num_items_in_batch).
    - importance_sampling_level: "token" (one ratio per token) or "sequence" (GSPO: exp of the
      sequence's mean log-ratio); delta: the two-sided clip's cap of the unclipped ratio (INTELLECT-2).
    - temperature: the logits are divided by it before the log-softmax (hidden and bias are,
      here), as TRL's trainer does; old_logps and ref_logps are to be of those logits too.
    - use_bias_correction_kl: the KL term weighted by the importance ratio (TRL's default True;
      fuselet's False: DeepSeekMath's unweighted term).

    - top_entropy_quantile: below 1, the policy loss of the counted tokens whose entropy is at or
      above that quantile from the top alone (TRL's high-entropy mask, over this call's tokens);
      entropy_coef: minus entropy_coef times the mean entropy of the tokens the loss acts on (the
      entropy bonus, with its gradient). The entropies come with the log-probabilities from
      fused_linear_logprobs (no logits).
    - return_per_token: also return LogProbs(log_probs, entropy) [B, T] of this policy, without
      gradients (what TRL logs; 0 where ignored).

    TRL's GRPOConfig defaults that differ: loss_type "dapo", beta 0.0, use_bias_correction_kl True.
    Not here: vLLM's importance sampling correction, the off-policy mask, the adaptive entropy
    coefficient (a trainer's state: pass its current entropy_coef). The float32 scalar loss.
    process_group: vocab-parallel (docs/tensor_parallel.md): weight and bias are this rank's rows of
    the classes, the other tensors alike on every rank (the entropies too: fused_linear_logprobs'
    vocab-parallel path)."""
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias), ("target", target), ("advantages", advantages)):
        check_dense(name, t, optional=name == "bias")
    for name, t in (("old_logps", old_logps), ("ref_logps", ref_logps)):
        check_dense(name, t, optional=True)
    logps = {"old_logps": _shape(old_logps), "ref_logps": _shape(ref_logps)}
    items = num_items_in_batch
    items_tensor = items if isinstance(items, torch.Tensor) else None
    options = spec.grpo(
        _shape(hidden),
        _shape(target),
        _shape(advantages),
        logps,
        (_shape(items), dtype_name(items)) if items_tensor is not None else items,
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
    check_same_device("hidden", hidden, advantages=advantages, old_logps=old_logps, ref_logps=ref_logps)
    check_dtensors(
        hidden=hidden, weight=weight, bias=bias, target=target, advantages=advantages, old_logps=old_logps, ref_logps=ref_logps
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
            process_group=process_group,
        )[:2]
    else:
        if options.temperature != 1.0:  # (hidden / t) @ weight.T + bias / t: the logits / t, no [tokens, V] copy
            hidden = hidden / options.temperature
            bias = None if bias is None else bias / options.temperature
    mask = (target != ignore_index).to(torch.float32)
    as32 = [None if t is None else t.detach().to(torch.float32) for t in (advantages, old_logps, ref_logps)]
    if items is not None:
        items = torch.as_tensor(items, dtype=torch.float32, device=mask.device).detach()

    def loss_of(lp):
        return _losses.grpo_loss(_Torch, lp, mask, *as32, options, items, entropy)

    if entropy is None and _one_pass(options.token_separable, process_group, hidden, weight, bias, target, chunk_size):
        return separable_logp_loss(hidden, weight, target, loss_of, bias=bias, ignore_index=ignore_index, chunk_size=chunk_size)
    if entropy is None:
        logp = _logps(hidden, weight, bias, target, ignore_index, chunk_size, process_group)
    loss = loss_of(logp)
    return (loss, LogProbs(logp.detach(), entropy.detach())) if return_per_token else loss


class FusedLinearPreferenceLoss(torch.nn.Module):
    """fused_linear_preference_loss as a module: the options (process_group included) at
    construction, the tensors per call (forward(hidden, weight, target, bias=None, ref_hidden=None,
    ref_weight=None, ref_bias=None))."""

    def __init__(self, loss: str | list[str] = "dpo", **options):
        super().__init__()
        spec.preference_options(loss, **{k: options[k] for k in _PREFERENCE_OPTIONS if k in options})
        self.loss, self.options = loss, options

    def forward(self, hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None):
        return fused_linear_preference_loss(
            hidden,
            weight,
            target,
            loss=self.loss,
            bias=bias,
            ref_hidden=ref_hidden,
            ref_weight=ref_weight,
            ref_bias=ref_bias,
            **self.options,
        )

    def extra_repr(self) -> str:
        return ", ".join([f"loss={self.loss!r}"] + [f"{k}={v!r}" for k, v in self.options.items()])


class FusedLinearKTOLoss(torch.nn.Module):
    """fused_linear_kto_loss as a module: the options (beta, desirable_weight, undesirable_weight,
    ignore_index, chunk_size, process_group) at construction, the tensors and the KL estimate per call
    (forward(hidden, weight, target, preference_labels, bias=None, ref_hidden=None,
    ref_weight=None, ref_bias=None, kl=None))."""

    def __init__(self, **options):
        super().__init__()
        unknown = sorted(set(options) - set(_KTO_OPTIONS))
        if unknown:
            raise TypeError(f"{unknown[0]}: not an option of fused_linear_kto_loss (those: {', '.join(_KTO_OPTIONS)})")
        spec.kto_options(**{k: options[k] for k in ("beta", "desirable_weight", "undesirable_weight") if k in options})
        self.options = options

    def forward(
        self, hidden, weight, target, preference_labels, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None, kl=None
    ):
        return fused_linear_kto_loss(
            hidden,
            weight,
            target,
            preference_labels,
            bias=bias,
            ref_hidden=ref_hidden,
            ref_weight=ref_weight,
            ref_bias=ref_bias,
            kl=kl,
            **self.options,
        )

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


class FusedLinearGRPOLoss(torch.nn.Module):
    """fused_linear_grpo_loss as a module: the options (process_group included) at construction,
    the tensors per call (forward(hidden, weight, target, advantages, old_logps=None,
    ref_logps=None, bias=None, num_items_in_batch=None))."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, hidden, weight, target, advantages, old_logps=None, ref_logps=None, bias=None, num_items_in_batch=None):
        return fused_linear_grpo_loss(
            hidden,
            weight,
            target,
            advantages,
            old_logps=old_logps,
            ref_logps=ref_logps,
            bias=bias,
            num_items_in_batch=num_items_in_batch,
            **self.options,
        )

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


_PREFERENCE_OPTIONS = (
    "beta",
    "gamma",
    "alpha",
    "label_smoothing",
    "loss_weights",
    "ld_alpha",
    "f_divergence_type",
    "f_alpha_divergence_coef",
    "discopop_tau",
    "use_weighting",
)
_KTO_OPTIONS = {
    "beta": 0.1,
    "desirable_weight": 1.0,
    "undesirable_weight": 1.0,
    "ignore_index": -100,
    "chunk_size": None,
    "process_group": None,
}
