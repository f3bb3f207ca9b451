"""fuselet.torch's post-training losses against TRL's own trainers: each test builds the trainer on a
tiny random Llama (float32, CPU) with an in-memory tokenizer and dataset, computes a batch's loss with
the trainer's compute_loss and backpropagates it; the fused op then takes the same batch's last
hidden states (caught at the backbone's output) and lm_head weight, and its loss and its gradients
with respect to both must be TRL's. The reference is TRL's code itself, never its math written out
again: DPOTrainer (every loss_type of TRL 1.16, their weighted sums, ld_alpha, every
f_divergence_type), CPOTrainer (its reference-free sigmoid, hinge and ipo, cpo, simpo),
ORPOTrainer, KTOTrainer and GRPOTrainer (every loss_type of TRL 1.16: grpo, bnpo, dr_grpo, dapo,
cispo, sapo, luspo, vespo; token and sequence importance sampling, two-sided clipping, the
logits' temperature, the high-entropy token mask and the entropy bonus)."""

from __future__ import annotations

import warnings

import pytest

from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
trl = pytest.importorskip("trl", reason="trl is not installed: fuselet's losses cannot be compared with TRL's here")
transformers = pytest.importorskip("transformers", reason="transformers is not installed in this environment")
ft = import_layer("torch")

