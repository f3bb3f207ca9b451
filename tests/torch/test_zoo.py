"""fuse() by structure over transformers' causal LMs (benchmarks/zoo.py builds the tiny models):
one model per kind of layer fuselet serves, eager and under torch.compile(fullgraph=True),
against the stock model; the probe that leaves what disagrees; the report."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from tests.conftest import import_layer
from tests.torch.zoo import ROOT, zoo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ft = import_layer("torch")


# config overrides where the default config would not show the layer's variant
OVERRIDES = {"granite": {"logits_scaling": 3.0}}
# model type -> what its report must say fuselet runs (one model per kind of layer)
KINDS = {
    "llama": {"norm": "ft.rms_norm(eps=1e-06)", "mlp": "ft.swiglu", "rope": "ft.rope(half-split)"},
    "gemma2": {"norm": "ft.rms_norm(eps=1e-06, zero_centered_gamma)", "loss": "ft.fused_linear_cross_entropy(softcap=30)"},
    "qwen3": {"norm": "ft.rms_norm(eps=1e-06)"},  # q / k norms over the head dim
    "cohere": {"norm": "ft.layer_norm(eps=1e-05)", "loss": "ft.fused_linear_cross_entropy(scale=0.0625)"},
    "nemotron": {"norm": "ft.layer_norm(eps=1e-05, zero_centered_gamma)"},  # LayerNorm1P
    "phi3": {"mlp": "ft.swiglu"},  # one gate_up_proj
    "glm4": {"rope": "ft.rope(interleaved, half table)"},  # partial rotary, GLM's table
    "granite": {"loss": "ft.fused_linear_cross_entropy(scale=0.333333)"},  # logits / logits_scaling
    "gpt2": {"norm": "ft.layer_norm(eps=1e-05)"},  # torch.nn.LayerNorm, tied head
    "gemma3_text": {"mlp": "ft.geglu(approximate='tanh')"},
    "mixtral": {"mlp": "ft.swiglu in the experts' gate (grouped_mm)"},  # transformers' experts interface
    "llama4_text": {"rope": "ft.rope(interleaved, complex freqs_cis, bshd)"},  # x * freqs_cis, as complex pairs
    "deepseek_v2": {"rope": "ft.rope(interleaved, complex freqs_cis, bhsd)"},
    "gpt_oss": {  # its own clamped gate over interleaved [gate, up]; half-split rope over a half-width table
        "mlp": "ft.clamped_swiglu(alpha=1.702, limit=7.0, interleaved=True) in the experts' gate (grouped_mm)",
        "rope": "ft.rope(half-split, half-width table)",
    },
}


def batch():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, zoo.VOCAB, (zoo.B, zoo.S), generator=g)
    labels = input_ids.clone()
    labels[0, :3] = -100
    return input_ids, labels


def assert_same_step(fused, plain, compiled):
    input_ids, labels = batch()
    out_p, grads_p, _ = zoo.step(plain, input_ids, labels)
    out_f = compiled(input_ids=input_ids, labels=labels)
    out_f.loss.backward()
    grads_f = {n: p.grad for n, p in fused.named_parameters() if p.grad is not None}
    assert out_f.logits is None
    assert zoo._error(out_f.loss, out_p.loss) <= zoo.TOLERANCE, (out_f.loss, out_p.loss)
    assert grads_f.keys() == grads_p.keys()
    for name, g in grads_p.items():
        assert zoo._error(grads_f[name], g) <= 2 * zoo.TOLERANCE, name


@pytest.mark.parametrize("model_type", list(KINDS))
def test_each_layer_kind_fused_and_equal(model_type):
    row = zoo.check(model_type, **OVERRIDES.get(model_type, {}))
    assert row["status"] == "equal", row
    ops = {k: v for k, v in row["ops_fused"].items()}
    for kind, detail in KINDS[model_type].items():
        assert detail in ops.get(kind, {}), (kind, ops)
    ran = row["ops_ran"]
    assert ran.get("fused_linear_cross_entropy_reduced") == 1, ran  # the fused loss ran, once


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "glm4", "nemotron", "phi3", "cohere", "gpt_oss", "llama4_text"])
def test_compiled_fullgraph_step_matches_stock(model_type):
    # Each model type built in a process grows a registry of transformers that the compiled loss
    # head guards on (output_capturing._CAN_RECORD_REGISTRY): one recompile of the head's code
    # per type, so the 9th type in one process would meet torch.compile's recompile limit
    # whichever tests ran before it in that worker. Each compiled step starts from a fresh cache.
    torch._dynamo.reset()
    plain = zoo.build(model_type)
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    assert_same_step(fused, plain, torch.compile(fused, fullgraph=True))


class ScaleOnlyNorm(torch.nn.Module):
    """Named like a norm, shaped like one, but its forward does not normalize."""

    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * self.weight


def test_a_module_that_disagrees_on_the_probe_is_left():
    model = zoo.build("llama")
    model.model.norm = ScaleOnlyNorm(model.config.hidden_size)
    fused = ft.transformers.fuse(model)
    assert "forward" not in vars(fused.model.norm)
    left = {r.path: r.detail for r in ft.transformers.fuse_report(fused).left("norm")}
    assert left == {"model.norm": "no RMSNorm / LayerNorm form equals its forward on the probe"}
    assert "forward" in vars(fused.model.layers[0].input_layernorm)


def test_report_names_every_kind():
    model = ft.transformers.fuse(zoo.build("mixtral"))
    report = ft.transformers.fuse_report(model)
    summary = report.summary()
    assert set(summary) == set(ft.transformers.KINDS)
    layers = model.config.num_hidden_layers
    assert summary["norm"]["fused"] == 2 * layers + 1 and summary["rope"]["fused"] == layers and summary["loss"]["fused"] == 1
    assert summary["mlp"]["ops"] == {"ft.swiglu in the experts' gate (grouped_mm)": layers}
    text = str(report)
    assert "model_type 'mixtral'" in text and f"norm: {2 * layers + 1} fused, 0 left" in text


def _with_gate(model, gate, drop_clamp=False):
    """model with its experts' _apply_gate replaced by `gate` (a subclass per experts class)."""
    for m in model.modules():
        if "_apply_gate" in vars(type(m)):
            m.__class__ = type("SquaredReluExperts", (type(m),), {"_apply_gate": gate})
            if drop_clamp:
                del m.alpha, m.limit
    return model


