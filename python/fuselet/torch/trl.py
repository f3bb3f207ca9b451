"""fuselet's door into TRL: `fuselet.torch.trl.enable()`, once, before a trainer is built.

TRL (>= 1.16) computes the per-token log-probabilities of every trainer that trains on them (SFT,
DPO, KTO, GRPO, RLOO and the async GRPO trainer) through one fused LM head: its
`add_fused_lm_head` patches the model's forward to project the hidden states through the head in
tiles, with `trl.kernels.ChunkedLogProbFunction` (log-probabilities, entropy, log sum p^2, mean
logit, whether the label is the argmax; no [tokens, V] logits). enable() makes that head
fuselet's: `ChunkedLogProbs` below computes the same outputs with `fused_linear_logprobs`
(fuselet's logprobs kernels over chunks of tokens, float32 math, the float32 dweight
accumulator). The trainers' losses, metrics and options stay TRL's own.

    import fuselet.torch.trl
    fuselet.torch.trl.enable()
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), ...)

disable() restores TRL's own function; `enabled()` tells which is in force.
"""

from __future__ import annotations

import torch

from fuselet.torch.fused_linear_logprobs import fused_linear_logprobs

# TRL's name of the fused head's function, in the module whose add_fused_lm_head calls it
_MODULE, _NAME = "trl.trainer.utils", "_ChunkedLogProbFunction"
_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
_trl_own = None


def _trl_utils():
    try:
        import trl
        import trl.trainer.utils as utils
    except ImportError as e:
        raise ImportError(f"fuselet.torch.trl: expected TRL >= 1.16 installed (pip install trl), got: {e}") from None
    if not hasattr(utils, _NAME) or not hasattr(utils, "add_fused_lm_head"):
        raise ImportError(
            f"fuselet.torch.trl: expected TRL's fused LM head ({_MODULE}.{_NAME} and add_fused_lm_head, TRL >= 1.16), "
            f"got TRL {trl.__version__} without it"
        )
    return utils


class ChunkedLogProbs:
    """The signature of TRL's `ChunkedLogProbFunction.apply` (trl/kernels/chunked_logprob.py),
    computed by fuselet: (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1) of hidden
    [N, H] through weight [V, H] and bias, targets [N], each [N] or None where not in `outputs`;
    log_probs and entropy with gradients. chunk_size (TRL's vocabulary tile) is not used: fuselet
    chunks the tokens (fused_linear_logprobs' default). Under autocast, hidden, weight and bias
    are cast to autocast's dtype first, as TRL's own head computes in it."""

    @staticmethod
    def apply(
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = _OUTPUTS,
    ):
        del chunk_size
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        hidden, weight, bias = (None if t is None else t.to(dtype) for t in (hidden, weight, bias))
        with torch.autocast(device, enabled=False):
            got = fused_linear_logprobs(
                hidden,
                weight,
                targets,
                bias=bias,
                temperature=float(temperature),
                logit_scale=float(logit_scale),
                softcap=None if final_logit_softcapping is None else float(final_logit_softcapping),
                outputs=tuple(outputs),
            )
        return tuple(got)


def enable() -> None:
    """Make TRL's fused LM head fuselet's, for every fused-head forward from now on (trainers built before included)."""
    global _trl_own
    utils = _trl_utils()
    if getattr(utils, _NAME) is not ChunkedLogProbs:
        _trl_own = getattr(utils, _NAME)
        setattr(utils, _NAME, ChunkedLogProbs)


def disable() -> None:
    """Give TRL its own fused LM head back."""
    utils = _trl_utils()
    if getattr(utils, _NAME) is ChunkedLogProbs and _trl_own is not None:
        setattr(utils, _NAME, _trl_own)


def enabled() -> bool:
    return getattr(_trl_utils(), _NAME) is ChunkedLogProbs