from datasets import Dataset  # noqa: E402  (trl's own dependency)
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402  (transformers' own dependency)

with warnings.catch_warnings():  # CPO and ORPO live in trl.experimental, whose import warns so
    warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

RTOL = 1e-5
WORDS = "the a cat dog sat ran on under mat rug big small red blue and then".split()
VOCAB = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
# Prompts of one token: ORPO's NLL (over the prompt and the completion in TRL) is then the
# completion's, as the first token is never a label.
PROMPTS_1 = ["the", "a", "big"]
PROMPTS = ["the cat", "a dog sat on", "the big red"]
CHOSEN = [" sat on the mat", " the rug", " dog"]
REJECTED = [" ran", " a mat and then", " cat sat"]


@pytest.fixture
def tokenizer():
    return make_tokenizer()


def make_tokenizer():
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def tiny_llama(seed: int, hidden_size: int = 16):
    """A one-layer Llama, its lm_head its own (untied: its gradient is the head's alone); weights
    drawn wide (std 0.5) so that the log-probabilities spread and hinge / clipping regions are hit
    (hidden_size: a wider one, as a distillation's teacher)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        initializer_range=0.5,
        pad_token_id=VOCAB["<pad>"],
        eos_token_id=VOCAB["</s>"],
        bos_token_id=None,
    )
    return transformers.LlamaForCausalLM(config).float()


def trl_args(tmp_path):
    """The options every trainer takes here: float32 on the CPU, no logging."""
    return {"output_dir": str(tmp_path), "report_to": "none", "use_cpu": True, "bf16": False}


class Backbone:
    """The last hidden states of each call of model's backbone (model.model), with the input_ids of
    the call; those of a call under autograd keep their gradient (retain_grad)."""

    def __init__(self, model):
        self.calls = []
        model.model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        h = out.last_hidden_state
        if h.requires_grad:
            h.retain_grad()
        self.calls.append((ids, h))

    def of(self, input_ids):
        """The hidden states of the last call on input_ids."""
        for ids, h in reversed(self.calls):
            if ids.shape == input_ids.shape and torch.equal(ids, input_ids):
                return h
        raise AssertionError("the backbone never ran on these input_ids")


# A loss is a sum of per-token terms built from log-probabilities (|log p| of order log V
# here): each term carries their float32 rounding, about 1e-6, however much the terms then cancel
# (VESPO's loss of 0.04 differed from TRL's by 1.06e-6 under torch's AVX2 kernels, 2.4e-5 of
# itself, and by less under its AVX-512 ones). So a loss is judged at a scale of at least 1.
LOSS_SCALE = 1.0


def assert_close(name, got, want):
    """|got - want| <= RTOL * max|want| over the tensor (a gradient's small entries by its scale;
    a loss by at least LOSS_SCALE)."""
    got, want = got.detach(), want.detach()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, TRL's {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    assert want.abs().max().item() > 0, f"{name}: TRL's is all zero, which tests nothing"
    scale = max(want.abs().max().item(), LOSS_SCALE if name == "loss" else 0.0)
    assert err <= RTOL * scale, f"{name}: max |fuselet - TRL| = {err:.3g}, {err / scale:.3g} of TRL's scale {scale:.3g}"


def check_against_trl(trl_loss, hidden, head, fused):
    """trl_loss: TRL's loss, not yet backpropagated; hidden: the policy's last hidden states in TRL's
    graph (retain_grad) and head its lm_head; fused(h, w): fuselet's loss of detached copies. Loss
    and gradients with respect to the hidden states and the head's weight must agree."""
    head.weight.grad = None
    trl_loss.backward()
    h = hidden.detach().clone().requires_grad_(True)
    w = head.weight.detach().clone().requires_grad_(True)
    loss = fused(h, w)
    assert loss.dtype == torch.float32 and loss.shape == ()
    dh, dw = torch.autograd.grad(loss, (h, w))
    assert_close("loss", loss, trl_loss)
    assert_close("d hidden", dh, hidden.grad)
    assert_close("d weight", dw, head.weight.grad)


def completion_target(input_ids, completion_mask):
    """The next-token labels of TRL's concatenated batches: input_ids[:, 1:], -100 outside the completion."""
    return input_ids.masked_fill(completion_mask == 0, -100)[:, 1:]


# --- DPOTrainer: its loss_type against fuselet's loss, with a reference model -----------------------


def dpo_step(tmp_path, tokenizer, pairs=(0, 1, 2), ref_seed=1, **config):
    """DPOTrainer's loss of a batch of the pairs of PROMPTS / CHOSEN / REJECTED `pairs` (indices, in
    that order) under DPOConfig options `config` (beta 0.5 unless given), policy and reference two
    tiny Llamas (the reference's drawn with ref_seed). Returns TRL's loss (not
    backpropagated), the policy's last hidden states and its head, and fuselet's arguments but
    hidden / weight / the options (the target and the reference model's hidden states and head)."""
    policy, ref = tiny_llama(0), tiny_llama(ref_seed)
    data = Dataset.from_dict(
        {k: [v[i] for i in pairs] for k, v in (("prompt", PROMPTS), ("chosen", CHOSEN), ("rejected", REJECTED))}
    )
    config = {"beta": 0.5, **config}
    args = trl.DPOConfig(**trl_args(tmp_path), per_device_train_batch_size=len(pairs), **config)
    trainer = trl.DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    seen, ref_seen = Backbone(policy), Backbone(ref)
    trl_loss = trainer.compute_loss(policy, batch)
    ids = batch["input_ids"]
    fused_args = {
        "target": completion_target(ids, batch["completion_mask"]),
        "ref_hidden": ref_seen.of(ids)[:, :-1],
        "ref_weight": ref.lm_head.weight.detach(),
    }
    return trl_loss, seen.of(ids), policy.lm_head, fused_args


@pytest.mark.parametrize(("loss_type", "loss"), [("sigmoid", "dpo"), ("hinge", "hinge"), ("ipo", "ipo")])
def test_dpo_trainer(tmp_path, tokenizer, loss_type, loss):
    """fuselet's own names: "dpo" is DPOTrainer's sigmoid (without label smoothing)."""
    trl_loss, hidden, head, fused_args = dpo_step(tmp_path, tokenizer, loss_type=[loss_type])

    def fused(h, w):
        return ft.fused_linear_preference_loss(h[:, :-1], w, loss=loss, beta=0.5, **fused_args)

    check_against_trl(trl_loss, hidden, head, fused)


# DPOConfig options -> fuselet's options that change the loss (None: none asked): each case first
# shows that its option does change fuselet's loss on this batch, so that it tests something.
# fuselet takes DPOConfig's options under their names, loss_type as `loss`.
F_DIVERGENCE_TYPES = ["sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft"]  # and sigmoid
DPO_CASES = {
    # every loss type alone, TRL's defaults but beta (and label_smoothing where it takes one)
    "sigmoid": ({"loss_type": ["sigmoid"]}, {"loss": ["hinge"]}),
    "hinge": ({"loss_type": ["hinge"]}, None),
    "ipo": ({"loss_type": ["ipo"]}, None),
    "exo_pair": ({"loss_type": ["exo_pair"], "label_smoothing": 1e-3}, {"label_smoothing": 0.1}),
    "nca_pair": ({"loss_type": ["nca_pair"]}, None),
    "robust": ({"loss_type": ["robust"], "label_smoothing": 0.1}, {"label_smoothing": 0.0}),
    "bco_pair": ({"loss_type": ["bco_pair"]}, None),
    "sppo_hard": ({"loss_type": ["sppo_hard"]}, None),
    "aot": ({"loss_type": ["aot"]}, {"loss": ["sigmoid"]}),  # sorted over the 3 pairs: not the pairs' own
    "aot-smoothed": ({"loss_type": ["aot"], "label_smoothing": 0.2}, {"label_smoothing": 0.0}),
    "aot_unpaired": ({"loss_type": ["aot_unpaired"]}, {"loss": ["sigmoid"]}),
    "aot_unpaired-smoothed": ({"loss_type": ["aot_unpaired"], "label_smoothing": 0.3}, {"label_smoothing": 0.0}),
    "apo_zero": ({"loss_type": ["apo_zero"]}, None),
    "apo_down": ({"loss_type": ["apo_down"]}, None),
    "discopop": ({"loss_type": ["discopop"]}, None),
    "discopop-tau": ({"loss_type": ["discopop"], "discopop_tau": 0.7}, {"discopop_tau": 0.05}),
    "sft": ({"loss_type": ["sft"]}, None),
    "sigmoid_norm": ({"loss_type": ["sigmoid_norm"]}, {"loss": ["sigmoid"]}),
    # DPOTrainer's sigmoid takes no label smoothing (fuselet's "dpo" does)
    "sigmoid-unsmoothed": ({"loss_type": ["sigmoid"], "label_smoothing": 0.2}, {"loss": ["dpo"]}),
    # MPO: several loss types, their losses weighted and summed (TRL's example weights), or 1 each
    "mpo": ({"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0]}, {"loss_weights": None}),
    "unweighted": ({"loss_type": ["hinge", "nca_pair", "apo_down"]}, {"loss": ["hinge"]}),
    # LD-DPO: the tokens past the pair's shorter completion weighted by ld_alpha, policy and reference
    "ld_alpha": ({"loss_type": ["sigmoid"], "ld_alpha": 0.5}, {"ld_alpha": None}),
    "ld_alpha-0": ({"loss_type": ["ipo", "aot"], "ld_alpha": 0.0}, {"ld_alpha": 1.0}),
    "ld_alpha-mpo": (
        {"loss_type": ["apo_zero", "sppo_hard", "sft"], "loss_weights": [1.0, 0.01, 0.5], "ld_alpha": 0.3},
        {"ld_alpha": None},
    ),
    # f-DPO: each f-divergence with every loss type that takes one (alone and summed)
    **{
        f"{f}-sigmoid": ({"loss_type": ["sigmoid"], "f_divergence_type": f}, {"f_divergence_type": "reverse_kl"})
        for f in ("forward_kl", "js_divergence", "alpha_divergence")
    },
    **{
        f"{f}-all": (
            {"loss_type": F_DIVERGENCE_TYPES, "f_divergence_type": f, "label_smoothing": 0.1},
            {"f_divergence_type": "reverse_kl"},
        )
        for f in ("forward_kl", "js_divergence", "alpha_divergence")
    },
    "alpha_divergence-coef": (
        {"loss_type": ["sigmoid", "ipo"], "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 1.3},
        {"f_alpha_divergence_coef": 0.5},
    ),
    # within 1e-6 of 1: the limit, reverse KL
    "alpha_divergence-1": (
        {"loss_type": ["sigmoid"], "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 1.0},
        {"f_alpha_divergence_coef": 0.5},
    ),
    "js_divergence-ld_alpha": (
        {"loss_type": ["sigmoid_norm", "robust"], "f_divergence_type": "js_divergence", "ld_alpha": 0.4},
        {"ld_alpha": None},
    ),
}


def fuselet_options(config):
    """fuselet's options of a DPOConfig's: the same names, loss_type as loss, beta 0.5 unless given."""
    return {"beta": 0.5, **{("loss" if k == "loss_type" else k): v for k, v in config.items()}}


@pytest.mark.parametrize("case", list(DPO_CASES))
def test_dpo_trainer_loss_types(tmp_path, tokenizer, case):
    """TRL 1.16's DPOTrainer: every loss_type, their weighted sums (loss_weights), ld_alpha and
    f_divergence_type (with f_alpha_divergence_coef), discopop_tau and label_smoothing where a loss
    takes them: fuselet's fused_linear_preference_loss under the DPOConfig's own options gives the
    trainer's loss and gradients."""
    config, unlike = DPO_CASES[case]
    # aot sorts the pairs by the policy's and the reference's chosen-rejected differences,
    # aot_unpaired by the chosen and the rejected log-ratios: here they order the batch's pairs
    # (2, 0, 1), (2, 1, 0), (0, 2, 1) and (1, 2, 0), none in the batch's order
    trl_loss, hidden, head, fused_args = dpo_step(tmp_path, tokenizer, pairs=(2, 1, 0), ref_seed=4, **config)
    options = fuselet_options(config)
    if unlike is not None:
        with torch.no_grad():
            h, w = hidden.detach()[:, :-1], head.weight.detach()
            same = ft.fused_linear_preference_loss(h, w, **fused_args, **options)
            other = ft.fused_linear_preference_loss(h, w, **fused_args, **{**options, **unlike})
            assert abs(same.item() - other.item()) > 1e-4 * max(abs(same.item()), 1.0), f"{unlike} should change the loss"

    def fused(h, w):
        return ft.fused_linear_preference_loss(h[:, :-1], w, **fused_args, **options)

    check_against_trl(trl_loss, hidden, head, fused)


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"loss_type": ["sigmoid", "nca_pair"], "f_divergence_type": "forward_kl"}, "f_divergence_type"),
        ({"loss_type": ["aot"], "f_divergence_type": "js_divergence"}, "f_divergence_type"),
        ({"loss_type": ["exo_pair"]}, "label_smoothing"),
        ({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}, "loss_weights"),
    ],
    ids=["f-divergence-nca_pair", "f-divergence-aot", "exo_pair-unsmoothed", "loss_weights-short"],
)
def test_dpo_trainer_refusals(tmp_path, tokenizer, config, name):
    """What DPOConfig or DPOTrainer refuses, fuselet refuses too, naming the option."""
    with pytest.raises(ValueError):
        dpo_step(tmp_path, tokenizer, **config)
    h, w, t = torch.zeros(2, 3, 4), torch.zeros(5, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        ft.fused_linear_preference_loss(h, w, t, **fuselet_options(config))


def test_dpo_label_smoothing(tmp_path, tokenizer):
    """DPO with label smoothing (the conservative DPO) against a reference model. TRL's DPOTrainer
    smooths no "sigmoid" loss; its "aot" is that loss of the batch's sorted log-ratios, which on one
    pair are the pair's own: fuselet's dpo with label_smoothing."""
    policy, ref = tiny_llama(0), tiny_llama(1)
    data = Dataset.from_dict({"prompt": PROMPTS[1:2], "chosen": CHOSEN[1:2], "rejected": REJECTED[1:2]})
    args = trl.DPOConfig(**trl_args(tmp_path), loss_type=["aot"], beta=0.5, label_smoothing=0.2, per_device_train_batch_size=1)
    trainer = trl.DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    seen, ref_seen = Backbone(policy), Backbone(ref)
    trl_loss = trainer.compute_loss(policy, batch)
    ids = batch["input_ids"]
    target = completion_target(ids, batch["completion_mask"])

    def fused(h, w):
        return ft.fused_linear_preference_loss(
            h[:, :-1],
            w,
            target,
            loss="dpo",
            beta=0.5,
            label_smoothing=0.2,
            ref_hidden=ref_seen.of(ids)[:, :-1],
            ref_weight=ref.lm_head.weight.detach(),
        )

    check_against_trl(trl_loss, seen.of(ids), policy.lm_head, fused)


# --- CPOTrainer (trl.experimental): the reference-free losses, CPO and SimPO -------------------------


def cpo_batch(trainer, model):
    """A CPO / ORPO batch of the whole dataset: the collated batch, TRL's concatenated one, the
    backbone watcher."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    concatenated = trainer.concatenated_inputs(batch, is_encoder_decoder=False, padding_value=VOCAB["<pad>"])
    return batch, concatenated, Backbone(model)


@pytest.mark.parametrize(
    ("loss_type", "cpo_alpha", "label_smoothing", "loss", "options"),
    [
        # cpo_alpha 0: DPO's losses without a reference model
        ("sigmoid", 0.0, 0.0, "dpo", {}),
        ("sigmoid", 0.0, 0.2, "dpo", {}),
        ("hinge", 0.0, 0.0, "hinge", {}),
        ("ipo", 0.0, 0.0, "ipo", {}),
        # CPO: the sigmoid loss plus cpo_alpha times the chosen completions' NLL (fuselet's alpha)
        ("sigmoid", 1.0, 0.0, "cpo", {"alpha": 1.0}),
        ("sigmoid", 0.7, 0.1, "cpo", {"alpha": 0.7}),
        # SimPO: CPOTrainer's "simpo" without the NLL (cpo_alpha 0); simpo_gamma is fuselet's gamma
        ("simpo", 0.0, 0.0, "simpo", {"gamma": 0.8}),
        ("simpo", 0.0, 0.15, "simpo", {"gamma": 0.8}),
    ],
    ids=["dpo-free", "dpo-free-smoothed", "hinge-free", "ipo-free", "cpo", "cpo-smoothed", "simpo", "simpo-smoothed"],
)
def test_cpo_trainer(tmp_path, tokenizer, loss_type, cpo_alpha, label_smoothing, loss, options):
    policy = tiny_llama(0)
    data = Dataset.from_dict({"prompt": PROMPTS, "chosen": CHOSEN, "rejected": REJECTED})
    args = CPOConfig(
        **trl_args(tmp_path),
        loss_type=loss_type,
        beta=0.5,
        cpo_alpha=cpo_alpha,
        label_smoothing=label_smoothing,
        simpo_gamma=options.get("gamma", 0.5),
        max_length=64,
    )
    trainer = CPOTrainer(model=policy, args=args, train_dataset=data, processing_class=tokenizer)
    batch, concatenated, seen = cpo_batch(trainer, policy)
    trl_loss = trainer.compute_loss(policy, batch)
    ids, target = concatenated["concatenated_input_ids"], concatenated["concatenated_labels"][:, 1:]

    def fused(h, w):
        return ft.fused_linear_preference_loss(
            h[:, :-1], w, target, loss=loss, beta=0.5, label_smoothing=label_smoothing, **options
        )

    check_against_trl(trl_loss, seen.of(ids), policy.lm_head, fused)


# --- ORPOTrainer (trl.experimental) ----------------------------------------------------------------


def orpo_trainer(tmp_path, tokenizer, policy, prompts):
    data = Dataset.from_dict({"prompt": prompts, "chosen": CHOSEN, "rejected": REJECTED})
    args = ORPOConfig(**trl_args(tmp_path), beta=0.3, max_length=64)
    return ORPOTrainer(model=policy, args=args, train_dataset=data, processing_class=tokenizer)


def test_orpo_trainer(tmp_path, tokenizer):
    """One-token prompts: TRL's NLL over the chosen prompt and completion is the completion's."""
    policy = tiny_llama(0)
    trainer = orpo_trainer(tmp_path, tokenizer, policy, PROMPTS_1)
    batch, concatenated, seen = cpo_batch(trainer, policy)
    trl_loss = trainer.compute_loss(policy, batch)
    ids, target = concatenated["concatenated_input_ids"], concatenated["concatenated_labels"][:, 1:]

    def fused(h, w):
        return ft.fused_linear_preference_loss(h[:, :-1], w, target, loss="orpo", beta=0.3)

    check_against_trl(trl_loss, seen.of(ids), policy.lm_head, fused)


def test_orpo_trainer_prompt_nll(tmp_path, tokenizer):
    """Longer prompts: TRL's ORPO NLL counts the chosen prompt's tokens too (its odds ratio the
    completions' alone); fuselet's orpo counts the target's tokens in both. TRL's loss is fuselet's
    orpo less its NLL (fused_linear_cross_entropy of the chosen half) plus the NLL of the chosen
    sequences whole."""
    policy = tiny_llama(0)
    trainer = orpo_trainer(tmp_path, tokenizer, policy, PROMPTS)
    batch, concatenated, seen = cpo_batch(trainer, policy)
    trl_loss = trainer.compute_loss(policy, batch)
    ids, target = concatenated["concatenated_input_ids"], concatenated["concatenated_labels"][:, 1:]
    whole = ids.masked_fill(concatenated["concatenated_attention_mask"] == 0, -100)[:, 1:]
    b = ids.shape[0] // 2

    def orpo(h, w):
        return ft.fused_linear_preference_loss(h[:, :-1], w, target, loss="orpo", beta=0.3)

    def nll(h, w, labels):
        return ft.fused_linear_cross_entropy(h[:b, :-1], w, labels[:b])

    with torch.no_grad():
        h, w = seen.of(ids).detach(), policy.lm_head.weight.detach()
        assert abs(orpo(h, w).item() - trl_loss.item()) > 1e-3, "the prompts' NLL should tell the two apart"

    check_against_trl(trl_loss, seen.of(ids), policy.lm_head, lambda h, w: orpo(h, w) - nll(h, w, target) + nll(h, w, whole))


# --- KTOTrainer ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("desirable_weight", "undesirable_weight"), [(1.0, 1.0), (1.3, 0.6)])
def test_kto_trainer(tmp_path, tokenizer, desirable_weight, undesirable_weight):
    """TRL's KL estimate (the mean log-ratio of the batch's mismatched prompt / completion pairs,
    clamped at 0), as the trainer logs it, is the caller's kl here."""
    policy, ref = tiny_llama(0), tiny_llama(2)  # a reference whose KL estimate is > 0 (not clamped)
    data = Dataset.from_dict(
        {
            "prompt": PROMPTS + PROMPTS,
            "completion": CHOSEN + REJECTED,
            "label": [True, True, False, False, True, False],
        }
    )
    args = trl.KTOConfig(
        **trl_args(tmp_path),
        beta=0.4,
        desirable_weight=desirable_weight,
        undesirable_weight=undesirable_weight,
        per_device_train_batch_size=6,
    )
    trainer = trl.KTOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(6)])
    seen, ref_seen = Backbone(policy), Backbone(ref)
    trl_loss = trainer.compute_loss(policy, batch)
    kl = trainer._metrics["train"]["kl"][-1]
    assert kl > 0
    ids = batch["input_ids"]
    target = completion_target(ids, batch["completion_mask"])

    def fused(h, w):
        return ft.fused_linear_kto_loss(
            h[:, :-1],
            w,
            target,
            batch["label"],
            ref_hidden=ref_seen.of(ids)[:, :-1],
            ref_weight=ref.lm_head.weight.detach(),
            kl=kl,
            beta=0.4,
            desirable_weight=desirable_weight,
            undesirable_weight=undesirable_weight,
        )

    check_against_trl(trl_loss, seen.of(ids), policy.lm_head, fused)