def _squared_relu_gate(self, gate_up):
    return torch.relu(gate_up[..., ::2]) ** 2 * gate_up[..., 1::2]


def test_experts_left_where_their_gate_is_not_fuselets():
    eager = zoo.build("mixtral", experts_implementation="eager")
    clamp = "ft.clamped_swiglu(alpha=1.702, limit=7.0, interleaved={})"
    for model, reason in (
        (eager, "experts_implementation 'eager' does not call _apply_gate (fused under batched_mm, grouped_mm)"),
        (
            _with_gate(zoo.build("gpt_oss"), _squared_relu_gate),
            f"{clamp.format(True)} or {clamp.format(False)} differs from its _apply_gate on the probe",
        ),
        (
            _with_gate(zoo.build("gpt_oss"), _squared_relu_gate, drop_clamp=True),
            "the experts' own gate (SquaredReluExperts._apply_gate): no fuselet op for it yet",
        ),
    ):
        report = ft.transformers.fuse_report(ft.transformers.fuse(model))
        assert {r.detail for r in report.left("mlp")} == {reason}
        assert not any("_apply_gate" in vars(m) for m in model.modules())


def vision_language(model_type):
    """A tiny random vision-language model of transformers (its text model shrunk like the zoo's,
    multimodal rope sections that fit its head), in float32."""
    config = transformers.AutoConfig.for_model(model_type)
    text = config.get_text_config()
    for key, value in dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16
    ).items():
        setattr(text, key, value)
    text.vocab_size = zoo.VOCAB
    text.rope_parameters["mrope_section"] = [2, 3, 3]  # of the head's 8 rotary frequencies
    vision = config.vision_config
    for key, value in dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64).items():
        if hasattr(vision, key):
            setattr(vision, key, value)
    torch.manual_seed(0)
    return transformers.AutoModelForImageTextToText.from_config(config).float()


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen3_vl"])
def test_vision_language_text_model_with_multimodal_rope(model_type):
    """Qwen2-VL / Qwen3-VL: the rotary embedding applies the multimodal rope sections (its own
    [B, S, D] tables, one per sequence), the attention the usual apply_rotary_pos_emb: the text
    model's norms, MLPs, rope and loss are fused, and a text step equals the stock model's."""
    plain = vision_language(model_type)
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    summary = ft.transformers.fuse_report(fused).summary()
    layers = plain.config.get_text_config().num_hidden_layers
    assert summary["rope"]["fused"] == layers and summary["loss"]["fused"] == 1, summary
    assert_same_step(fused, plain, fused)


