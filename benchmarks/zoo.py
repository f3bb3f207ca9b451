"""fuse() over transformers' own causal-LM table: for every model type of
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, a tiny random model (its config's defaults, shrunk), fused and
compared with the stock model on one training step in float32: the loss and every parameter's
gradient. Prints and writes, per type, what fuse() fused, which fuselet ops ran, and equal or not.

    python benchmarks/zoo.py                      # every type; writes benchmarks/results/zoo.{md,json}
    python benchmarks/zoo.py --types llama,gemma2 --out /tmp/zoo
    scripts/zoo.sh                                # the same through make zoo / pixi run zoo

A type is "equal" when the loss and every gradient agree within TOLERANCE (relative to the
largest magnitude of each), and the fused loss never built the [tokens, vocab] logits where the
head was fused. Types whose model does not build from its shrunk default config, or whose stock
forward fails on plain token ids (models needing images, audio or an encoder), are listed with
the error and do not count.

The vlm pass (`--vlm`; every type of VLM_TYPES with the whole table) does the same for the
image-text models people fine-tune (their ForConditionalGeneration classes): each built from
its default config with the text and vision sub-configs shrunk, one step on a batch with an
image in each row (at another offset in each, so that Qwen's multimodal rope positions differ
per row), stock against fused; fuse() serves the language stack and leaves the vision tower.

    python benchmarks/zoo.py --types none --vlm all    # the vlm pass alone

Each type also goes through transformers' own door: the stock model kernelized
(`set_use_kernels(True)`, what from_pretrained(use_kernels=True) does) with fuselet's kernel
mapping (fuselet.torch.transformers.kernel_mapping), one step against the stock one; the door
reaches only the layers the modeling file marks, and "not marked" types have none of them.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import inspect
import json
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import warnings
from concurrent.futures.process import BrokenProcessPool

TOLERANCE = 1e-5
TIMEOUT_S = 120
MEMORY_LIMIT = 6 << 30  # bytes of address space per worker
B, S, VOCAB = 2, 8, 256

# Liger-Kernel 0.8.5's MODEL_TYPE_TO_APPLY_LIGER_FN (liger_kernel/transformers/monkey_patch.py):
# the model types it patches, for the table's comparison (those that are causal-LM types here).
LIGER_0_8_5 = frozenset(
    "deepseek_v2 deepseek_v3 deepseek_v4 gemma gemma2 gemma3_text gemma3 gemma4_text gemma4 glm4 glm4v glm4v_moe gpt_oss "
    "internvl llama llama4_text llama4 llava granite mllama mllama_text_model ministral mistral mixtral muse_glimmer "
    "nemotron olmo2 pixtral olmo3 qwen2 qwen3 qwen3_moe qwen2_vl qwen2_vl_text qwen2_5_vl qwen2_5_vl_text qwen3_next "
    "qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text qwen3_vl qwen3_vl_text qwen3_vl_moe qwen3_vl_moe_text smollm3 "
    "phi3 paligemma falcon_h1 smolvlm hunyuan_v1_dense hunyuan_v1_moe exaone4".split()
)

# make test's sample of the table (`--types sample`; `make zoo` and the nightly workflow run it
# whole): one type of each distinct combination of fused kinds, fuselet ops and door verdict among
# the equal types of benchmarks/results/zoo.md, and the most used of the types Liger-Kernel lists.
SAMPLE = frozenset(
    "afmoe apertus bart beam bloom cohere cpmant deepseek_v4 ergo falcon falcon_mamba flint gemma gemma4 gpt_oss "
    "hy_v4 inkling2_loop_text inkling_text jais2 minimax_m3_vl_text modernbert-decoder nemotron_h phi phimoe "
    "stablelm zamba llama mistral qwen2 qwen3 qwen3_moe mixtral llama4_text phi3".split()
)

# The sizes every config is shrunk to, where its constructor takes the name.
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    n_embd=64,
    n_layer=2,
    n_head=4,
    d_model=64,
    num_layers=2,
    ffn_hidden_size=128,
    sliding_window=4,
    pad_token_id=0,
    vocab_size_per_layer_input=VOCAB,
)


# Shrinks tried in turn until the stock model builds and takes a training step: SMALL, then
# without the sizes a model may derive itself (head_dim, sliding_window), then with more layers
# (hybrid models whose first full-attention layer comes later), then with as many key/value heads
# as query heads.
_DERIVED = ("head_dim", "sliding_window")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
SHRINKS = (
    SMALL,
    {k: v for k, v in SMALL.items() if k not in _DERIVED},
    {**{k: v for k, v in SMALL.items() if k not in _DERIVED}, **dict.fromkeys(_LAYERS, 4)},
    {**{k: v for k, v in SMALL.items() if k not in _DERIVED}, **dict.fromkeys(_LAYERS, 8)},
    {k: v for k, v in SMALL.items() if k not in (*_DERIVED, "num_key_value_heads")},  # MLA: one latent for all heads
)


def _accepted(config_cls) -> set:
    return set(inspect.signature(config_cls.__init__).parameters) - {"self", "kwargs"}


def _model_class(model_type: str):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def tiny_config(model_type: str, shrink: dict = SMALL, **overrides):
    from transformers import CONFIG_MAPPING

    # the model class's own config class where it differs (a text model of a composite type)
    config_cls = getattr(_model_class(model_type), "config_class", None) or CONFIG_MAPPING[model_type]
    config = config_cls(**{k: v for k, v in shrink.items() if k in _accepted(config_cls)}, **overrides)
    text = config.get_text_config()
    if text is not config:  # a composite config: shrink its text config too
        small_text = type(text)(**{k: v for k, v in shrink.items() if k in _accepted(type(text))})
        for name, sub in vars(config).items():
            if sub is text:
                setattr(config, name, small_text)
    config._attn_implementation = "eager"
    return config


def build(model_type: str, shrink: dict = SMALL, **overrides):
    import torch

    config = tiny_config(model_type, shrink, **overrides)
    torch.manual_seed(0)
    model = _model_class(model_type)(config).float().eval()  # eval: no dropout (gradients flow all the same)
    with torch.no_grad():  # norms that start at 0 or 1 and zero biases: make them matter
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def step(model, input_ids, labels, count=None):
    import torch

    model.zero_grad(set_to_none=True)
    if count is None:
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
    else:
        with count:
            out = model(input_ids=input_ids, labels=labels)
            out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, torch


def stock_f64(model_type, shrink, input_ids, labels, **overrides):
    """{"loss": ..., parameter: gradient} of the stock model's step in float64, or None."""
    try:
        model = build(model_type, shrink, **overrides).double()
        out, grads, _ = step(model, input_ids, labels)
    except Exception:  # noqa: BLE001 - a model that does not run in float64: no second opinion
        return None
    return {"loss": out.loss, **grads}