# --- GRPOTrainer -----------------------------------------------------------------------------------


def nudge(model, seed, scale):
    """Moves every weight of model a little (a policy some steps further into training)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# Two prompts, two completions each: prompts left-padded, completions right-padded (TRL's layout)
GRPO_PROMPTS = [["<pad>", "the", "cat"]] * 2 + [["a", "dog", "sat"]] * 2
GRPO_COMPLETIONS = [["sat", "on", "the", "mat", "</s>"], ["ran", "</s>"], ["on", "the", "rug", "and", "then", "ran"], ["</s>"]]


def grpo_step(tmp_path, tokenizer, sampling_policy, reference, num_items_in_batch=None, **options):
    """GRPOTrainer's loss of a generated batch: the inputs its generation step hands compute_loss
    (prompt and completion ids and masks, advantages, the sampling policy's log-probabilities where
    sampling_policy, the reference model's where reference, both made by the trainer's own
    _get_per_token_logps_and_entropies). The reference model is the initial policy, the sampling
    policy that nudged once, the trained policy that nudged twice. Returns TRL's loss (not
    backpropagated), the policy's last hidden states and its head, the completions' first position
    in them, and fuselet's arguments but hidden / weight. num_items_in_batch: the accumulated
    batch's count of tokens the trainer gets (dapo, cispo, vespo divide by it), given to both."""
    tiny_llama(0).save_pretrained(tmp_path / "model")
    args = trl.GRPOConfig(**trl_args(tmp_path / "out"), num_generations=2, per_device_train_batch_size=4, **options)
    trainer = trl.GRPOTrainer(
        model=str(tmp_path / "model"),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["the cat", "a dog sat"]}),
        processing_class=tokenizer,
    )
    # As Trainer's loop: the policy in training mode, one micro-batch per optimizer step
    policy = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    c = max(len(x) for x in GRPO_COMPLETIONS)
    prompt_ids = torch.tensor([[VOCAB[t] for t in x] for x in GRPO_PROMPTS])
    completion_ids = torch.tensor([[VOCAB[t] for t in x] + [VOCAB["<pad>"]] * (c - len(x)) for x in GRPO_COMPLETIONS])
    completion_mask = torch.tensor([[1] * len(x) + [0] * (c - len(x)) for x in GRPO_COMPLETIONS])
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": (prompt_ids != VOCAB["<pad>"]).long(),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([0.9, -0.9, 1.2, -1.2]),
    }
    if num_items_in_batch is not None:
        inputs["num_items_in_batch"] = torch.tensor(float(num_items_in_batch))
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], 1)
    nudge(policy, 1, 0.05)
    with torch.no_grad():
        for key, model, wanted in (
            ("old_per_token_logps", policy, sampling_policy),
            ("ref_per_token_logps", trainer.ref_model, reference),
        ):
            if wanted:
                inputs[key], _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, c)
    nudge(policy, 2, 0.05)
    seen = Backbone(policy)
    trl_loss = trainer.compute_loss(policy, inputs)
    fused_args = {
        "target": completion_ids.masked_fill(completion_mask == 0, -100),
        "advantages": inputs["advantages"],
        "old_logps": inputs.get("old_per_token_logps"),
        "ref_logps": inputs.get("ref_per_token_logps"),
        "beta": trainer.beta,
        "epsilon_low": trainer.epsilon_low,
        "epsilon_high": trainer.epsilon_high,
        "loss_type": trainer.loss_type,
        "max_completion_length": trainer.max_completion_length,
    }
    if num_items_in_batch is not None:
        fused_args["num_items_in_batch"] = inputs["num_items_in_batch"]
    return trainer, trl_loss, seen.of(input_ids), policy.lm_head, prompt_ids.shape[1] - 1, fused_args


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy-kl"])
def test_grpo_trainer(tmp_path, tokenizer, loss_type, off_policy):
    """on-policy: beta 0, no old log-probabilities (ratio 1). off-policy-kl: beta 0.2, asymmetric
    clipping (epsilon 0.2, epsilon_high 0.28) with tokens on both sides of the clip, the KL term
    unweighted (use_bias_correction_kl=False: fuselet's KL term, TRL's default weights it by the
    ratio, see test_grpo_trainer_ratio_weighted_kl). dr_grpo's max_completion_length is not T."""
    options = {"beta": 0.0, "epsilon": 0.2, "max_completion_length": 9}
    if off_policy:
        options = {"beta": 0.2, "epsilon": 0.2, "epsilon_high": 0.28, "max_completion_length": 7}
        options["use_bias_correction_kl"] = False
    trainer, trl_loss, hidden, head, start, fused_args = grpo_step(
        tmp_path, tokenizer, off_policy, off_policy, loss_type=loss_type, **options
    )
    if off_policy:  # TRL's own count of the clipped tokens: some on each side, not all
        clipped = {k: trainer._metrics["train"][f"clip_ratio/{k}"][-1] for k in ("low_mean", "high_mean", "region_mean")}
        assert clipped["low_mean"] > 0 and clipped["high_mean"] > 0 and clipped["region_mean"] < 0.8, clipped

    def fused(h, w):
        return ft.fused_linear_grpo_loss(h[:, start:-1], w, **fused_args)

    check_against_trl(trl_loss, hidden, head, fused)


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy"])
def test_grpo_trainer_ratio_weighted_kl(tmp_path, tokenizer, off_policy):
    """TRL's default use_bias_correction_kl=True multiplies the per-token KL term by the importance
    ratio exp(logp - old), gradient included: fuselet's option of that name gives TRL's loss and
    gradients. fuselet's default (False) is the unweighted KL term (DeepSeekMath's GRPO): on-policy
    (a ratio of 1) the losses are one, their gradients not (the ratio's own adds beta * KL * d logp)."""
    options = {"loss_type": "grpo", "beta": 0.2, "epsilon": 0.2, "max_completion_length": 7}
    trainer, trl_loss, hidden, head, start, fused_args = grpo_step(tmp_path, tokenizer, off_policy, True, **options)
    assert trainer.args.use_bias_correction_kl
    (trl_dw,) = torch.autograd.grad(trl_loss, (head.weight,), retain_graph=True)
    w = head.weight.detach().clone().requires_grad_(True)
    loss = ft.fused_linear_grpo_loss(hidden.detach()[:, start:-1], w, **fused_args)
    (dw,) = torch.autograd.grad(loss, (w,))
    gap = (dw - trl_dw).abs().max().item()
    assert gap > 1e-3 * trl_dw.abs().max().item(), "the unweighted KL's gradient should differ"
    if not off_policy:
        assert_close("loss", loss, trl_loss)

    def fused(h, w):
        return ft.fused_linear_grpo_loss(h[:, start:-1], w, use_bias_correction_kl=True, **fused_args)

    check_against_trl(trl_loss, hidden, head, fused)


