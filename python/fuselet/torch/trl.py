"""fuselet's door into TRL: `fuselet.torch.trl.enable()`, once, before a trainer is built.

TRL (>= 1.16) computes the per-token log-probabilities of every trainer that trains on them (SFT,
DPO, KTO, GRPO, RLOO and the async GRPO trainer) through one fused LM head: its
`add_fused_lm_head` patches the model's forward to project the hidden states through the head in
tiles, with `trl.kernels.ChunkedLogProbFunction` (log-probabilities, entropy, log sum p^2, mean
logit, whether the label is the argmax; no [tokens, V] logits). enable() makes that head
fuselet's: `ChunkedLogProbs` below computes the same outputs with `fused_linear_logprobs`
(fuselet's logprobs kernels over chunks of tokens, float32 math, the float32 dweight
accumulator). The trainers' losses, metrics and options stay TRL's own.

TRL's DistillationTrainer computes its loss through `ChunkedDivergenceFunction` (the per-token
generalized JSD of the student's and the teacher's heads and the student's entropy, from both
hidden states); enable() makes that fuselet's too: `ChunkedDivergence` below computes the same
outputs with `fused_linear_jsd_per_token`.

    import fuselet.torch.trl
    fuselet.torch.trl.enable()
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), ...)

disable() restores TRL's own functions; `enabled()` tells which are in force.
"""

from __future__ import annotations

import torch

from fuselet.torch.fused_linear_jsd import fused_linear_jsd_per_token
from fuselet.torch.fused_linear_logprobs import fused_linear_logprobs

# TRL's name of the fused head's function, in the module whose add_fused_lm_head calls it
_MODULE, _NAME = "trl.trainer.utils", "_ChunkedLogProbFunction"
# and of the distillation loss's, in the module whose _chunked_divergence_loss calls it
_DISTILL_MODULE, _DISTILL_NAME = "trl.trainer.distillation_trainer", "ChunkedDivergenceFunction"
_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
_trl_own = None
_trl_own_divergence = None


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


def _trl_distillation():
    _trl_utils()
    try:
        import trl.trainer.distillation_trainer as distillation
    except ImportError as e:
        raise ImportError(f"fuselet.torch.trl: expected TRL's distillation trainer ({_DISTILL_MODULE}), got: {e}") from None
    if not hasattr(distillation, _DISTILL_NAME):
        raise ImportError(
            f"fuselet.torch.trl: expected TRL's chunked divergence ({_DISTILL_MODULE}.{_DISTILL_NAME}, TRL >= 1.16), "
            "got a distillation trainer without it"
        )
    return distillation


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """autocast's dtype where it is on for hidden's device, else hidden's: the dtype TRL's heads compute in."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


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
        dtype = _compute_dtype(hidden)
        hidden, weight, bias = (None if t is None else t.to(dtype) for t in (hidden, weight, bias))
        with torch.autocast(hidden.device.type, enabled=False):
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


class ChunkedDivergence:
    """The signature of TRL's `ChunkedDivergenceFunction.apply` (trl/kernels/chunked_divergence.py),
    computed by fuselet: (per_token_divergence, per_token_entropy) [N] float32 of the student's
    hidden [N, H_s] through student_weight [V, H_s] and student_bias, and the teacher's through its
    own: the generalized JSD (beta 0 forward KL(teacher || student), 1 reverse KL) of the two
    softmaxes of softcap(logit_scale * logits) / temperature, with its gradient to the student
    only, and the student's entropy, without. Each model computes in its own dtype: autocast's
    where it is on, else its hidden's (weight and bias are cast to it, as TRL's own does)."""

    @staticmethod
    def apply(
        student_hidden: torch.Tensor,
        student_weight: torch.Tensor,
        student_bias: torch.Tensor | None,
        teacher_hidden: torch.Tensor,
        teacher_weight: torch.Tensor,
        teacher_bias: torch.Tensor | None,
        beta: float,
        temperature: float = 1.0,
        student_logit_scale: float = 1.0,
        student_final_logit_softcapping: float | None = None,
        teacher_logit_scale: float = 1.0,
        teacher_final_logit_softcapping: float | None = None,
    ):
        s_dtype, t_dtype = _compute_dtype(student_hidden), _compute_dtype(teacher_hidden)
        student = [None if t is None else t.to(s_dtype) for t in (student_hidden, student_weight, student_bias)]
        teacher = [None if t is None else t.to(t_dtype) for t in (teacher_hidden, teacher_weight, teacher_bias)]
        with torch.autocast(student_hidden.device.type, enabled=False):
            got = fused_linear_jsd_per_token(
                student[0],
                student[1],
                teacher[0],
                teacher[1],
                student_bias=student[2],
                teacher_bias=teacher[2],
                beta=float(beta),
                temperature=float(temperature),
                student_logit_scale=float(student_logit_scale),
                teacher_logit_scale=float(teacher_logit_scale),
                student_softcap=_number(student_final_logit_softcapping),
                teacher_softcap=_number(teacher_final_logit_softcapping),
                with_entropy=True,
            )
        return got.divergence, got.entropy


def _number(v):
    return None if v is None else float(v)


def enable() -> None:
    """Make TRL's fused LM head and its distillation loss fuselet's, for every fused-head forward
    and every distillation step from now on (trainers built before included)."""
    global _trl_own, _trl_own_divergence
    utils, distillation = _trl_utils(), _trl_distillation()
    if getattr(utils, _NAME) is not ChunkedLogProbs:
        _trl_own = getattr(utils, _NAME)
        setattr(utils, _NAME, ChunkedLogProbs)
    if getattr(distillation, _DISTILL_NAME) is not ChunkedDivergence:
        _trl_own_divergence = getattr(distillation, _DISTILL_NAME)
        setattr(distillation, _DISTILL_NAME, ChunkedDivergence)


def disable() -> None:
    """Give TRL its own fused LM head and distillation loss back."""
    utils, distillation = _trl_utils(), _trl_distillation()
    if getattr(utils, _NAME) is ChunkedLogProbs and _trl_own is not None:
        setattr(utils, _NAME, _trl_own)
    if getattr(distillation, _DISTILL_NAME) is ChunkedDivergence and _trl_own_divergence is not None:
        setattr(distillation, _DISTILL_NAME, _trl_own_divergence)


def enabled() -> bool:
    """Whether fuselet's door is in force (TRL's fused LM head and distillation loss both fuselet's)."""
    return getattr(_trl_utils(), _NAME) is ChunkedLogProbs and getattr(_trl_distillation(), _DISTILL_NAME) is ChunkedDivergence
