"""The post-training losses composed over fused_linear_cross_entropy (their math:
fuselet/_losses.py): fused_linear_preference_loss, fused_linear_kto_loss, fused_linear_grpo_loss.
Arrays are given by their shapes (their dtypes, ignore_index and chunk_size are
fused_linear_cross_entropy's to check, spec/fused_linear_cross_entropy.py). Each returns the
options the math takes, as one object."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fuselet.spec import _rules as r
from fuselet.spec._rules import Array, Refusal

# loss= of fused_linear_preference_loss: DPO's loss types, TRL's DPOConfig.loss_type (1.16) and
# "dpo" (fuselet's sigmoid loss, label_smoothing its conservative DPO; TRL's "sigmoid" takes none),
# then the reference-free SimPO, CPO and ORPO. A list of DPO's types sums their losses (MPO).
DPO_LOSSES = (
    "dpo",
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
PREFERENCE_LOSSES = (*DPO_LOSSES, "simpo", "cpo", "orpo")
# Those of simpo, cpo, orpo in AVERAGED use each sequence's mean log-probability per counted token.
AVERAGED = ("simpo", "orpo")
# Losses against a reference model's log-probabilities (ref_hidden / ref_weight); the others take none.
WITH_REFERENCE = DPO_LOSSES
# f_divergence_type= (f-DPO): the function of each sequence's log-ratio the losses take in its
# place; other than reverse_kl (the log-ratio itself), for the loss types of F_DIVERGENCE_LOSSES
# alone: the reparameterization's log Z(x) cancels only in the chosen-rejected difference (TRL's rule)
F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
F_DIVERGENCE_LOSSES = ("dpo", "sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")
# loss_type= of fused_linear_grpo_loss: TRL's GRPOConfig's (1.16), by their normalizers: per
# sequence (grpo, sapo), the local batch's tokens (bnpo), B * max_completion_length (dr_grpo),
# the accumulated batch's tokens, num_items_in_batch (dapo, cispo, vespo), per sequence summed (luspo)
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# Those normalized by num_items_in_batch (None: the local batch's count of counted tokens)
BY_NUM_ITEMS = ("dapo", "cispo", "vespo")
# importance_sampling_level=: one ratio per token, or per sequence (GSPO: exp of the mean log-ratio)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class PreferenceOptions:
    """fused_linear_preference_loss' options: loss a name or a tuple of DPO's (their losses summed,
    weighted by loss_weights; None: 1 each); the others under TRL's DPOConfig names but gamma
    (CPOConfig's simpo_gamma) and alpha (its cpo_alpha)."""

    loss: str | tuple = "dpo"
    beta: float = 0.1
    gamma: float = 0.5
    alpha: float = 1.0
    label_smoothing: float = 0.0
    loss_weights: tuple | None = None
    ld_alpha: float | None = None
    f_divergence_type: str = "reverse_kl"
    f_alpha_divergence_coef: float = 0.5
    discopop_tau: float = 0.05

    @property
    def loss_types(self) -> tuple:
        return self.loss if isinstance(self.loss, tuple) else (self.loss,)

    @property
    def weights(self) -> tuple:
        return self.loss_weights if self.loss_weights is not None else (1.0,) * len(self.loss_types)


@dataclass(frozen=True)
class KTOOptions:
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0


@dataclass(frozen=True)
class GRPOOptions:
    """GRPO's options under TRL's GRPOConfig names (epsilon_low is TRL's `epsilon`; epsilon_high
    None: epsilon_low, as TRL's). temperature divides the logits (the layers apply it)."""

    beta: float = 0.04
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "grpo"
    max_completion_length: int | None = None
    use_bias_correction_kl: bool = False
    importance_sampling_level: str = "token"
    delta: float | None = None
    temperature: float = 1.0
    sapo_temperature_neg: float = 1.05
    sapo_temperature_pos: float = 1.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0

    @property
    def uses_entropy(self) -> bool:
        """Whether the loss takes the per-token entropies (the entropy mask or bonus)."""
        return self.top_entropy_quantile < 1.0 or bool(self.entropy_coef)

    @property
    def token_separable(self) -> bool:
        """Whether the loss is a sum over the tokens of functions of each token's own
        log-probability (the other inputs fixed): each token's gradient is then known as soon as
        its own log-probability is, so one pass over the head's chunks gives the loss and its
        gradients. Not so for a sequence's ratio (GSPO's, VESPO's weights) or the entropy mask's
        quantile over all tokens; the entropy options take the logprobs path anyway."""
        return self.importance_sampling_level == "token" and self.loss_type != "vespo" and not self.uses_entropy


def _number(name: str, v, low=None, high=None, low_open=False) -> None:
    """A finite number ("a finite number"), then in its bounds ("a number > 0.0")."""
    r.number(name, v, noun="number")
    if low is not None:
        r.number(name, v, low=low, low_open=low_open, finite_only=False, noun="number")
    if high is not None:
        r.number(name, v, high=high, finite_only=False, noun="number")


def _sequences(hidden_shape: tuple, target_shape: tuple) -> None:
    if len(hidden_shape) != 3:
        raise ValueError(f"hidden: expected shape [sequences, T, H], got {tuple(hidden_shape)}")
    r.same_shape("target", target_shape, hidden_shape[:2], f"the sequences and positions of hidden {tuple(hidden_shape)}")


def _one_per_sequence(name: str, shape: tuple, hidden_shape: tuple) -> None:
    r.same_shape(name, shape, (hidden_shape[0],), f"one per sequence of hidden {tuple(hidden_shape)}")


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


def _loss_names(loss) -> tuple:
    """loss: one of PREFERENCE_LOSSES, or a non-empty list (or tuple) of DPO_LOSSES; as a tuple."""
    if not isinstance(loss, (list, tuple)):
        r.one_of("loss", loss, PREFERENCE_LOSSES, "one of " + ", ".join(PREFERENCE_LOSSES) + " (or a list of DPO's)")
        return (loss,)
    if not loss:
        raise ValueError("loss: expected a loss type or a non-empty list of DPO's, got an empty list")
    for name in loss:
        r.one_of("loss", name, DPO_LOSSES, "DPO's loss types in a list (" + ", ".join(DPO_LOSSES) + ")")
    return tuple(loss)


def preference_options(
    loss="dpo",
    beta=0.1,
    gamma=0.5,
    alpha=1.0,
    label_smoothing=0.0,
    loss_weights=None,
    ld_alpha=None,
    f_divergence_type="reverse_kl",
    f_alpha_divergence_coef=0.5,
    discopop_tau=0.05,
    use_weighting=False,
) -> PreferenceOptions:
    """The options alone (FusedLinearPreferenceLoss takes them at construction). A list loss comes
    back as a tuple, loss_weights as a tuple of floats."""
    names = _loss_names(loss)
    _number("beta", beta, 0.0, low_open=True)
    _number("gamma", gamma)
    _number("alpha", alpha)
    _number("label_smoothing", label_smoothing, 0.0, 0.5)
    if "robust" in names and not label_smoothing < 0.5:
        raise ValueError(
            f"label_smoothing: expected a number < 0.5 with loss type 'robust' (the flip probability: it divides by "
            f"1 - 2 label_smoothing), got {label_smoothing}"
        )
    if "exo_pair" in names and not label_smoothing > 0.0:
        raise ValueError(
            f"label_smoothing: expected a number > 0.0 with loss type 'exo_pair' (EXO's epsilon, whose log it takes; "
            f"the paper's 1e-3), got {label_smoothing}"
        )
    if loss_weights is not None:
        if not isinstance(loss_weights, (list, tuple)):
            raise TypeError(
                f"loss_weights: expected None or a list of numbers (one per loss type), got {type(loss_weights).__name__}"
            )
        if len(loss_weights) != len(names):
            raise ValueError(
                f"loss_weights: expected {len(names)} weight(s), one per loss type of loss {list(names)}, got {len(loss_weights)}"
            )
        for w in loss_weights:
            _number("loss_weights", w)
        loss_weights = tuple(loss_weights)
    r.number("ld_alpha", ld_alpha, low=0.0, high=1.0, optional=True, noun="number")
    others = [n for n in names if n not in DPO_LOSSES]
    if ld_alpha is not None and others:
        raise ValueError(
            f"ld_alpha: expected None with loss {others[0]!r} (LD-DPO's weighting of the longer completion's "
            f"extra tokens is for DPO's loss types), got {ld_alpha}"
        )
    r.one_of("f_divergence_type", f_divergence_type, F_DIVERGENCES, "one of " + ", ".join(F_DIVERGENCES))
    others = [n for n in names if n not in F_DIVERGENCE_LOSSES]
    if f_divergence_type != "reverse_kl" and others:
        raise ValueError(
            f"f_divergence_type: expected reverse_kl with loss type {others[0]!r} (the other f-divergences are for "
            f"{', '.join(F_DIVERGENCE_LOSSES)} alone: f-DPO's log Z(x) cancels only in their chosen-rejected "
            f"difference), got {f_divergence_type!r}"
        )
    _number("f_alpha_divergence_coef", f_alpha_divergence_coef)
    _number("discopop_tau", discopop_tau, 0.0, low_open=True)
    r.a_bool("use_weighting", use_weighting)
    if use_weighting:
        raise ValueError(
            "use_weighting: expected False (WPO's weights need each token's sum of squared probabilities over the "
            "vocabulary, from the logits that fused_linear_preference_loss never forms), got True"
        )
    return PreferenceOptions(
        loss if isinstance(loss, str) else names,
        beta,
        gamma,
        alpha,
        label_smoothing,
        loss_weights,
        ld_alpha,
        f_divergence_type,
        f_alpha_divergence_coef,
        discopop_tau,
    )


def preference(hidden_shape, target_shape, reference: dict, loss="dpo", **options) -> PreferenceOptions:
    """hidden [2B, T, H] (B chosen, then B rejected), target [2B, T]; reference: {"ref_hidden":
    shape or None, "ref_weight": ..., "ref_bias": ...}; options: preference_options'."""
    checked = preference_options(loss, **options)
    _sequences(hidden_shape, target_shape)
    if hidden_shape[0] % 2 or hidden_shape[0] == 0:
        raise ValueError(
            f"hidden: expected an even number of sequences > 0 (B chosen, then B rejected), got {hidden_shape[0]} "
            f"(shape {tuple(hidden_shape)})"
        )
    refused = None
    if isinstance(checked.loss, str) and checked.loss not in WITH_REFERENCE:
        refused = f"ref_hidden: loss {loss!r} takes no reference model (those that do: {', '.join(WITH_REFERENCE)})"
    _reference(hidden_shape, reference, refused)
    return checked


def kto_options(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0) -> KTOOptions:
    """The options alone (FusedLinearKTOLoss takes them at construction)."""
    _number("beta", beta, 0.0, low_open=True)
    _number("desirable_weight", desirable_weight, 0.0)
    _number("undesirable_weight", undesirable_weight, 0.0)
    return KTOOptions(beta, desirable_weight, undesirable_weight)


def kto(hidden_shape, target_shape, labels: tuple, kl, reference: dict, **options) -> KTOOptions:
    """hidden [B, T, H] (B > 0), target [B, T]; labels: (shape, dtype) of preference_labels, [B]
    bool; kl: None, a Python number, or (shape, dtype) of a 0-d floating-point array (anything
    else: refused by its type); reference as preference's; options: kto_options'."""
    _sequences(hidden_shape, target_shape)
    if hidden_shape[0] == 0:
        raise ValueError(f"hidden: expected at least one sequence, got shape {tuple(hidden_shape)}")
    labels_shape, labels_dtype = labels
    if labels_dtype != "bool":
        raise TypeError(f"preference_labels: expected dtype bool (True: desirable, False: undesirable), got {labels_dtype}")
    _one_per_sequence("preference_labels", labels_shape, hidden_shape)
    if isinstance(kl, tuple):
        kl_shape, kl_dtype = kl
        if not str(kl_dtype).startswith(("float", "bfloat")):
            raise TypeError(f"kl: expected a floating-point dtype, got {kl_dtype}")
        if tuple(kl_shape) != ():
            raise ValueError(f"kl: expected a scalar (a number or a 0-d array: the KL estimate), got shape {tuple(kl_shape)}")
    elif kl is not None:
        if not r.is_number(kl):
            raise TypeError(f"kl: expected None, a number or a 0-d array (the KL estimate), got {type(kl).__name__}")
        _number("kl", kl)
    checked = kto_options(**options)
    _reference(hidden_shape, reference)
    return checked


def grpo(
    hidden_shape, target_shape, advantages_shape, logps: dict, num_items_in_batch=None, return_per_token=False, **options
) -> GRPOOptions:
    """hidden [B, T, H], target [B, T], advantages [B]; logps: {"old_logps": shape or None,
    "ref_logps": ...}, each [B, T]; num_items_in_batch: None, a Python number or (shape, dtype)
    of a 0-d array (anything else: refused by its type), taken by the loss types of BY_NUM_ITEMS
    alone; return_per_token a bool; options: GRPOOptions' fields. epsilon_high None comes back as
    epsilon_low."""
    r.a_bool("return_per_token", return_per_token)
    use_bias_correction_kl = options.get("use_bias_correction_kl", False)
    loss_type = options.get("loss_type", "grpo")
    r.a_bool("use_bias_correction_kl", use_bias_correction_kl)
    r.one_of("loss_type", loss_type, GRPO_LOSS_TYPES, "one of " + ", ".join(GRPO_LOSS_TYPES))
    level = options.get("importance_sampling_level", "token")
    r.one_of("importance_sampling_level", level, IMPORTANCE_SAMPLING_LEVELS, "one of token, sequence")
    _sequences(hidden_shape, target_shape)
    _one_per_sequence("advantages", advantages_shape, hidden_shape)
    for name, shape in logps.items():
        if shape is not None:
            r.same_shape(name, shape, hidden_shape[:2], "target's")
    if num_items_in_batch is not None and loss_type not in BY_NUM_ITEMS:
        raise ValueError(
            f"num_items_in_batch: taken by loss_type {', '.join(BY_NUM_ITEMS)} alone (their normalizer), "
            f"got loss_type {loss_type!r}"
        )
    if isinstance(num_items_in_batch, tuple):
        shape, dtype = num_items_in_batch
        if tuple(shape) != ():
            raise ValueError(f"num_items_in_batch: expected a scalar (a number or a 0-d array), got shape {tuple(shape)}")
        if dtype == "bool":
            raise TypeError(f"num_items_in_batch: expected a number dtype, got {dtype}")
    elif num_items_in_batch is not None:
        if not r.is_number(num_items_in_batch):
            raise TypeError(
                f"num_items_in_batch: expected None, a number or a 0-d array (the accumulated batch's count of "
                f"tokens), got {type(num_items_in_batch).__name__}"
            )
        _number("num_items_in_batch", num_items_in_batch, 0.0)
    checked = GRPOOptions(**options)
    _number("beta", checked.beta, 0.0)
    _number("epsilon_low", checked.epsilon_low, 0.0)
    if checked.epsilon_high is None:
        checked = replace(checked, epsilon_high=checked.epsilon_low)
    _number("epsilon_high", checked.epsilon_high, 0.0)
    r.count("max_completion_length", checked.max_completion_length)
    if checked.delta is not None:
        _number("delta", checked.delta, 0.0, low_open=True)
    _number("temperature", checked.temperature, 0.0, low_open=True)
    _number("sapo_temperature_neg", checked.sapo_temperature_neg, 0.0, low_open=True)
    _number("sapo_temperature_pos", checked.sapo_temperature_pos, 0.0, low_open=True)
    for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        _number(name, getattr(checked, name), 0.0)
    _number("top_entropy_quantile", checked.top_entropy_quantile, 0.0, 1.0)
    _number("entropy_coef", checked.entropy_coef)
    return checked


# --- the table of bad values (tests/test_spec.py) -----------------------------------------------

HIDDEN, WEIGHT, TARGET = Array((2, 3, 4)), Array((5, 4)), Array((2, 3), "int32")
EXAMPLES = {
    "fused_linear_preference_loss": {"hidden": HIDDEN, "weight": WEIGHT, "target": TARGET},
    "fused_linear_kto_loss": {
        "hidden": HIDDEN,
        "weight": WEIGHT,
        "target": TARGET,
        "preference_labels": Array((2,), "bool"),
        "kl": 0.1,
    },
    "fused_linear_grpo_loss": {"hidden": HIDDEN, "weight": WEIGHT, "target": TARGET, "advantages": Array((2,))},
}
P, K, G = ("fused_linear_preference_loss",), ("fused_linear_kto_loss",), ("fused_linear_grpo_loss",)
ALL = P + K + G
REF = {"ref_hidden": Array((2, 3, 6)), "ref_weight": Array((5, 6))}
REFUSALS = [
    Refusal(
        ALL, {"hidden": Array((6, 4)), "target": Array((6,), "int32")}, ValueError, "hidden: expected shape [sequences, T, H]"
    ),
    Refusal(ALL, {"target": Array((2, 2), "int32")}, ValueError, "target: expected shape (2, 3) (the sequences and positions of"),
    # preference
    Refusal(P, {"loss": "kto"}, ValueError, "loss: expected one of dpo, sigmoid, hinge, ipo, exo_pair, nca_pair, robust"),
    Refusal(P, {"loss": None}, TypeError, "loss: expected one of dpo, sigmoid, hinge, ipo, exo_pair, nca_pair, robust"),
    Refusal(P, {"loss": []}, ValueError, "loss: expected a loss type or a non-empty list of DPO's, got an empty list"),
    Refusal(P, {"loss": ["sigmoid", "simpo"]}, ValueError, "loss: expected DPO's loss types in a list (dpo, sigmoid, hinge"),
    Refusal(P, {"loss": ("hinge", 1)}, TypeError, "loss: expected DPO's loss types in a list (dpo, sigmoid, hinge, ipo,"),
    Refusal(
        P,
        {"loss": ["sigmoid", "robust"], "label_smoothing": 0.5},
        ValueError,
        "label_smoothing: expected a number < 0.5 with loss type 'robust' (the flip probability: it divides by",
    ),
    Refusal(
        P, {"loss": "exo_pair"}, ValueError, "label_smoothing: expected a number > 0.0 with loss type 'exo_pair' (EXO's epsilon"
    ),
    Refusal(
        P, {"loss_weights": 1.0}, TypeError, "loss_weights: expected None or a list of numbers (one per loss type), got float"
    ),
    Refusal(
        P,
        {"loss": ["sigmoid", "sft"], "loss_weights": [1.0]},
        ValueError,
        "loss_weights: expected 2 weight(s), one per loss type of loss ['sigmoid', 'sft'], got 1",
    ),
    Refusal(P, {"loss_weights": [float("nan")]}, ValueError, "loss_weights: expected a finite number, got nan"),
    Refusal(P, {"ld_alpha": 1.5}, ValueError, "ld_alpha: expected None or a number in [0.0, 1.0], got 1.5"),
    Refusal(P, {"ld_alpha": "0.5"}, TypeError, "ld_alpha: expected None or a Python float, got str"),
    Refusal(P, {"loss": "orpo", "ld_alpha": 0.5}, ValueError, "ld_alpha: expected None with loss 'orpo' (LD-DPO's weighting"),
    Refusal(
        P, {"f_divergence_type": "kl"}, ValueError, "f_divergence_type: expected one of reverse_kl, forward_kl, js_divergence"
    ),
    Refusal(
        P,
        {"loss": ["sigmoid", "nca_pair"], "f_divergence_type": "forward_kl"},
        ValueError,
        "f_divergence_type: expected reverse_kl with loss type 'nca_pair' (the other f-divergences are for dpo,",
    ),
    Refusal(P, {"f_alpha_divergence_coef": float("nan")}, ValueError, "f_alpha_divergence_coef: expected a finite number"),
    Refusal(P, {"discopop_tau": 0.0}, ValueError, "discopop_tau: expected a number > 0.0, got 0.0"),
    Refusal(P, {"use_weighting": 1}, TypeError, "use_weighting: expected a bool, got int"),
    Refusal(
        P,
        {"use_weighting": True},
        ValueError,
        "use_weighting: expected False (WPO's weights need each token's sum of squared probabilities over the",
    ),
    Refusal(
        P,
        {"hidden": Array((3, 3, 4)), "target": Array((3, 3), "int32")},
        ValueError,
        "hidden: expected an even number of sequences > 0 (B chosen, then B rejected), got 3",
    ),
    Refusal(P, {"beta": "0.1"}, TypeError, "beta: expected a Python float, got str"),
    Refusal(P, {"beta": -1.0}, ValueError, "beta: expected a number > 0.0, got -1.0"),
    Refusal(P, {"gamma": float("inf")}, ValueError, "gamma: expected a finite number, got inf"),
    Refusal(P, {"alpha": float("nan")}, ValueError, "alpha: expected a finite number, got nan"),
    Refusal(P, {"label_smoothing": -0.1}, ValueError, "label_smoothing: expected a number >= 0.0, got -0.1"),
    Refusal(P, {"label_smoothing": 0.7}, ValueError, "label_smoothing: expected a number <= 0.5, got 0.7"),
    Refusal(P + K, {"ref_hidden": HIDDEN}, ValueError, "ref_weight: expected with ref_hidden"),
    Refusal(P + K, {"ref_bias": Array((5,))}, ValueError, "ref_bias: expected only with ref_hidden and ref_weight"),
    Refusal(P, {"loss": "simpo", **REF}, ValueError, "ref_hidden: loss 'simpo' takes no reference model (those that do: dpo"),
    Refusal(P + K, {**REF, "ref_hidden": Array((2, 2, 6))}, ValueError, "ref_hidden: expected shape [2, 3, H_ref] (hidden's"),
    Refusal(P + K, {**REF, "ref_weight": Array((5, 4))}, ValueError, "ref_weight: expected shape [V, 6] (H_ref: the last"),
    # kto
    Refusal(
        K,
        {"hidden": Array((0, 3, 4)), "target": Array((0, 3), "int32"), "preference_labels": Array((0,), "bool")},
        ValueError,
        "hidden: expected at least one sequence, got shape (0, 3, 4)",
    ),
    Refusal(K, {"preference_labels": Array((2,))}, TypeError, "preference_labels: expected dtype bool (True: desirable, False:"),
    Refusal(
        K, {"preference_labels": Array((3,), "bool")}, ValueError, "preference_labels: expected shape (2,) (one per sequence"
    ),
    Refusal(K, {"kl": Array((), "int32")}, TypeError, "kl: expected a floating-point dtype, got int32"),
    Refusal(K, {"kl": Array((2,))}, ValueError, "kl: expected a scalar (a number or a 0-d array: the KL estimate), got shape"),
    Refusal(K, {"kl": "0.1"}, TypeError, "kl: expected None, a number or a 0-d array (the KL estimate), got str"),
    Refusal(K, {"kl": float("nan")}, ValueError, "kl: expected a finite number, got nan"),
    Refusal(K, {"beta": 0.0}, ValueError, "beta: expected a number > 0.0, got 0.0"),
    Refusal(K, {"desirable_weight": -1.0}, ValueError, "desirable_weight: expected a number >= 0.0, got -1.0"),
    Refusal(K, {"undesirable_weight": float("inf")}, ValueError, "undesirable_weight: expected a finite number, got inf"),
    # grpo
    Refusal(G, {"use_bias_correction_kl": 1}, TypeError, "use_bias_correction_kl: expected a bool, got int"),
    Refusal(G, {"loss_type": "gspo"}, ValueError, "loss_type: expected one of grpo, bnpo, dr_grpo, dapo, cispo, sapo"),
    Refusal(G, {"importance_sampling_level": "seq"}, ValueError, "importance_sampling_level: expected one of token, sequence"),
    Refusal(G, {"num_items_in_batch": 8.0}, ValueError, "num_items_in_batch: taken by loss_type dapo, cispo, vespo alone"),
    Refusal(
        G,
        {"loss_type": "dapo", "num_items_in_batch": Array((1,))},
        ValueError,
        "num_items_in_batch: expected a scalar (a number or a 0-d array), got shape (1,)",
    ),
    Refusal(
        G, {"loss_type": "dapo", "num_items_in_batch": Array((), "bool")}, TypeError, "num_items_in_batch: expected a number"
    ),
    Refusal(G, {"loss_type": "cispo", "num_items_in_batch": "8"}, TypeError, "num_items_in_batch: expected None, a number or a"),
    Refusal(G, {"loss_type": "vespo", "num_items_in_batch": -1.0}, ValueError, "num_items_in_batch: expected a number >= 0.0"),
    Refusal(G, {"delta": 0.0}, ValueError, "delta: expected a number > 0.0, got 0.0"),
    Refusal(G, {"temperature": 0.0}, ValueError, "temperature: expected a number > 0.0, got 0.0"),
    Refusal(G, {"sapo_temperature_neg": -1.0}, ValueError, "sapo_temperature_neg: expected a number > 0.0, got -1.0"),
    Refusal(G, {"sapo_temperature_pos": float("nan")}, ValueError, "sapo_temperature_pos: expected a finite number, got nan"),
    Refusal(G, {"vespo_k_pos": -1.0}, ValueError, "vespo_k_pos: expected a number >= 0.0, got -1.0"),
    Refusal(G, {"vespo_lambda_neg": "2"}, TypeError, "vespo_lambda_neg: expected a Python float, got str"),
    Refusal(G, {"top_entropy_quantile": 1.5}, ValueError, "top_entropy_quantile: expected a number <= 1.0, got 1.5"),
    Refusal(G, {"top_entropy_quantile": -0.5}, ValueError, "top_entropy_quantile: expected a number >= 0.0, got -0.5"),
    Refusal(G, {"entropy_coef": float("inf")}, ValueError, "entropy_coef: expected a finite number, got inf"),
    Refusal(G, {"entropy_coef": None}, TypeError, "entropy_coef: expected a Python float, got NoneType"),
    Refusal(G, {"return_per_token": 1}, TypeError, "return_per_token: expected a bool, got int"),
    Refusal(G, {"advantages": Array((3,))}, ValueError, "advantages: expected shape (2,) (one per sequence of hidden (2, 3, 4))"),
    Refusal(G, {"ref_logps": Array((2, 2))}, ValueError, "ref_logps: expected shape (2, 3) (target's), got (2, 2)"),
    Refusal(G, {"beta": -0.1}, ValueError, "beta: expected a number >= 0.0, got -0.1"),
    Refusal(G, {"epsilon_low": -1}, ValueError, "epsilon_low: expected a number >= 0.0, got -1"),
    Refusal(G, {"epsilon_high": "0.2"}, TypeError, "epsilon_high: expected a Python float, got str"),
    Refusal(G, {"max_completion_length": 0}, ValueError, "max_completion_length: expected None or an int >= 1, got 0"),
    Refusal(G, {"max_completion_length": 2.0}, TypeError, "max_completion_length: expected None or an int, got float"),
]