def trl_options(trainer):
    """The GRPOConfig options fuselet takes under the same names, as the trainer holds them."""
    args = trainer.args
    names = ("importance_sampling_level", "delta", "temperature", "use_bias_correction_kl")
    names += (
        "sapo_temperature_neg",
        "sapo_temperature_pos",
        "vespo_k_pos",
        "vespo_lambda_pos",
        "vespo_k_neg",
        "vespo_lambda_neg",
        "top_entropy_quantile",
        "entropy_coef",
    )
    return {name: getattr(args, name) for name in names}


# GRPOConfig options -> what must tell the case apart (a fuselet option that, left at its default,
# changes the loss: the case tests something)
GRPO_CASES = {
    # dapo: over the accumulated batch's tokens (more than this micro-batch's 14), token ratios
    "dapo": ({"loss_type": "dapo"}, {"num_items_in_batch": None}),
    "dapo-asymmetric": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"epsilon_high": None}),
    # GSPO: one ratio per sequence (exp of its mean log-ratio), with grpo's and dapo's normalizers
    "gspo": ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, {"importance_sampling_level": "token"}),
    "gspo-dapo": ({"loss_type": "dapo", "importance_sampling_level": "sequence"}, {"importance_sampling_level": "token"}),
    # the logits divided by the temperature (the sampling and reference models' too, by the trainer)
    "temperature": ({"loss_type": "dapo", "temperature": 0.7}, {"temperature": 1.0}),
    # two-sided clipping: delta caps the ratio of negative-advantage tokens above 1 + epsilon_high
    "delta": ({"loss_type": "bnpo", "delta": 1.25}, {"delta": None}),
    # CISPO: the ratio clipped at epsilon_high (its epsilon_max), no gradient, weighs log p
    "cispo": ({"loss_type": "cispo", "epsilon_high": 1.1}, {"epsilon_high": 5.0}),
    "sapo": ({"loss_type": "sapo"}, {"sapo_temperature_neg": 1.0}),
    "sapo-temperatures": (
        {"loss_type": "sapo", "sapo_temperature_pos": 0.6, "sapo_temperature_neg": 1.7},
        {"sapo_temperature_pos": 1.0},
    ),
    "sapo-sequence": ({"loss_type": "sapo", "importance_sampling_level": "sequence"}, {"importance_sampling_level": "token"}),
    "luspo": ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, {"importance_sampling_level": "token"}),
    "luspo-token": ({"loss_type": "luspo"}, {"loss_type": "grpo"}),
    "vespo": ({"loss_type": "vespo"}, {"vespo_lambda_neg": 3.0}),
    # the high-entropy tokens alone (the top 40% of the batch's counted tokens by entropy)
    "entropy-mask": ({"loss_type": "grpo", "top_entropy_quantile": 0.4}, {"top_entropy_quantile": 1.0}),
    # the entropy bonus, with its gradient through the per-token entropies
    "entropy-bonus": ({"loss_type": "dapo", "entropy_coef": 0.3}, {"entropy_coef": 0.0}),
    "entropy-mask-bonus": (
        {"loss_type": "bnpo", "top_entropy_quantile": 0.7, "entropy_coef": 0.2},
        {"top_entropy_quantile": 1.0},
    ),
    "vespo-k-lambda": (
        {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.0, "vespo_lambda_neg": 1.0},
        {"vespo_k_pos": 2.0},
    ),
}


