"""fuselet.torch.trl, the door into TRL's trainers: with enable(), TRL's fused LM head (the function
its add_fused_lm_head calls) is fuselet's.

- The head alone: fuselet's ChunkedLogProbs against TRL's own ChunkedLogProbFunction on the same
  tensors, every output, temperature, logit scale, soft-capping and bias: outputs and the
  gradients of the log-probabilities and the entropy (float32, 1e-5 of TRL's scale).
- Trainers: SFT, DPO, KTO and GRPO each trained a few steps on a tiny Llama (CPU, float32) with
  and without the door: the same logged losses and entropies, and fuselet's head ran in every
  forward that needed it.
- Distillation: fuselet's ChunkedDivergence against TRL's own ChunkedDivergenceFunction on the same
  tensors (every beta kind, temperature, both models' logit scales, soft-caps and biases, hidden
  widths that differ): the per-token divergence and entropy and the divergence's gradients; and
  DistillationTrainer trained a few steps with and without the door, every logged figure alike.
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
from trl.kernels.chunked_divergence import ChunkedDivergenceFunction  # noqa: E402

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
    import trl.trainer.distillation_trainer as distillation
    import trl.trainer.utils as utils

    own, own_divergence = utils._ChunkedLogProbFunction, distillation.ChunkedDivergenceFunction
    assert own_divergence is ChunkedDivergenceFunction
    door.enable()
    try:
        assert door.enabled() and utils._ChunkedLogProbFunction is door.ChunkedLogProbs
        assert distillation.ChunkedDivergenceFunction is door.ChunkedDivergence
        door.enable()  # twice: still one door, and disable() still finds TRL's own
    finally:
        door.disable()
    assert not door.enabled() and utils._ChunkedLogProbFunction is own
    assert distillation.ChunkedDivergenceFunction is own_divergence


DIVERGENCE_CASES = {
    # (beta, temperature, student logit scale, student softcap, teacher logit scale, teacher softcap, biases)
    "forward-kl": (0.0, 1.0, 1.0, None, 1.0, None, False),
    "reverse-kl": (1.0, 1.0, 1.0, None, 1.0, None, False),
    "jsd": (0.5, 1.0, 1.0, None, 1.0, None, False),
    "jsd-temperature": (0.3, 0.7, 1.0, None, 1.0, None, False),
    "scales": (0.5, 1.2, 0.5, None, 2.0, None, False),
    "softcaps": (0.5, 0.9, 1.0, 3.0, 1.0, 5.0, False),
    "biases": (0.5, 1.0, 1.0, None, 1.0, None, True),
    "forward-kl-all": (0.0, 0.8, 1.5, 4.0, 0.7, 2.5, True),
    "reverse-kl-all": (1.0, 1.3, 0.6, 2.0, 1.4, 6.0, True),
    "jsd-all": (0.5, 0.9, 0.25, 3.0, 1.5, None, True),
}


@pytest.fixture(params=[False, True], ids=["denormals", "flush-to-zero"])
def flush_to_zero(request):
    """The CPU's denormals as they are, and flushed to zero (torch.set_flush_denormal: DAZ / FTZ,
    as another library in the process may leave them): a mixture weight that flushes to 0 must give
    a term of 0, not 0 * inf."""
    if request.param and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals to zero")
    yield request.param
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("case", list(DIVERGENCE_CASES))
def test_divergence_matches_trl(case, flush_to_zero):
    """fuselet's ChunkedDivergence and TRL's ChunkedDivergenceFunction on the same tensors (the
    student 24 wide, the teacher 40): each token's divergence and the student's entropy, and the
    gradients of a weighted sum of the divergences to the student's hidden, weight and bias, within
    1e-5 of TRL's scale; the entropy has no gradient in either. Under flush-to-zero too."""
    beta, temperature, s_scale, s_cap, t_scale, t_cap, bias = DIVERGENCE_CASES[case]
    torch.manual_seed(0)
    n, hs, ht, v = 300, 24, 40, 257
    student_hidden = (torch.randn(n, hs) * 2).requires_grad_()
    student_weight = torch.randn(v, hs).requires_grad_()
    student_bias = torch.randn(v).requires_grad_() if bias else None
    teacher_hidden, teacher_weight = torch.randn(n, ht) * 2, torch.randn(v, ht)
    teacher_bias = torch.randn(v) if bias else None
    args = (student_hidden, student_weight, student_bias, teacher_hidden, teacher_weight, teacher_bias)
    options = (beta, temperature, s_scale, s_cap, t_scale, t_cap)
    got = door.ChunkedDivergence.apply(*args, *options)
    want = ChunkedDivergenceFunction.apply(*args, *options)
    for name, g, w in zip(("divergence", "entropy"), got, want):
        _close(name, g, w)
    assert not got[1].requires_grad and not want[1].requires_grad
    assert got[0].requires_grad
    params = [t for t in args[:3] if t is not None]
    weights = torch.randn(n)
    grads = torch.autograd.grad((got[0] * weights).sum(), params)
    wants = torch.autograd.grad((want[0] * weights).sum(), params)
    for name, g, w in zip(("d hidden", "d weight", "d bias"), grads, wants):
        _close(name, g, w)


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