@pytest.mark.parametrize("model_type", ["mistral3", "qwen3_vl"])
def test_image_text_model_fuses_its_language_stack_with_an_image_per_row(model_type):
    """zoo.py's vlm pass on two image-text classes (make test's script runs its VLM_SAMPLE): a
    step with an image in each row (Qwen3-VL's multimodal rope positions differ per row) equals
    the stock model's, fuselet's norms, MLPs, rope and loss ran in the language model and none
    in the vision tower (Pixtral's has a rotary attention and RMSNorms of its own)."""
    row = zoo.check_vlm(model_type)
    assert row["status"] == "equal" and row["inputs"] == "image", row
    ran, fused = row["ops_ran"], row["fused"]
    assert ran["fused_linear_cross_entropy_reduced"] == 1 and row["no_logits"], ran
    assert ran["rope_fwd"] == 2 * fused["rope"] and ran["swiglu_fwd"] == fused["mlp"], (ran, fused)
    assert ran["rms_norm_fwd"] == fused["norm"], (ran, fused)  # each fused norm once: none of the tower's
    assert row["encoders_left"] >= 4


def test_vision_tower_and_projector_are_left_and_said_so():
    model = ft.transformers.fuse(zoo.build_vlm("mistral3"))
    reason = (
        "in model.{} ({}), outside the language model (model.language_model): fuse() serves a multimodal "
        "model's language stack and leaves its encoders and projector as they are"
    )
    left = {r.kind: r.detail for r in ft.transformers.fuse_report(model).left() if r.path.startswith("model.vision_tower")}
    assert left == dict.fromkeys(("norm", "mlp", "rope"), reason.format("vision_tower", "PixtralVisionModel")), left
    rows = ft.transformers.fuse_report(model).left()
    assert {r.detail for r in rows if r.path.startswith("model.multi_modal_projector")} == {
        reason.format("multi_modal_projector", "Mistral3MultiModalProjector")
    }
    outside = (model.model.vision_tower, model.model.multi_modal_projector)
    assert not any("forward" in vars(m) for tower in outside for m in tower.modules())
    assert "forward" in vars(model.model.language_model.norm) and "forward" in vars(model)


def test_outer_loss_of_an_inner_language_model_is_fused():
    """Llama4ForConditionalGeneration computes its loss from its inner Llama4ForCausalLM's logits:
    fused, the outer forward takes the inner model's last hidden states and its head's fused loss
    (text only here: the vlm pass steps it with an image), with num_items_in_batch as Trainer passes it."""
    plain = zoo.build_vlm("llama4")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    loss_rows = {r.path: r.detail for r in ft.transformers.fuse_report(fused).fused("loss")}
    assert loss_rows == {
        "language_model": "ft.fused_linear_cross_entropy()",
        "": "ft.fused_linear_cross_entropy on language_model.lm_head",
    }
    input_ids, labels = batch()
    count = torch.tensor(int((labels[:, 1:] != -100).sum()))
    want = plain(input_ids=input_ids, labels=labels, num_items_in_batch=count)
    got = fused(input_ids=input_ids, labels=labels, num_items_in_batch=count)
    assert got.logits is None and zoo._error(got.loss, want.loss) <= zoo.TOLERANCE, (got.loss, want.loss)
    want.loss.backward()
    got.loss.backward()
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        if p.grad is not None:
            assert zoo._error(q.grad, p.grad) <= 2 * zoo.TOLERANCE, name
    logits = fused(input_ids=input_ids).logits  # without labels: the class's own forward
    torch.testing.assert_close(logits, plain(input_ids=input_ids).logits)