def _error(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def check(model_type: str, door: bool = False, **overrides) -> dict:
    """One type's row: built (its config's defaults, shrunk, and `overrides`), fused, compared;
    with `door`, also kernelized with fuselet's kernel mapping (row["door"])."""
    import fuselet.torch as ft
    import torch

    row = {"type": model_type}
    start = time.monotonic()
    failure = None
    for shrink in SHRINKS:
        try:
            model = build(model_type, shrink, **overrides)
        except Exception as e:  # noqa: BLE001 - reported per type
            failure = failure or {"status": "no build", "why": f"{type(e).__name__}: {str(e)[:160]}"}
            continue
        head = model.get_output_embeddings()
        vocab = min(VOCAB, head.out_features) if isinstance(head, torch.nn.Linear) else VOCAB
        g = torch.Generator().manual_seed(1)
        input_ids = torch.randint(1, vocab, (B, S), generator=g)
        labels = input_ids.clone()
        labels[0, :3] = -100
        plain = copy.deepcopy(model)
        unstepped = copy.deepcopy(model) if door else None  # a model may keep non-leaf tensors after a step
        try:
            out_p, grads_p, _ = step(plain, input_ids, labels)
        except Exception as e:  # noqa: BLE001
            if failure is None or failure["status"] == "no build":
                failure = {"status": "no stock step", "why": f"{type(e).__name__}: {str(e)[:160]}"}
            continue
        failure = None
        break
    if failure is not None:
        return {**row, **failure}
    row["class"], row["shrink"] = type(model).__name__, SHRINKS.index(shrink)
    compare = _Compare(model_type, shrink, overrides, input_ids, labels, out_p, grads_p)
    if door:
        row["door"] = _door(unstepped, compare)
    try:
        fused = ft.transformers.fuse(model)
    except ValueError as e:
        return {**row, "status": "nothing fused", "why": str(e)[:300]}
    report = ft.transformers.fuse_report(fused)
    row["fused"] = {k: v["fused"] for k, v in report.summary().items()}
    row["left"] = {k: v["reasons"] for k, v in report.summary().items() if v["left"]}
    row["ops_fused"] = {k: v["ops"] for k, v in report.summary().items() if v["fused"]}

    try:
        out_f, grads_f, ran = counted_step(fused, input_ids, labels)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "fused step failed", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    row["ops_ran"] = ran
    row.update(compare(out_f, grads_f))
    row["no_logits"] = out_f.logits is None
    head_fused = row["fused"].get("loss", 0) > 0
    if row["status"] == "equal" and head_fused and not row["no_logits"]:
        row["status"] = "differs"
    row["seconds"] = round(time.monotonic() - start, 2)
    return row


# The image-text models people fine-tune (the ForConditionalGeneration classes of
# MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES that Liger-Kernel patches too): the vlm pass builds
# each from a tiny random config (its text and vision sub-configs shrunk), with an image in each
# row where fuselet's recipe below gives one (VLM_PIXELS), and compares one step as check() does.
VLM_TYPES = "gemma3 internvl llama4 llava mistral3 qwen2_vl qwen2_5_vl qwen3_vl qwen3_vl_moe qwen3_5 qwen3_5_moe".split()
# make test's sample of them (tests/torch/test_zoo.py): the mrope sections with an image, the
# loss computed by an outer model (Llama4), a vision tower with a rotary attention (Pixtral's)
VLM_SAMPLE = ("qwen2_vl", "llama4", "mistral3")
# the ops every image-text type's step must run: the fused loss, the norms and the rope of its language model
VLM_OPS = ("fused_linear_cross_entropy_reduced", "rms_norm_fwd", "rope_fwd")
VISION_SMALL = dict(
    depth=1,
    embed_dim=32,
    hidden_size=32,
    num_heads=2,
    num_attention_heads=2,
    intermediate_size=64,
    out_hidden_size=64,
    num_hidden_layers=1,
    image_size=16,
    patch_size=4,
    vision_output_dim=64,
    projector_input_dim=64,
    projector_output_dim=64,
    head_dim=16,
    projection_dim=32,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0],
    fullatt_block_indexes=[0],
    window_size=8,
)
# token ids of the image placeholders, inside the tiny vocabulary; text tokens stay below them
IMAGE_TOKEN, START_TOKEN, END_TOKEN, TEXT_TOKENS = 250, 251, 252, 240
# text layers where the first full-attention layer comes later (Qwen3.5's three linear-attention layers first)
VLM_LAYERS = {"qwen3_5": 4, "qwen3_5_moe": 4}


