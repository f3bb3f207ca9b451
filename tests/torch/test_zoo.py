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
    assert sorted(r["type"] for r in rows) == sorted(zoo.SAMPLE)
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
