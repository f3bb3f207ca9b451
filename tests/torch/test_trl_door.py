"""fuselet.torch.trl, the door into TRL's trainers: with enable(), TRL's fused LM head (the function
its add_fused_lm_head calls) is fuselet's.

- The head alone: fuselet's ChunkedLogProbs against TRL's own ChunkedLogProbFunction on the same
  tensors, every output, temperature, logit scale, soft-capping and bias: outputs and the
  gradients of the log-probabilities and the entropy (float32, 1e-5 of TRL's scale).
- Trainers: SFT, DPO, KTO and GRPO each trained a few steps on a tiny Llama (CPU, float32) with
  and without the door: the same logged losses and entropies, and fuselet's head ran in every
  forward that needed it.
"""

from __future__ import annotations

import pytest

from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
trl = pytest.importorskip("trl", reason="trl is not installed: the door into TRL cannot be tested here")
transformers = pytest.importorskip("transformers", reason="transformers is not installed in this environment")
ft = import_layer("torch")

import fuselet.torch.trl as door  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl.kernels import ChunkedLogProbFunction  # noqa: E402

from tests.torch.test_trl import CHOSEN, PROMPTS, REJECTED, make_tokenizer, tiny_llama, trl_args  # noqa: E402

RTOL = 1e-5
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


@pytest.fixture
def tokenizer():
    return make_tokenizer()


def _close(name, got, want, rtol=RTOL):
    assert (got is None) == (want is None), name
    if want is None:
        return
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, name
    scale = max(want.abs().max().item(), 1.0)
    err = (got - want).abs().max().item()
    assert err <= rtol * scale, f"{name}: max |fuselet - TRL| = {err:.3g} ({err / scale:.3g} of TRL's scale)"


