"""fuselet in a transformers model: `fuse(model)` finds, by structure, the norms, gated MLPs,
rotary embeddings and causal-LM loss of any transformers model, checks each against its own
forward on a probe input, swaps the ones that agree for fuselet's ops, and returns the model.
`fuse_report(model)` says, per kind of layer, what was fused, what was left and why.

Nothing outside the model changes: no class or module of transformers is patched. Each swapped
module gets its own `forward` (an instance attribute, the pattern accelerate's hooks use), so
other instances of the same class, fused or not, keep theirs. No parameter or buffer is added,
removed or renamed: a fused model's state_dict loads strictly into the unfused model and back.

How each kind is found and what it runs:

- norm: a leaf module named *Norm* (or marked `@use_kernel_forward_from_hub("...Norm...")`,
  or torch's LayerNorm / RMSNorm) with a weight vector [H] or none, an optional bias [H] and
  an eps. The probe picks, among RMSNorm and LayerNorm, scale by weight or by (1 + weight)
  (Gemma's, Nemotron's LayerNorm1P) and the eps candidates (the module's own, 1e-5, 1e-6), the
  one form whose output equals the module's on two inputs (unit scale, and small enough that
  eps matters): ft.rms_norm or ft.layer_norm. Covers the block norms, the post-norms (OLMo2,
  Gemma2/3) and the per-head q/k norms (Qwen3, OLMo2, Gemma3: an RMSNorm over the head dim).
  A norm whose forward takes a `gate` (Qwen3-Next's and Qwen3.5's RMSNormGated, Mamba2's,
  Bamba's, FalconH1's, NemotronH's, Zamba2's) is probed against ft.gated_rms_norm's forms
  (the gate before or after the norm, the module's group size or the whole row).
- mlp: a module with gate_proj / up_proj / down_proj (or w1 / w3 / w2, or Phi3's fused
  gate_up_proj / down_proj), plain torch.nn.Linear, and a SiLU or GELU activation: down(glu(x))
  with ft.swiglu or ft.geglu (exact or tanh), gate and up in one matmul. MoE experts under
  transformers' experts interface: their gate (`_apply_gate`) through the GLU of their act_fn,
  or GPT-OSS's clamped gate through ft.clamped_swiglu; the expert matmuls stay transformers'.
- rope: an attention module whose forward calls the modeling file's
  `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`. The probe runs that function on the
  model's own rotary tables and picks the layout that equals it: half-split (rotate_half),
  interleaved, interleaved over a half-width table (GLM), or half-split over one (GPT-OSS),
  with partial rotary when the table is narrower than the head. Where transformers marks the attention class for kernel swapping
  (`use_kernelized_func`, with the `kernels` package) the instance's own rotary wrapper gets
  fuselet's forward, as `kernels.kernelize` would give it a hub kernel; elsewhere the instance
  gets a copy of its class's forward whose globals name fuselet's function instead.
- loss: a model with a plain-Linear `lm_head` and a `labels` argument. Given labels, the
  forward runs the base model, then ft.fused_linear_cross_entropy on the last hidden states
  and lm_head's weight (and bias), as transformers' ForCausalLMLoss does (labels shifted by one,
  or shift_labels as given; ignore_index -100; mean over counted tokens, or sum /
  num_items_in_batch), with the head's extras the probe confirms: a logit scale or multiplier
  (Granite, Cohere) and a final softcap (Gemma2/3). The [tokens, vocab] logits are never made
  and the output's `logits` is None. Without labels, or with output_router_logits (MoE aux
  loss), the forward is the class's own.

A multimodal model (a text config apart from the model's own, and a `get_decoder()` inside the
model: the image-text ForConditionalGeneration classes) is served as its language stack: the
modules under the decoder and the LMs above it; its vision tower, other encoders and projector
are left as they are, each a left row naming the module it is in. Where the head belongs to a
causal LM inside the model and the outer forward computes the loss from that LM's logits
(Llama4ForConditionalGeneration), the outer forward, given labels, takes the inner LM's last
hidden states and runs its head's fused loss (fuselet.torch.transformers.multimodal).

The probe runs under torch.no_grad in eval mode (restored after) on a few random tokens;
parameters on the meta device cannot be probed, and those modules are left. A module whose
call fuselet does not take (a norm weight of another dtype than x, a cos table of another
batch, a LoRA-wrapped projection...) falls back to transformers' code for that call or is left
as it was. transformers is imported only when fuse() is called.

transformers' own door: kernel_mapping() / kernel_config() name fuselet's layers (RMSNorm,
RMSNormZeroCentered, rotary_pos_emb) in its local kernel repository (fuselet/torch/hub) for
the `kernels` package, which `use_kernels=True` has swap into the layers a modeling file marks
(register_kernels() registers the mapping for the process: the CPU's form, which keeps them
across train() / eval(); kernel_config() on a GPU);
each checks the class it replaces with the probes above (fuselet.torch.transformers.hub).

The package: fuse() here, over detect (which kind of layer a module is), norms, gated_norms, mlp (gated MLPs
and MoE experts' gates), rotary and complex_rotary (the rotary calls; shadow copies a class's
forward with one global swapped), loss (the LM head), multimodal (the language stack of a
multimodal model, and a loss computed by an outer model), probe (what the checks share), report
(fuse_report's FuseReport) and hub (transformers' own door).
"""