def _steps_args(tmp_path):
    """trl_args and STEPS steps of SGD (so that a rounding difference stays one), each logged."""
    return {**trl_args(tmp_path), "max_steps": STEPS, "logging_steps": 1, "optim": "sgd", "learning_rate": 0.1}


def _reward(completions, **kwargs):
    """GRPO's reward: the completion's length, so that the advantages are not all 0."""
    return [float(len(c)) for c in completions]


def _train(kind, tmp_path, tokenizer):
    """A trainer of `kind` trained STEPS steps (SGD, so that a rounding difference stays one):
    its log history."""
    common = _steps_args(tmp_path)
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


def _trained_with_and_without_door(monkeypatch, name, train):
    """train(folder) from seed 0 with TRL's own kernel and then through the door, each call of
    door.<name> counted: (TRL's log history, the door's, the keyword arguments of each call)."""
    calls = []
    fused = getattr(door, name)

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return fused(*args, **kwargs)

    monkeypatch.setattr(door, name, counted)
    torch.manual_seed(0)
    want = train("trl")
    assert not calls
    door.enable()
    try:
        torch.manual_seed(0)
        got = train("fuselet")
    finally:
        door.disable()
    assert len(got) == len(want) == STEPS
    return want, got, calls


def _assert_logs_alike(got, want):
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys()
        for key in sorted(k for k, v in w.items() if isinstance(v, float) and k != "step_time"):
            # every logged figure: the losses, grad norms, entropies, log-probabilities, rewards,
            # KL, mean logits and token accuracies (is_top1), completion lengths of each step
            scale = max(abs(w[key]), 1.0)
            assert abs(g[key] - w[key]) <= 1e-5 * scale, f"step {step} {key}: fuselet {g[key]!r}, TRL {w[key]!r}"


@pytest.mark.parametrize("kind", ["sft", "dpo", "kto", "grpo"])
def test_trainers_train_alike(kind, tmp_path, tokenizer, monkeypatch):
    train = lambda run: _train(kind, tmp_path / run, tokenizer)  # noqa: E731
    want, got, calls = _trained_with_and_without_door(monkeypatch, "fused_linear_logprobs", train)
    outputs = [c["outputs"] for c in calls]  # every call names the outputs it asks for
    assert len(outputs) >= STEPS, f"fuselet's head ran {len(outputs)} times in {STEPS} steps"
    if kind == "grpo":
        assert sum("entropy" in o for o in outputs) >= STEPS  # the policy's, with the entropy bonus and mask
    _assert_logs_alike(got, want)


def _distill(tmp_path, tokenizer, beta):
    """DistillationTrainer trained STEPS steps (on-policy: the student generates its completions):
    its log history. The student's config carries a logit_scale and the teacher's a soft-cap, which
    the trainer reads and hands to the divergence."""
    args = _steps_args(tmp_path)
    args.update(per_device_train_batch_size=3, max_completion_length=6, temperature=0.8, beta=beta)
    student, teacher = tiny_llama(0), tiny_llama(1, hidden_size=24)  # the teacher wider than the student
    student.config.logit_scale = 0.8
    teacher.config.final_logit_softcapping = 5.0
    data = Dataset.from_dict({"prompt": ["the cat", "a dog sat", "the big red"] * 2})
    trainer = trl.DistillationTrainer(
        model=student,
        teacher_model=teacher,
        args=trl.DistillationConfig(**args),
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_distillation_trains_alike(beta, tmp_path, tokenizer, monkeypatch):
    """DistillationTrainer with and without the door: every figure it logs (loss, grad norm, the
    student's entropy, the completions' lengths) equal within 1e-5 in every step, and fuselet's
    divergence ran in every step with the trainer's options."""
    train = lambda run: _distill(tmp_path / run, tokenizer, beta)  # noqa: E731
    want, got, calls = _trained_with_and_without_door(monkeypatch, "fused_linear_jsd_per_token", train)
    assert len(calls) >= STEPS, f"fuselet's divergence ran {len(calls)} times in {STEPS} steps"
    assert {(c["beta"], c["temperature"], c["student_logit_scale"], c["teacher_softcap"]) for c in calls} == {
        (beta, 0.8, 0.8, 5.0)
    }
    _assert_logs_alike(got, want)