def test_meta_parameters_are_left_not_probed():
    with torch.device("meta"):
        model = zoo.build("llama")
    with pytest.raises(ValueError, match=r"parameters on the meta device cannot be probed"):
        ft.transformers.fuse(model)
    assert not any("forward" in vars(m) for m in model.modules())


def test_training_mode_is_restored_after_the_probe():
    model = zoo.build("llama").train()
    model.model.layers[0].eval()
    ft.transformers.fuse(model)
    assert model.training and not model.model.layers[0].training and model.model.layers[1].training


# (The whole table's bounds are scripts/zoo.sh's: make zoo and the nightly workflow.)
# In the sample, fuselet's ops run through transformers' door in at least this many types.
SAMPLE_DOOR_MIN = 15


@pytest.mark.processes
def test_the_zoo_script_over_its_sample(tmp_path):
    """benchmarks/zoo.py over its sample (make test; the whole table in make zoo and the nightly
    workflow): every sampled type equal to its stock model, also through transformers' door, and
    zoo.py's verdict holds."""
    out = tmp_path / "zoo"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "zoo.py"), "--out", str(out), "--types", "sample"]
    cmd += ["--min-equal", str(len(zoo.SAMPLE)), "--min-door-ops", str(SAMPLE_DOOR_MIN)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "zoo.json").read_text())["rows"]
    assert sorted(r["type"] for r in rows if r.get("pass") != "vlm") == sorted(zoo.SAMPLE)
    assert sorted(r["type"] for r in rows if r.get("pass") == "vlm") == sorted(zoo.VLM_SAMPLE)
    assert {r["type"]: r["status"] for r in rows if r["status"] != "equal"} == {}


def test_the_zoo_verdict_names_each_failure():
    """zoo.verdict, which make test's sample and the whole table share, fails on each of its rules."""
    equal = {"status": "equal", "door": {"status": "equal", "ops_ran": {"rms_norm_fwd": 2}}}
    rows = [{"type": "llama", **equal}, {"type": "afmoe", **equal}]
    assert zoo.verdict(rows, 2, 2) == []
    assert zoo.verdict(rows, 3, 0) == ["2 types equal, fewer than --min-equal 3"]
    assert "fewer than --min-door-ops 3" in zoo.verdict(rows, 0, 3)[0]
    differs = [{"type": "llama", "status": "differs"}, {"type": "afmoe", "status": "differs"}]
    assert zoo.verdict(differs, 0, 0) == [
        "differ from the stock model: llama, afmoe",
        "types Liger-Kernel lists that build and step but are not equal: llama (differs)",
    ]
    left = [{"type": "afmoe", "status": "equal", "door": {"status": "error"}}]
    assert zoo.verdict(left, 0, 0) == ["not equal through transformers' door: afmoe (error)"]
    ran = dict.fromkeys(zoo.VLM_OPS, 1)
    vlm = [
        {"type": "llava", "pass": "vlm", "status": "equal", "ops_ran": ran},
        {"type": "gemma3", "pass": "vlm", "status": "no stock step"},
        {"type": "llama4", "pass": "vlm", "status": "equal", "ops_ran": {"rms_norm_fwd": 1, "rope_fwd": 1}},
    ]
    assert zoo.verdict(vlm, 0, 0) == [
        "image-text types not equal: gemma3 (no stock step)",
        "image-text types whose language stack did not run fuselet's ops: llama4 (no fused_linear_cross_entropy_reduced)",
    ]