@pytest.mark.parametrize(
    ("temperature", "softcap", "scale", "bias", "outputs"),
    [
        (1.0, None, 1.0, False, ("log_probs",)),
        (1.0, None, 1.0, False, OUTPUTS),
        (0.7, None, 1.0, True, ("log_probs", "entropy")),
        (1.3, 5.0, 1.0, False, OUTPUTS),
        (0.9, 3.0, 0.25, True, OUTPUTS),
    ],
    ids=["logprobs", "all", "temperature-bias", "softcap", "scale-softcap-bias"],
)
def test_head_matches_trl(temperature, softcap, scale, bias, outputs):
    torch.manual_seed(0)
    n, h, v = 300, 24, 257
    hidden = (torch.randn(n, h) * 2).requires_grad_()
    weight = torch.randn(v, h).requires_grad_()
    b = torch.randn(v).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,))
    targets[: n // 3] = (hidden[: n // 3] @ weight.T).argmax(-1).detach()  # is_top1 both ways
    got = door.ChunkedLogProbs.apply(hidden, weight, b, targets, temperature, 64, softcap, scale, outputs)
    want = ChunkedLogProbFunction.apply(hidden, weight, b, targets, temperature, 64, softcap, scale, outputs)
    for name, g, w in zip(OUTPUTS, got, want):
        if name == "is_top1" and w is not None:
            assert torch.equal(g, w), name
            assert 0 < int(w.sum()) < n, "is_top1: all or none, which tests nothing"
        else:
            _close(name, g, w)
    params = [t for t in (hidden, weight, b) if t is not None]
    gl, ge = torch.randn(n), torch.randn(n)

    def grads(out):
        loss = (out[0] * gl).sum() + (0 if out[1] is None else (out[1] * ge).sum())
        return torch.autograd.grad(loss, params)

    for name, g, w in zip(("d hidden", "d weight", "d bias"), grads(got), grads(want)):
        _close(name, g, w)


def test_enable_and_disable():
    import trl.trainer.utils as utils

    own = utils._ChunkedLogProbFunction
    door.enable()
    try:
        assert door.enabled() and utils._ChunkedLogProbFunction is door.ChunkedLogProbs
        door.enable()  # twice: still one door, and disable() still finds TRL's own
    finally:
        door.disable()
    assert not door.enabled() and utils._ChunkedLogProbFunction is own


# --- trainers trained with and without the door ----------------------------------------------------

STEPS = 3


def _datasets():
    return {
        "sft": Dataset.from_dict({"text": [p + c for p, c in zip(PROMPTS, CHOSEN)] * 2}),
        "dpo": Dataset.from_dict({"prompt": PROMPTS * 2, "chosen": CHOSEN * 2, "rejected": REJECTED * 2}),
        "kto": Dataset.from_dict(
            {"prompt": PROMPTS * 2, "completion": CHOSEN + REJECTED, "label": [True, True, False, False, True, False]}
        ),
        "grpo": Dataset.from_dict({"prompt": ["the cat", "a dog sat", "the big red"] * 2}),
    }


def _reward(completions, **kwargs):
    """GRPO's reward: the completion's length, so that the advantages are not all 0."""
    return [float(len(c)) for c in completions]


def _train(kind, tmp_path, tokenizer):
    """A trainer of `kind` trained STEPS steps (SGD, so that a rounding difference stays one):
    its log history."""
    common = {**trl_args(tmp_path), "max_steps": STEPS, "logging_steps": 1, "optim": "sgd", "learning_rate": 0.1}
    common["per_device_train_batch_size"] = 6 if kind == "grpo" else 2
    data = _datasets()[kind]
    model = tiny_llama(0)
    if kind == "sft":
        trainer = trl.SFTTrainer(model=model, args=trl.SFTConfig(**common), train_dataset=data, processing_class=tokenizer)
    elif kind == "dpo":
        trainer = trl.DPOTrainer(
            model=model, ref_model=tiny_llama(1), args=trl.DPOConfig(**common), train_dataset=data, processing_class=tokenizer
        )
    elif kind == "kto":
        trainer = trl.KTOTrainer(
            model=model, ref_model=tiny_llama(2), args=trl.KTOConfig(**common), train_dataset=data, processing_class=tokenizer
        )
    else:
        config = trl.GRPOConfig(
            **common,
            num_generations=3,
            max_completion_length=6,
            beta=0.1,
            entropy_coef=0.05,
            top_entropy_quantile=0.5,
            temperature=0.8,
        )
        model.save_pretrained(tmp_path / "model")  # GRPOTrainer loads its policy and reference from a path
        trainer = trl.GRPOTrainer(
            model=str(tmp_path / "model"), reward_funcs=_reward, args=config, train_dataset=data, processing_class=tokenizer
        )
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("kind", ["sft", "dpo", "kto", "grpo"])
def test_trainers_train_alike(kind, tmp_path, tokenizer, monkeypatch):
    calls = []
    fused = door.fused_linear_logprobs

    def counted(*args, **kwargs):
        calls.append(kwargs["outputs"])
        return fused(*args, **kwargs)

    monkeypatch.setattr(door, "fused_linear_logprobs", counted)
    torch.manual_seed(0)
    want = _train(kind, tmp_path / "trl", tokenizer)
    assert not calls
    door.enable()
    try:
        torch.manual_seed(0)
        got = _train(kind, tmp_path / "fuselet", tokenizer)
    finally:
        door.disable()
    assert len(got) == len(want) == STEPS
    assert len(calls) >= STEPS, f"fuselet's head ran {len(calls)} times in {STEPS} steps"
    if kind == "grpo":
        assert sum("entropy" in c for c in calls) >= STEPS  # the policy's, with the entropy bonus and mask
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys()
        for key in sorted(k for k, v in w.items() if isinstance(v, float) and k != "step_time"):
            # every logged figure: the losses, grad norms, entropies, log-probabilities, rewards,
            # KL, mean logits and token accuracies (is_top1) of each step
            scale = max(abs(w[key]), 1.0)
            assert abs(g[key] - w[key]) <= 1e-5 * scale, f"step {step} {key}: fuselet {g[key]!r}, TRL {w[key]!r}"