def vlm_class(model_type: str):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])


def tiny_vlm_config(model_type: str):
    """The type's default config with its text config shrunk like SMALL, its vision config like
    VISION_SMALL, the image placeholder tokens inside the vocabulary, and multimodal rope
    sections that fit the rotary frequencies of the tiny head."""
    from transformers import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[model_type]
    default = config_cls()
    text_cls, vision_cls = type(default.get_text_config()), type(default.vision_config)
    text = {k: v for k, v in SMALL.items() if k in _accepted(text_cls) or hasattr(default.get_text_config(), k)}
    text.update(sliding_window=64, num_hidden_layers=VLM_LAYERS.get(model_type, 2))
    if model_type.startswith("qwen3_5"):
        text["partial_rotary_factor"] = 0.5
    vision = {k: v for k, v in VISION_SMALL.items() if hasattr(default.vision_config, k)}
    if model_type == "llama4":  # its adapter takes the pixel-shuffled patches: hidden / ratio**2 wide
        vision["intermediate_size"] = 128
    if model_type == "qwen2_vl":  # its vision hidden_size is the merger's output: the text model's
        vision["hidden_size"] = SMALL["hidden_size"]
    tokens = {}
    for name in ("image_token_id", "image_token_index"):
        if hasattr(default, name):
            tokens[name] = IMAGE_TOKEN
    for name in ("vision_start_token_id", "boi_token_index"):
        if hasattr(default, name):
            tokens[name] = START_TOKEN
    for name in ("vision_end_token_id", "eoi_token_index"):
        if hasattr(default, name):
            tokens[name] = END_TOKEN
    for name, value in (("video_token_id", 253), ("mm_tokens_per_image", 4), ("image_seq_length", 4)):
        if hasattr(default, name):
            tokens[name] = value
    config = config_cls(text_config=text_cls(**text).to_dict(), vision_config=vision_cls(**vision).to_dict(), **tokens)
    text_config = config.get_text_config()
    rope = getattr(text_config, "rope_parameters", None)
    if model_type.startswith(("qwen2", "qwen3")) and isinstance(rope, dict):
        head = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        freqs = int(head * rope.get("partial_rotary_factor", 1.0)) // 2
        rope["mrope_section"] = [freqs - 2 * (freqs // 4), freqs // 4, freqs // 4]
    config._attn_implementation = "eager"
    return config


def build_vlm(model_type: str):
    import torch

    config = tiny_vlm_config(model_type)
    torch.manual_seed(0)
    model = vlm_class(model_type)(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def vlm_inputs(model):
    """One training batch with an image in each of its B rows: {model input: tensor}, labels
    (the image's tokens not counted) and the recipe's name; or text alone where the type has no
    recipe here."""
    import torch

    config, vision = model.config, model.config.vision_config
    g = torch.Generator().manual_seed(1)
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    patch = vision.patch_size if isinstance(vision.patch_size, int) else vision.patch_size[0]
    size = 4 * patch  # a 4 x 4 grid of patches
    inputs = {}
    if hasattr(vision, "temporal_patch_size"):  # Qwen's: patches flattened, a (t, h, w) grid per image
        merge = vision.spatial_merge_size
        images = torch.randn(B * 16, channels * vision.temporal_patch_size * patch * patch, generator=g)
        inputs.update(pixel_values=images, image_grid_thw=torch.tensor([[1, 4, 4]] * B))
        count, framed = 16 // merge**2, True
    else:
        inputs["pixel_values"] = torch.randn(B, channels, size, size, generator=g)
        type_name = type(model).__name__
        if type_name.startswith("Mistral3"):  # Pixtral's patches merged 2 x 2
            inputs["image_sizes"] = torch.tensor([[size, size]] * B)
            count = 16 // config.spatial_merge_size**2
        elif type_name.startswith("Llava"):  # CLIP's patches, the class token dropped
            count = 16
        elif type_name.startswith(("Gemma3", "InternVL")):  # pooled, or pixel-shuffled, to 2 x 2
            count = 4
        elif type_name.startswith("Llama4"):  # pixel-shuffled to 2 x 2
            count = 4
        else:
            return {}, None, "text"
        framed = hasattr(config, "boi_token_index")
    text = torch.randint(1, TEXT_TOKENS, (B, S), generator=g)
    image = torch.tensor([START_TOKEN] * framed + [IMAGE_TOKEN] * count + [END_TOKEN] * framed)
    # the image after 3 text tokens in row 0, after 6 in row 1: each row its own rope positions
    input_ids = torch.stack([torch.cat((t[: 3 + 3 * b], image, t[3 + 3 * b :])) for b, t in enumerate(text)])
    labels = input_ids.masked_fill((input_ids == IMAGE_TOKEN) | (input_ids == START_TOKEN) | (input_ids == END_TOKEN), -100)
    labels[0, :2] = -100
    if type(model).__name__.startswith("Gemma3"):
        inputs["token_type_ids"] = (input_ids == IMAGE_TOKEN).long()
    if "mm_token_type_ids" in inspect.signature(type(model).forward).parameters:  # Qwen3-VL's, Qwen3.5's: 1 marks an image token
        inputs["mm_token_type_ids"] = (input_ids == IMAGE_TOKEN).long()
    return {"input_ids": input_ids, **inputs}, labels, "image"


def vlm_step(model, inputs, labels, count=None):
    import torch

    model.zero_grad(set_to_none=True)
    with count if count is not None else _nothing():
        out = model(**inputs, labels=labels)
        out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, torch


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_vlm(model_type: str) -> dict:
    """One image-text type's row: its tiny model, stock and fused, one step on a batch with an
    image per row (or text alone, where the type has no recipe here) compared as check() does;
    "vision" says how many of the vision tower's modules fuse() considered and left."""
    import fuselet.torch as ft
    import torch

    row = {"type": model_type, "pass": "vlm"}
    start = time.monotonic()
    try:
        model = build_vlm(model_type)
    except Exception as e:  # noqa: BLE001 - reported per type
        return {**row, "status": "no build", "why": f"{type(e).__name__}: {str(e)[:160]}"}
    row["class"] = type(model).__name__
    inputs, labels, row["inputs"] = vlm_inputs(model)
    if labels is None:
        g = torch.Generator().manual_seed(1)
        inputs = {"input_ids": torch.randint(1, TEXT_TOKENS, (B, S), generator=g)}
        labels = inputs["input_ids"].clone()
        labels[0, :3] = -100
    plain = copy.deepcopy(model)
    try:
        out_p, grads_p, _ = vlm_step(plain, inputs, labels)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "no stock step", "why": f"{type(e).__name__}: {str(e)[:160]}"}
    compare = _Compare(model_type, None, {}, inputs["input_ids"], labels, out_p, grads_p)
    compare.ref = {}  # no float64 second opinion for the vlm pass: held to TOLERANCE
    try:
        fused = ft.transformers.fuse(model)
    except ValueError as e:
        return {**row, "status": "nothing fused", "why": str(e)[:300]}
    report = ft.transformers.fuse_report(fused)
    row["fused"] = {k: v["fused"] for k, v in report.summary().items()}
    row["left"] = {k: v["reasons"] for k, v in report.summary().items() if v["left"]}
    row["ops_fused"] = {k: v["ops"] for k, v in report.summary().items() if v["fused"]}
    row["encoders_left"] = sum("outside the language model" in r.detail for r in report.left())
    try:
        out_f, grads_f, ran = counted_step(fused, inputs, labels, step=vlm_step)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "fused step failed", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    row["ops_ran"] = ran
    row.update(compare(out_f, grads_f))
    row["no_logits"] = out_f.logits is None
    if row["status"] == "equal" and row["fused"].get("loss", 0) > 0 and not row["no_logits"]:
        row["status"] = "differs"
    row["seconds"] = round(time.monotonic() - start, 2)
    return row


def counted_step(model, input_ids, labels, step=step):
    """step(), and {fuselet op: calls} of the fuselet ops it ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            if name.startswith("fuselet::"):
                ran[name.removeprefix("fuselet::")] += 1
            return func(*args, **(kwargs or {}))

    out, grads, _ = step(model, input_ids, labels, Count())
    return out, grads, dict(sorted(ran.items()))


class _Compare:
    """A step's loss and gradients against the stock model's: {"status", "max_error", "worst", ...}."""

    def __init__(self, model_type, shrink, overrides, input_ids, labels, out_p, grads_p):
        self.key = (model_type, shrink, input_ids, labels)
        self.input_ids, self.labels = input_ids, labels
        self.overrides = overrides
        self.out_p, self.grads_p = out_p, grads_p
        self.ref = None

    def __call__(self, out_f, grads_f) -> dict:
        out_p, grads_p = self.out_p, self.grads_p
        row = {}
        missing = sorted(set(grads_p) ^ set(grads_f))
        fused_vals = {"loss": out_f.loss, **grads_f}
        stock_vals = {"loss": out_p.loss, **{n: g for n, g in grads_p.items() if n in grads_f}}
        errors = {n: _error(fused_vals[n], v) for n, v in stock_vals.items()}
        worst = max(errors, key=errors.get)
        row["max_error"], row["worst"] = errors[worst], worst
        # Where fused and stock float32 differ by more than TOLERANCE (deep or sensitive models
        # amplify float32's rounding), both are held to the float64 stock step: the fused one may
        # be no further from it than twice the stock float32 step's own distance, plus
        # TOLERANCE: which of two float32 steps lies nearer float64 changes with the CPU kernels
        # torch picks (gemma4's layer-0 k_proj gradient: fused 1.27e-5 from float64, stock
        # 5.4e-6, with AVX-512 kernels; within 2x with AVX2 ones), while a real difference (a
        # wrong eps, a dropped term) is 1e-3 or more.
        if errors[worst] > TOLERANCE and self.ref is None:
            self.ref = stock_f64(*self.key, **self.overrides) or {}
        ref = self.ref if errors[worst] > TOLERANCE else None
        if ref:
            within = [
                n
                for n in errors
                if errors[n] <= TOLERANCE or _error(fused_vals[n], ref[n]) <= 2 * _error(stock_vals[n], ref[n]) + TOLERANCE
            ]
            row["float64_check"] = f"{len(within)} of {len(errors)} within 2x the stock float32 error + {TOLERANCE:g}"
            outside = len(within) < len(errors)
        else:
            outside = errors[worst] > TOLERANCE
        row["status"] = "equal" if not missing and not outside else "differs"
        if missing:
            row["why"] = f"gradients of different parameters: {missing[:4]}"
        return row


def _door(model, compare) -> dict:
    """transformers' own door: the stock model kernelized (model.set_use_kernels, as
    from_pretrained(use_kernels=True) does) with fuselet's kernel mapping, one step against the
    stock one: {"status", "ops_ran", "swapped", ...}; "not marked" where the model marks no layer
    fuselet's repository has, "not swapped" where kernels swapped none of them."""
    import fuselet.torch as ft
    import kernels
    import torch

    names = set(ft.transformers.HUB_LAYERS)
    marked = any(getattr(type(m), "kernel_layer_name", None) in names for m in model.modules())
    marked = marked or any(names & set(vars(m).get("_kernel_funcs", {})) for m in model.modules())
    if not marked:
        return {"status": "not marked"}
    try:
        with kernels.use_kernel_mapping(ft.transformers.kernel_mapping()):
            model.set_use_kernels(True)
        swapped = _swapped(model)
        if not swapped:  # kernels falls back to each layer's own forward where a repository fails to load
            return {"status": "not swapped", "why": "kernels kept every marked layer's own forward"}
        input_ids, labels = compare.input_ids, compare.labels
        with torch.no_grad():  # each layer checks its class once, on its first call: not counted
            model(input_ids=input_ids, labels=labels)
        out, grads, ran = counted_step(model, input_ids, labels)
    except Exception as e:  # noqa: BLE001
        return {"status": "failed", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    return {**compare(out, grads), "ops_ran": ran, "swapped": swapped}


def _swapped(model) -> int:
    """How many modules (and transformers' per-instance function wrappers) run a fuselet layer's forward."""

    def ours(m):
        return getattr(getattr(vars(m).get("forward"), "__func__", None), "__module__", "") == "fuselet.torch.hub.layers"

    return sum(ours(m) + sum(ours(f) for f in vars(m).get("_kernel_funcs", {}).values()) for m in model.modules())


def _timeout(signum, frame):
    raise TimeoutError(f"over {TIMEOUT_S} s")


def _run_one(model_type: str) -> dict:
    """check(model_type), or check_vlm for "vlm:<model_type>", in a worker: its row."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # A default config that stays huge after shrinking (sub-configs the shrink does not reach)
    # fails its allocation here instead of waking the machine's OOM killer; a call stuck in C
    # code past the alarm ends its worker (the pool then names the type).
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    watchdog = threading.Timer(TIMEOUT_S + 30, os._exit, (3,))
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(TIMEOUT_S)
    vlm = model_type.startswith("vlm:")
    try:
        return check_vlm(model_type.removeprefix("vlm:")) if vlm else check(model_type, door=True)
    except Exception as e:  # noqa: BLE001 - one type's failure is its row
        row = {"type": model_type.removeprefix("vlm:"), "status": "error", "why": f"{type(e).__name__}: {str(e)[:200]}"}
        return {**row, "pass": "vlm"} if vlm else row
    finally:
        signal.alarm(0)
        watchdog.cancel()


def _report(row) -> dict:
    if "why" in row:  # one line for the table: error messages may span lines or hold a "|"
        row["why"] = " ".join(row["why"].split()).replace("|", "/")
    print(f"{row['type']:28} {row['status']:16} {row.get('why', '')[:100]}", flush=True)
    return row


def run_all(types, jobs: int) -> list:
    """Every type's row, `jobs` worker processes at a time. A type that kills its worker (a crash
    in the model's code) costs the types in flight their run: those go round again, and the first
    of them runs alone, in a process of its own, until the one that crashes is found and named."""
    context = multiprocessing.get_context("forkserver")
    rows, pending = [], list(types)
    while pending:
        again = []
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {pool.submit(_run_one, t): t for t in pending}
            for done in concurrent.futures.as_completed(futures):
                try:
                    rows.append(_report(done.result()))
                except BrokenProcessPool:
                    again.append(futures[done])
        if not again:
            break
        alone = again.pop(0)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            try:
                row = pool.submit(_run_one, alone).result()
            except BrokenProcessPool:
                died = "its process died (a crash in the model's code or out of memory)"
                row = {"type": alone.removeprefix("vlm:"), "status": "error", "why": died}
                row.update({"pass": "vlm"} if alone.startswith("vlm:") else {})
        rows.append(_report(row))
        pending = again
    return rows


def _door_cell(row) -> str:
    door = row.get("door")
    if door is None or door["status"] == "not marked":
        return "-"
    ran = ", ".join(f"{k} {v}" for k, v in door.get("ops_ran", {}).items()) or "none"
    return f"{door['status']}: {ran}" if "why" not in door else f"{door['status']}: {door['why'][:80]}"


def vlm_table(rows) -> str:
    """The vlm pass's section of the table."""

    def kinds(row, key):
        return ", ".join(f"{k} {v}" for k, v in row.get(key, {}).items() if v) or "-"

    counts = collections.Counter(r["status"] for r in rows)
    summary = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    images = sum(r.get("inputs") == "image" for r in rows if r["status"] == "equal")
    lines = [
        "## Image-text models (the vlm pass)",
        "",
        f"{len(rows)} image-text types (`ForConditionalGeneration`, text and vision configs shrunk): {summary}; "
        f"{images} of the equal ones with an image in every row (multimodal rope positions included). fuse() serves "
        "the language model and the loss; the vision tower and the projector are left as they are (their modules "
        "counted in the report's left rows, their gradients compared all the same).",
        "",
        "| type | class | inputs | status | fused (modules) | encoder modules left | fuselet ops ran (calls) | max rel. error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ran = ", ".join(f"{k} {v}" for k, v in r.get("ops_ran", {}).items()) or "-"
        err = f"{r['max_error']:.1e}" if "max_error" in r else "-"
        status = r["status"] if "why" not in r else f"{r['status']}: {r['why'][:120]}"
        left = str(r.get("encoders_left", "-"))
        cells = (r["type"], r.get("class", "-"), r.get("inputs", "-"), status, kinds(r, "fused"), left, ran, err)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(rows) -> str:
    def kinds(row, key):
        return ", ".join(f"{k} {v}" for k, v in row.get(key, {}).items() if v) or "-"

    counts = collections.Counter(r["status"] for r in rows)
    liger = [r for r in rows if r["type"] in LIGER_0_8_5]
    liger_built = [r for r in liger if r["status"] not in ("no build", "no stock step")]
    liger_equal = sum(r["status"] == "equal" for r in liger)
    door = [r for r in rows if r.get("door", {}).get("status", "not marked") != "not marked"]
    door_equal = sum(r["door"]["status"] == "equal" and bool(r["door"].get("ops_ran")) for r in door)
    door_ops = collections.Counter(
        op.removesuffix("_fwd")
        for r in door
        if r["door"]["status"] == "equal"
        for op in r["door"].get("ops_ran", {})
        if op.endswith("_fwd")
    )
    lines = [
        f"Liger-Kernel 0.8.5 lists {len(LIGER_0_8_5)} model types; {len(liger)} are causal-LM types here, "
        f"{len(liger_built)} of them build and step from their shrunk default config, {liger_equal} are equal.",
        "",
        f"transformers' own door (`use_kernels` with fuselet's kernel mapping) reaches {len(door)} types (the others "
        f"mark no layer it has): {door_equal} equal to the stock step with fuselet's ops running "
        f"({', '.join(f'{op} in {n}' for op, n in door_ops.most_common())}), "
        f"{sum(r['door']['status'] == 'equal' for r in door) - door_equal} equal with every marked layer left as it was.",
        "",
        "| type | class | Liger | status | fused (modules) | fuselet ops ran (calls) | max rel. error | door: ops ran |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ran = ", ".join(f"{k} {v}" for k, v in r.get("ops_ran", {}).items()) or "-"
        err = f"{r['max_error']:.1e}" if "max_error" in r else "-"
        status = r["status"] if "why" not in r else f"{r['status']}: {r['why'][:120]}"
        liger_mark = "yes" if r["type"] in LIGER_0_8_5 else ""
        cells = (r["type"], r.get("class", "-"), liger_mark, status, kinds(r, "fused"), ran, err, _door_cell(r))
        lines.append("| " + " | ".join(cells) + " |")
    summary = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    return f"{len(rows)} causal-LM types: {summary}\n\n" + "\n".join(lines) + "\n"


def verdict(rows, min_equal: int, min_door_ops: int) -> list[str]:
    """What fails the run: an image-text type of the vlm pass that is not equal, or whose step
    ran none of one of VLM_OPS (the language stack's loss, norms, rope); among the
    causal-LM types, fewer than `min_equal` equal; any type that differs from its stock
    model; a type Liger-Kernel lists that builds and steps but is not equal; a type transformers'
    own door reaches that is not equal there; fewer than `min_door_ops` types where fuselet's ops
    ran through that door."""
    failures = []
    vlm = [r for r in rows if r.get("pass") == "vlm"]
    rows = [r for r in rows if r.get("pass") != "vlm"]
    unequal = [f"{r['type']} ({r['status']})" for r in vlm if r["status"] != "equal"]
    if unequal:
        failures.append(f"image-text types not equal: {', '.join(unequal)}")
    unserved = [
        f"{r['type']} (no {', '.join(op for op in VLM_OPS if op not in r.get('ops_ran', {}))})"
        for r in vlm
        if r["status"] == "equal" and not all(op in r.get("ops_ran", {}) for op in VLM_OPS)
    ]
    if unserved:
        failures.append(f"image-text types whose language stack did not run fuselet's ops: {', '.join(unserved)}")
    equal = sum(r["status"] == "equal" for r in rows)
    if equal < min_equal:
        failures.append(f"{equal} types equal, fewer than --min-equal {min_equal}")
    differs = [r["type"] for r in rows if r["status"] == "differs"]
    if differs:
        failures.append(f"differ from the stock model: {', '.join(differs)}")
    liger = [f"{r['type']} ({r['status']})" for r in rows if r["type"] in LIGER_0_8_5]
    liger = [t for t in liger if not t.endswith(("(equal)", "(no build)", "(no stock step)"))]
    if liger:
        failures.append(f"types Liger-Kernel lists that build and step but are not equal: {', '.join(liger)}")
    door = {r["type"]: r["door"] for r in rows if r.get("door", {}).get("status", "not marked") != "not marked"}
    unequal = [f"{t} ({d['status']})" for t, d in door.items() if d["status"] != "equal"]
    if unequal:
        failures.append(f"not equal through transformers' door: {', '.join(unequal)}")
    ran = sum(bool(d.get("ops_ran")) for d in door.values())
    if ran < min_door_ops:
        failures.append(f"fuselet's ops ran through transformers' door in {ran} types, fewer than --min-door-ops {min_door_ops}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--types",
        help="comma-separated causal-LM model types, 'sample' (make test's: SAMPLE) or 'none' (default: every causal-LM type)",
    )
    parser.add_argument(
        "--vlm",
        help="comma-separated image-text model types of the vlm pass, 'all' (VLM_TYPES), 'sample' (VLM_SAMPLE) or 'none' "
        "(default: all with every causal-LM type, VLM_SAMPLE with --types sample, else none)",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "zoo"), help="writes OUT.md and OUT.json"
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    parser.add_argument("--min-equal", type=int, default=0, help="exit 1 when fewer types are equal")
    parser.add_argument(
        "--min-door-ops", type=int, default=0, help="exit 1 when fuselet's ops run through transformers' door in fewer types"
    )
    args = parser.parse_args(argv)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    every = not args.types
    named = {"sample": sorted(SAMPLE), "none": [], None: sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)}
    types = named[args.types] if args.types in named else args.types.split(",")
    unknown = [t for t in types if t not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    if unknown:
        parser.error(f"--types: not causal-LM model types of this transformers: {', '.join(unknown)}")
    vlm = args.vlm or ("all" if every else "sample" if args.types == "sample" else "none")
    vlm = list(VLM_TYPES) if vlm == "all" else list(VLM_SAMPLE) if vlm == "sample" else [] if vlm == "none" else vlm.split(",")
    unknown = [t for t in vlm if t not in VLM_TYPES]
    if unknown:
        parser.error(f"--vlm: not image-text model types of the vlm pass (VLM_TYPES): {', '.join(unknown)}")
    import torch
    import transformers

    rows = run_all(types + [f"vlm:{t}" for t in vlm], args.jobs)
    rows.sort(key=lambda r: (r.get("pass", ""), r["type"]))
    header = f"fuselet {__import__('fuselet').__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    text = f"# fuse() over transformers' causal LMs\n\n{header}; `python benchmarks/zoo.py`\n\n"
    text += table([r for r in rows if r.get("pass") != "vlm"]) if types else ""
    text += ("\n" if types else "") + vlm_table([r for r in rows if r.get("pass") == "vlm"]) if vlm else ""
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump({"versions": header, "tolerance": TOLERANCE, "rows": rows}, f, indent=1)
        f.write("\n")
    print("\n".join(p for p in text.split("\n\n")[2:] if not p.startswith(("|", "#", "Liger", "transformers'"))))
    print(f"wrote {args.out}.md and {args.out}.json")
    failures = verdict(rows, args.min_equal, args.min_door_ops)
    for failure in failures:
        print(f"zoo: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