@pytest.mark.parametrize("case", list(GRPO_CASES))
@pytest.mark.parametrize("beta", [0.0, 0.2], ids=["no-kl", "ratio-weighted-kl"])
def test_grpo_trainer_loss_types(tmp_path, tokenizer, case, beta):
    """TRL 1.16's loss types and options, off-policy (the sampling policy's log-probabilities given),
    with and without TRL's default KL term (weighted by the ratio, use_bias_correction_kl=True):
    fuselet's fused_linear_grpo_loss under the trainer's own option values gives its loss and
    gradients. Each case first shows that the option it tests changes fuselet's loss."""
    options, unlike = GRPO_CASES[case]
    loss_type = options["loss_type"]
    items = 23 if loss_type in ("dapo", "cispo", "vespo") else None
    trainer, trl_loss, hidden, head, start, fused_args = grpo_step(
        tmp_path, tokenizer, True, bool(beta), num_items_in_batch=items, beta=beta, max_completion_length=7, **options
    )
    assert trainer.args.steps_per_generation == 1  # TRL's dapo normalizer is then num_items_in_batch itself
    fused_args.update(trl_options(trainer))
    with torch.no_grad():
        h, w = hidden.detach()[:, start:-1], head.weight.detach()
        same, other = ft.fused_linear_grpo_loss(h, w, **fused_args), ft.fused_linear_grpo_loss(h, w, **{**fused_args, **unlike})
        assert abs(same.item() - other.item()) > 1e-4 * abs(same.item()), f"{unlike} should change the loss"

    def fused(h, w):
        return ft.fused_linear_grpo_loss(h[:, start:-1], w, **fused_args)

    check_against_trl(trl_loss, hidden, head, fused)