from __future__ import annotations

import importlib

import torch

from fuselet.torch.transformers.detect import _kind_of, _left_reason
from fuselet.torch.transformers.gated_norms import _fuse_gated_norm, _is_gated
from fuselet.torch.transformers.hub import (
    HUB_LAYERS,
    HUB_REPOSITORY,
    _class_norm_form,  # noqa: F401 (fuselet.torch.hub.layers reads it here)
    _class_rotary_form,  # noqa: F401 (fuselet.torch.hub.layers reads it here)
    kernel_config,
    kernel_mapping,
    register_kernels,
)
from fuselet.torch.transformers.loss import _fuse_loss
from fuselet.torch.transformers.mlp import _fuse_experts, _fuse_mlp
from fuselet.torch.transformers.multimodal import _fuse_outer_loss, _inner_lm, _language_scope, _outside, _outside_reason
from fuselet.torch.transformers.norms import (
    _fuse_norm,
    _norm_run,  # noqa: F401 (fuselet.torch.hub.layers reads it here)
)
from fuselet.torch.transformers.probe import _Left, _probe_device
from fuselet.torch.transformers.report import KINDS, FuseReport, Row, fuse_report
from fuselet.torch.transformers.rotary import (
    _ROPE_FORMS,  # noqa: F401 (fuselet.torch.hub.layers reads it here)
    _TABLES,
    _fuse_rope,
    _fused_rotary,  # noqa: F401 (fuselet.torch.hub.layers reads it here)
    _rotary_form,
    _rotary_tables,
)

# in the order of the API reference (docs/api/torch.md)
__all__ = [
    "KINDS",
    "OLDEST_TRANSFORMERS",
    "Row",
    "FuseReport",
    "fuse_report",
    "fuse",
    "HUB_REPOSITORY",
    "HUB_LAYERS",
    "kernel_mapping",
    "register_kernels",
    "kernel_config",
]

# The transformers releases fuse() is tested on (CI: the oldest in the stable-ABI environment,
# requirements/stable-abi.txt; the newest in requirements/dev.txt's lock; the newest release of
# all in make test-latest). Older ones lack the causal-LM outputs' `cache` fuse() reads.
OLDEST_TRANSFORMERS = (5, 24)


def _check_transformers():
    transformers = importlib.import_module("transformers")
    found = tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())
    if found < OLDEST_TRANSFORMERS:
        oldest = ".".join(map(str, OLDEST_TRANSFORMERS))
        raise RuntimeError(
            f"fuselet.torch.transformers.fuse needs transformers >= {oldest}; found {transformers.__version__}. "
            f"Fix: pip install 'transformers>={oldest}'"
        )


def fuse(model, rms_norm: bool = True, swiglu: bool = True, rope: bool = True, loss: bool = True):
    """Swap fuselet's ops into this transformers model instance, found by structure and each
    checked on a probe against its own forward, and return it; see the module docstring.

    The flags turn off one kind each: rms_norm the norms (RMSNorm and LayerNorm forms),
    swiglu the gated MLPs, rope the rotary embeddings, loss the causal-LM loss.
    fuse_report(model) says what was fused and what was left, and why. A model with nothing
    fuselet can serve is a ValueError naming it; a non-module a TypeError. Fusing twice
    changes nothing more."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a transformers PreTrainedModel (a torch.nn.Module), got {type(model).__name__}")
    flags = {"norm": rms_norm, "mlp": swiglu, "rope": rope, "loss": loss}
    for name, flag in (("rms_norm", rms_norm), ("swiglu", swiglu), ("rope", rope), ("loss", loss)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    _check_transformers()
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    previous = vars(model).get("_fuselet_report")
    done = {(r.kind, r.path): r for r in previous.rows if r.fused} if previous is not None else {}
    rows = []
    tables_key = None
    training = {m: m.training for m in model.modules()}
    decoder_path = _language_scope(model)
    model.eval()
    try:
        for path, module in model.named_modules():
            found = _kind_of(module)
            if found is None:
                continue
            kind, arg = found
            if not flags[kind]:
                continue
            if (kind, path) in done:
                rows.append(done[kind, path])
                continue
            if decoder_path is not None and _outside(path, decoder_path):
                rows.append(Row(kind, path, False, _outside_reason(model, path, decoder_path)))
                continue
            try:
                if kind == "norm":
                    detail = _fuse_gated_norm(module) if _is_gated(module) else _fuse_norm(module)
                elif kind == "mlp":
                    if arg == "experts":
                        detail = _fuse_experts(module)
                    elif isinstance(arg, str):
                        raise _Left(_left_reason(arg))
                    else:
                        detail = _fuse_mlp(module, arg)
                elif kind == "rope":
                    if tables_key is None:
                        like = _probe_device(model)
                        size = (
                            getattr(module, "head_dim", None) or getattr(getattr(model, "config", None), "head_dim", None) or 64
                        )
                        cos, sin = _rotary_tables(model, size, like)
                        tables_key = (id(model), len(_TABLES))
                        _TABLES[tables_key] = (cos, sin, size)
                    detail = _fuse_rope(module, tables_key)
                else:
                    detail = _fuse_loss(module)
                rows.append(Row(kind, path, True, detail))
            except _Left as why:
                rows.append(Row(kind, path, False, str(why)))
        inner = _inner_lm(model) if flags["loss"] else None
        if inner is not None and ("loss", "") in done:
            rows.append(done["loss", ""])
        elif inner is not None:  # the head is an inner LM's: the outer model computes the loss (Llama4's)
            try:
                rows.append(Row("loss", "", True, _fuse_outer_loss(model, inner)))
            except _Left as why:
                rows.append(Row("loss", "", False, str(why)))
    finally:
        for m, mode in training.items():
            m.training = mode
        if tables_key is not None:
            _TABLES.pop(tables_key, None)
            _rotary_form.cache_clear()
    report = FuseReport(model_type, rows)
    model._fuselet_report = report
    if not report.fused() and any(flags.values()):
        del model._fuselet_report
        reasons = (
            "; ".join(f"{r.kind} {r.path or type(model).__name__}: {r.detail}" for r in rows[:4])
            or "no norm, gated MLP, rotary call or LM head found"
        )
        name = f"{type(model).__name__} (model_type {model_type!r})"
        raise ValueError(f"model: {name} has no layer fuselet.torch.transformers.fuse can serve ({reasons})")
    return model
