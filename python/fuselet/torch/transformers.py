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

The probe runs under torch.no_grad in eval mode (restored after) on a few random tokens;
parameters on the meta device cannot be probed, and those modules are left. A module whose
call fuselet does not take (a norm weight of another dtype than x, a cos table of another
batch, a LoRA-wrapped projection...) falls back to transformers' code for that call or is left
as it was. transformers is imported only when fuse() is called.

transformers' own door: kernel_mapping() / kernel_config() name fuselet's layers (RMSNorm,
RMSNormZeroCentered, rotary_pos_emb) in its local kernel repository (fuselet/torch/hub) for
the `kernels` package, which `use_kernels=True` has swap into the layers a modeling file marks;
each checks the class it replaces with the probes above (see the section at the end).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import inspect
import math
import pathlib
import sys
import types

import torch

from fuselet.torch._dtensor import is_dtensor
from fuselet.torch.fused_linear_cross_entropy import fused_linear_cross_entropy
from fuselet.torch.glu import clamped_swiglu, geglu, swiglu
from fuselet.torch.norm import layer_norm, rms_norm
from fuselet.torch.rope import rope

KINDS = ("norm", "mlp", "rope", "loss")

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


# --- the report ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    kind: str  # one of KINDS
    path: str  # the module's name in model.named_modules() ("" for the model itself)
    fused: bool
    detail: str  # what runs (fused) or why it was left


class FuseReport:
    """What fuse() did to one model: a Row per module it considered."""

    def __init__(self, model_type, rows):
        self.model_type = model_type
        self.rows = list(rows)

    def fused(self, kind: str | None = None) -> list[Row]:
        return [r for r in self.rows if r.fused and kind in (None, r.kind)]

    def left(self, kind: str | None = None) -> list[Row]:
        return [r for r in self.rows if not r.fused and kind in (None, r.kind)]

    def summary(self) -> dict:
        """{kind: {"fused": n, "left": n, "ops": {detail: n}, "reasons": {reason: n}}} for every kind."""
        out = {}
        for kind in KINDS:
            fused, left = self.fused(kind), self.left(kind)
            out[kind] = {
                "fused": len(fused),
                "left": len(left),
                "ops": dict(collections.Counter(r.detail for r in fused)),
                "reasons": dict(collections.Counter(r.detail for r in left)),
            }
        return out

    def __str__(self) -> str:
        lines = [f"fuselet.torch.transformers.fuse: model_type {self.model_type!r}"]
        for kind, s in self.summary().items():
            lines.append(f"  {kind}: {s['fused']} fused, {s['left']} left")
            lines += [f"    fused x{n}: {d}" for d, n in s["ops"].items()]
            lines += [f"    left  x{n}: {d}" for d, n in s["reasons"].items()]
        return "\n".join(lines)

    __repr__ = __str__


def fuse_report(model) -> FuseReport:
    """The report of the last fuse(model): per kind of layer, what was fused, what was left and why."""
    report = vars(model).get("_fuselet_report") if isinstance(model, torch.nn.Module) else None
    if report is None:
        raise ValueError(f"model: {type(model).__name__} was not fused (call fuselet.torch.transformers.fuse(model) first)")
    return report


# --- probing ---------------------------------------------------------------------------------


class _Left(Exception):
    """A candidate module fuselet leaves as it was; the message says why."""


def _generator():
    return torch.Generator().manual_seed(0)


def _randn(*shape, like: torch.Tensor, dtype=None, gen=None) -> torch.Tensor:
    return torch.randn(*shape, generator=gen or _generator()).to(device=like.device, dtype=dtype or like.dtype)


def _tolerance(dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


def _error(got, want) -> float:
    """max |got - want| / max(1, max |want|), inf where the shapes differ or want is not finite."""
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape:
        return math.inf
    got, want = got.detach().double(), want.detach().double()
    if not bool(torch.isfinite(want).all()):
        return math.inf
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def _close(got, want, dtype) -> bool:
    return _error(got, want) <= _tolerance(dtype)


def _closest(candidates, pairs, dtype):
    """The candidate c whose pairs(c) ([(got, want), ...]) agree best, if within dtype's
    tolerance; None otherwise. The best, not the first close one: a softcap of 30 on logits
    near 1, or eps 1e-5 against 1e-6, changes a probe by less than the tolerance."""
    best, best_error = None, math.inf
    for c in candidates:
        error = max(_error(g, w) for g, w in pairs(c))
        if error < best_error:
            best, best_error = c, error
    return best if best_error <= _tolerance(dtype) else None


def _probe_device(module) -> torch.Tensor:
    """A tensor on the module's device (its first parameter's or buffer's), or CPU; _Left on meta."""
    for t in (*module.parameters(), *module.buffers()):
        if t.is_meta:
            raise _Left("parameters on the meta device cannot be probed")
        if type(t) is not torch.nn.Parameter and type(t) is not torch.Tensor:
            raise _Left(f"parameters of type {type(t).__name__} (fuse before sharding or wrapping)")
        return t
    return torch.empty(0)


def _own_forward(module, fn) -> bool:
    """Give `module` (this instance only) the forward fn(module, ...); False where something
    (accelerate's hooks, an earlier fuse) already set one on the instance."""
    if "forward" in vars(module):
        return False
    module.forward = types.MethodType(fn, module)
    return True


def _plain_linear(m) -> bool:
    """A torch.nn.Linear whose forward is Linear's own (not LoRA-wrapped or hooked)."""
    return isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward and "forward" not in vars(m)


# --- norms -----------------------------------------------------------------------------------

_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon", "layer_norm_eps")


def _is_norm(module) -> bool:
    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        return True
    marker = getattr(type(module), "kernel_layer_name", None)
    return next(module.children(), None) is None and ("Norm" in type(module).__name__ or "Norm" in str(marker or ""))


def _vector(module, name):
    t = getattr(module, name, None)
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise _Left(f"{name} is a {type(t).__name__}, not a tensor")
    if t.dim() != 1:
        raise _Left(f"{name} of shape {list(t.shape)}: fuselet's norms take one vector [H]")
    return t


def _norm_call(x, spec, weight, bias):
    op, eps, zero_centered = spec
    if op == "rms_norm":
        return rms_norm(x, weight, eps, zero_centered_gamma=zero_centered)
    return layer_norm(x, weight, bias, eps, zero_centered_gamma=zero_centered)


def _norm_run(self, x, spec, mixed, args=(), kwargs=None):
    """The norm through fuselet's op in `spec`, or the class's own forward for a call it does not take."""
    weight, bias = getattr(self, "weight", None), getattr(self, "bias", None)
    if args or kwargs or not isinstance(x, torch.Tensor) or (weight is not None and x.shape[-1:] != weight.shape):
        return type(self).forward(self, x, *args, **(kwargs or {}))
    for p in (weight, bias):  # fuselet's op takes x's dtype or (where the module's output keeps x's) float32
        if p is not None and p.dtype != x.dtype and not (mixed and p.dtype == torch.float32):
            return type(self).forward(self, x, *args, **(kwargs or {}))
    return _norm_call(x, spec, weight, bias)


def _norm_forward(self, x, *args, **kwargs):
    spec, mixed = self._fuselet_norm
    return _norm_run(self, x, spec, mixed, args, kwargs)


def _norm_form(module):
    """(spec, mixed): the (op, eps, zero_centered) whose fuselet op equals the module's forward on
    the probe, and whether a half x with float32 weights keeps x's dtype; _Left otherwise."""
    weight, bias = _vector(module, "weight"), _vector(module, "bias")
    shape = getattr(module, "normalized_shape", None)
    size = (
        weight.shape[0] if weight is not None else (shape[-1] if isinstance(shape, (tuple, list)) and len(shape) == 1 else None)
    )
    if size is None:
        size = 64  # a norm without a weight is the same math at every H
    if bias is not None and bias.shape[0] != size:
        raise _Left(f"bias of shape {list(bias.shape)} for a weight of [{size}]")
    like = _probe_device(module)
    own = [
        float(v)
        for v in (getattr(module, a, None) for a in _EPS_ATTRS)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    eps_candidates = list(dict.fromkeys(own + [1e-5, 1e-6]))
    ops = ("layer_norm",) if bias is not None else ("rms_norm", "layer_norm")
    forms = [(op, eps, zc) for eps in eps_candidates for op in ops for zc in ((False, True) if weight is not None else (False,))]
    x = _randn(2, 3, size, like=like, dtype=torch.float32) * 2 + 0.5
    w32 = None if weight is None else weight.float()
    b32 = None if bias is None else bias.float()
    with torch.no_grad():
        wants = []
        for probe in (x, x * 1e-3):
            try:
                wants.append(module(probe))
            except Exception as e:
                raise _Left(f"its forward failed on a float32 probe ({type(e).__name__})") from None
        match = _closest(forms, lambda f: [(_norm_call(p, f, w32, b32), w) for p, w in zip((x, x * 1e-3), wants)], torch.float32)
        if match is None:
            raise _Left("no RMSNorm / LayerNorm form equals its forward on the probe")
        mixed = True
        if any(p is not None and p.dtype == torch.float32 for p in (weight, bias)):  # output dtype of a half x
            mixed = module(x.to(torch.bfloat16)).dtype == torch.bfloat16
    return match, mixed


def _fuse_norm(module) -> str:
    match, mixed = _norm_form(module)
    module._fuselet_norm = (match, mixed)
    if not _own_forward(module, _norm_forward):
        raise _Left("it already has a forward of its own (hooked, or fused)")
    op, eps, zc = match
    return f"ft.{op}(eps={eps:g}{', zero_centered_gamma' if zc else ''})"


# --- gated MLPs ------------------------------------------------------------------------------

# (gate, up, down) children; up None: one gate_up projection giving [gate, up]
_MLP_LAYOUTS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("gate_up_proj", None, "down_proj"))
_ACT_ATTRS = ("act_fn", "activation_fn", "act")


def _glu_of(act):
    """The fuselet GLU (and its name) for a transformers activation module, or (None, None)."""
    acts = importlib.import_module("transformers.activations")
    tanh = tuple(
        getattr(acts, n) for n in ("GELUTanh", "NewGELUActivation", "PytorchGELUTanh", "FastGELUActivation") if hasattr(acts, n)
    )
    if isinstance(act, (acts.SiLUActivation, torch.nn.SiLU)) or act is torch.nn.functional.silu:
        return swiglu, "ft.swiglu"
    if isinstance(act, tanh) or (isinstance(act, torch.nn.GELU) and act.approximate == "tanh"):
        return functools.partial(geglu, approximate="tanh"), "ft.geglu(approximate='tanh')"
    if (isinstance(act, torch.nn.GELU) and act.approximate == "none") or type(act) is acts.GELUActivation:
        return functools.partial(geglu, approximate="none"), "ft.geglu"
    return None, None


def _mlp_layout(module):
    """The first of _MLP_LAYOUTS the module's child modules name, or None."""
    children = dict(module.named_children())
    return next((lay for lay in _MLP_LAYOUTS if all(n is None or n in children for n in lay)), None)


def _hooked(*modules) -> bool:
    """Modules whose calls run hooks (tensor parallel's input / output redistribution): their
    weights may only be used through their calls."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _mlp_forward(self, x):
    glu, (gate_name, up_name, down_name) = self._fuselet_mlp
    gate = getattr(self, gate_name)
    if up_name is None:
        gate_up = gate(x)
    elif x.numel() >= x.shape[-1] * x.shape[-1] and not _hooked(gate, getattr(self, up_name)):
        # tokens >= H: concatenating the two [F, H] weights copies less than concatenating the
        # two [tokens, F] outputs; one matmul then gives [gate, up], what the GLU ops read
        up = getattr(self, up_name)
        weight = torch.cat((gate.weight, up.weight))
        bias = None if gate.bias is None else torch.cat((gate.bias, up.bias))
        gate_up = torch.nn.functional.linear(x, weight, bias)
    else:
        gate_up = torch.cat((gate(x), getattr(self, up_name)(x)), dim=-1)
    return getattr(self, down_name)(glu(gate_up))


def _fuse_mlp(module, layout) -> str:
    linears = [getattr(module, n) for n in layout if n is not None]
    if not all(map(_plain_linear, linears)):
        raise _Left("a projection is not a plain torch.nn.Linear (LoRA, quantized or hooked)")
    gate, up = linears[0], (linears[1] if layout[1] is not None else None)
    if up is not None and ((gate.bias is None) != (up.bias is None) or gate.weight.shape != up.weight.shape):
        raise _Left("gate and up projections of different shapes or biases")
    act = next((getattr(module, a) for a in _ACT_ATTRS if getattr(module, a, None) is not None), None)
    glu, name = _glu_of(act)
    if glu is None:
        raise _Left(f"activation {type(act).__name__ if act is not None else None}: no fuselet GLU for it")
    like = _probe_device(module)
    x = _randn(2, 3, gate.in_features, like=like, dtype=gate.weight.dtype)
    module._fuselet_mlp = (glu, layout)
    with torch.no_grad():
        try:
            want = module(x)
        except Exception as e:
            raise _Left(f"its forward failed on the probe ({type(e).__name__})") from None
        if not _close(_mlp_forward(module, x), want, x.dtype):
            del module._fuselet_mlp
            raise _Left(f"down({name}([gate, up])) differs from its forward on the probe")
    if not _own_forward(module, _mlp_forward):
        raise _Left("it already has a forward of its own (hooked, or fused)")
    return name


# --- MoE experts: the gate of transformers' experts interface -------------------------------

# experts implementations of transformers (config._experts_implementation) that call
# experts._apply_gate on each expert's [tokens, 2F] gate_up output
_GATED_EXPERTS = ("batched_mm", "grouped_mm")


def _experts_gate(self, gate_up_out):
    return self._fuselet_gate(gate_up_out)


def _calls_gate(cls) -> bool:
    """The experts class's own forward (under transformers' experts interface) calls _apply_gate."""
    forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    try:
        return "self._apply_gate(" in inspect.getsource(forward)
    except (OSError, TypeError):
        return False


def _gate_candidates(module):
    """(op, name, probe scale) for each fuselet op that may be the experts' gate: the GLU of its
    act_fn, or, for a gate of its own with a clamp (GPT-OSS's alpha and limit), the clamped
    SwiGLU in both layouts, probed beyond the clamp."""
    glu, name = _glu_of(getattr(module, "act_fn", None))
    if glu is not None:
        return [(glu, name, 1.0)]
    alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
    if not (isinstance(alpha, (int, float)) and isinstance(limit, (int, float)) and limit > 0):
        return []
    first = not getattr(module, "is_concatenated", True)  # transformers' flag: [g0, u0, g1, u1, ...]
    return [
        (
            functools.partial(clamped_swiglu, alpha=float(alpha), limit=float(limit), interleaved=interleaved),
            f"ft.clamped_swiglu(alpha={alpha}, limit={limit}, interleaved={interleaved})",
            2.0 * float(limit),
        )
        for interleaved in (first, not first)
    ]


def _fuse_experts(module) -> str:
    """The experts' gate through ft.swiglu / ft.geglu / ft.clamped_swiglu, where transformers'
    experts interface (use_experts_implementation) applies it: the gate of each expert's
    [gate, up] output. The expert matmuls stay transformers' (grouped_mm / batched_mm, or the
    class's own loop where it calls _apply_gate: GPT-OSS's)."""
    default = getattr(type(module), "_apply_gate", None)
    if default is None:
        raise _Left("batched MoE experts without transformers' experts interface (_apply_gate)")
    implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
    if implementation not in _GATED_EXPERTS and not _calls_gate(type(module)):
        fused_under = ", ".join(_GATED_EXPERTS)
        raise _Left(f"experts_implementation {implementation!r} does not call _apply_gate (fused under {fused_under})")
    candidates = _gate_candidates(module)
    if not candidates:
        act = getattr(module, "act_fn", None)
        what = f"activation {type(act).__name__}" if act is not None else f"own gate ({type(module).__name__}._apply_gate)"
        raise _Left(f"the experts' {what}: no fuselet op for it yet")
    like = _probe_device(module)
    weight = getattr(module, "gate_up_proj", None)
    size = 2 * getattr(module, "intermediate_dim", getattr(module, "intermediate_size", 8))
    x = _randn(6, size, like=like, dtype=weight.dtype if isinstance(weight, torch.Tensor) else torch.float32)
    with torch.no_grad():
        try:
            wants = {scale: default(module, x * scale) for _, _, scale in candidates}
        except Exception as e:
            raise _Left(f"its _apply_gate failed on the probe ({type(e).__name__})") from None
        found = _closest(candidates, lambda c: [(c[0](x * c[2]), wants[c[2]])], x.dtype)
    if found is None:
        names = " or ".join(name for _, name, _ in candidates)
        raise _Left(f"{names} differs from its _apply_gate on the probe")
    if "_apply_gate" in vars(module):
        raise _Left("its _apply_gate is already its own (fused)")
    glu, name, _ = found
    module._fuselet_gate = glu
    module._apply_gate = types.MethodType(_experts_gate, module)
    return f"{name} in the experts' gate ({implementation or 'its own loop'})"


# --- rotary embedding ------------------------------------------------------------------------

_ROPE_SIGNATURES = {
    ("q", "k", "cos", "sin", "unsqueeze_dim"): "plain",
    ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"): "position_ids",
    ("x", "cos", "sin", "unsqueeze_dim"): "single",  # one tensor at a time (Gemma4's)
}


def _half_repeated(t):
    """A table whose first half holds one angle per interleaved pair: each entry twice (GLM's)."""
    return t[..., : t.shape[-1] // 2].repeat_interleave(2, dim=-1)


def _doubled(t):
    """A half-width table of one angle per half-split pair (GPT-OSS's): the full-width table."""
    return torch.cat((t, t), dim=-1)


# (name, interleaved, table transform)
_ROPE_FORMS = (
    ("half-split", False, None),
    ("interleaved", True, None),
    ("interleaved, half table", True, _half_repeated),
    ("half-split, half-width table", False, _doubled),
)


def _rope_layout(xs, cos, sin, unsqueeze_dim):
    """The rope layout of this call ("bhsd" / "bshd") and its [S, R] or [B, S, R] tables, or None."""
    layout = "bhsd" if unsqueeze_dim == 1 else "bshd" if unsqueeze_dim == 2 else None
    if layout is None or not all(isinstance(t, torch.Tensor) for t in (*xs, cos, sin)):
        return None
    if any(x.dim() != 4 for x in xs) or cos.dim() != 3 or cos.shape != sin.shape:
        return None
    if cos.shape[0] != xs[0].shape[0]:
        if cos.shape[0] != 1:
            return None
        cos, sin = cos[0], sin[0]  # [1, S, D] position tables shared by the batch: [S, D]
    return layout, cos, sin


def _rope_apply(xs, cos, sin, layout, form):
    _, interleaved, table = form
    if table is not None:
        cos, sin = table(cos), table(sin)
    return tuple(rope(x, cos, sin, layout=layout, interleaved=interleaved) for x in xs)


def _fused_rotary(original, form, kind="plain"):
    """apply_rotary_pos_emb through ft.rope in `form`, `original` for calls it does not take."""

    def fused(xs, cos, sin, unsqueeze_dim):
        found = _rope_layout(xs, cos, sin, unsqueeze_dim)
        if found is None:
            return original(*xs, cos, sin, unsqueeze_dim=unsqueeze_dim)
        layout, cos2, sin2 = found
        out = _rope_apply(xs, cos2, sin2, layout, form)
        return out[0] if len(out) == 1 else out

    if kind == "single":

        def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
            return fused((x,), cos, sin, unsqueeze_dim)

    elif kind == "position_ids":

        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            if position_ids is not None:
                return original(q, k, cos, sin, position_ids, unsqueeze_dim)
            return fused((q, k), cos, sin, unsqueeze_dim)

    else:

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            return fused((q, k), cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb


def _rotary_tables(model, size, like):
    """[1, S, R] cos / sin tables: the model's own rotary embedding's (the first that answers
    (x, position_ids)), else transformers' usual half-split table of random angles."""
    positions = torch.arange(5, device=like.device)[None]
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            try:
                with torch.no_grad():
                    cos, sin = module(torch.zeros(1, 5, 1, device=like.device), positions)
            except Exception:
                continue
            if isinstance(cos, torch.Tensor) and cos.dim() == 3 and cos.shape[-1] <= size:
                return cos.float(), sin.float()
    angles = torch.rand(1, 5, size // 2, generator=_generator()).to(like.device) * 6
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


@functools.cache
def _rotary_form(plain, tables_key):
    """The form of ft.rope equal to `plain` (an apply_rotary_pos_emb) on the probe, or a reason."""
    return _rotary_form_on(plain, *_TABLES[tables_key])


def _rotary_form_on(plain, cos, sin, size):
    """(form, kind): the form of ft.rope equal to `plain` on x [.., size] with these [1, S, R]
    tables, and the call's kind; (None, reason) where none is."""
    kind = _ROPE_SIGNATURES.get(tuple(inspect.signature(plain).parameters))
    if kind is None:
        return None, f"apply_rotary_pos_emb{inspect.signature(plain)}: not the call fuselet serves"
    gen = _generator()
    for form in _ROPE_FORMS:
        ok = True
        for unsqueeze_dim, shape in ((1, (2, 3, 5, size)), (2, (2, 5, 3, size))):
            xs = tuple(_randn(*shape, like=cos, gen=gen) for _ in range(1 if kind == "single" else 2))
            try:
                with torch.no_grad():
                    want = plain(*xs, cos, sin, unsqueeze_dim=unsqueeze_dim)
                    layout, c, s = _rope_layout(xs, cos, sin, unsqueeze_dim)
                    got = _rope_apply(xs, c, s, layout, form)
            except Exception:
                ok = False
                break
            want = (want,) if kind == "single" else want
            ok = ok and all(_close(g, w, torch.float32) for g, w in zip(got, want))
        if ok:
            return form, kind
    return None, "no ft.rope layout (half-split, interleaved) equals its apply_rotary_pos_emb on the model's tables"


_TABLES: dict = {}


def _shadow_module(globals_: dict, name: str, value, tag: str) -> dict:
    """The namespace of a module registered in sys.modules: a copy of globals_ (a modeling
    file's) with `name` bound to `value`. A real, importable module, because torch.compile
    reaches the globals of an inlined function by importing its module's __name__."""
    module_name = f"fuselet.torch._shadow.{globals_['__name__']}.{tag}"
    module = sys.modules.get(module_name)
    if module is None:
        module = types.ModuleType(module_name)
        module.__dict__.update({k: v for k, v in globals_.items() if k not in ("__name__", "__spec__", "__loader__")})
        sys.modules[module_name] = module
    module.__dict__[name] = value
    return module.__dict__


def _with_global(fn, name, value, tag):
    """A copy of fn, and of the decorators wrapped around it (followed through __wrapped__ and
    their closures), whose innermost function reads the global `name` as `value` (from a shadow
    module of fn's, one per tag)."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        namespace = _shadow_module(fn.__globals__, name, value, tag)
        closure = fn.__closure__
    else:
        new_inner = _with_global(inner, name, value, tag)
        cells = fn.__closure__ or ()
        if not any(c.cell_contents is inner for c in cells):
            raise RuntimeError(f"{fn.__qualname__}: cannot follow its decorator to the function it wraps")
        closure = tuple(types.CellType(new_inner) if c.cell_contents is inner else c for c in cells)
        namespace = fn.__globals__
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    if inner is not None:
        copy.__wrapped__ = new_inner
    copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return copy


def _wrapped_function(cls):
    """The function a kernel-marked transformers `Func` class (apply_rotary_pos_emb's) wraps, or None."""
    plain = inspect.getclosurevars(cls.forward).nonlocals.get("func")
    return plain if inspect.isfunction(plain) else None


def _kernelized_rotary(module):
    """The attention instance's own wrapper of apply_rotary_pos_emb, where transformers marks the
    class with `use_kernelized_func(apply_rotary_pos_emb)` and the `kernels` package is installed
    (transformers >= 5.25): a `Func` module per instance, which the class's forward calls in
    eager mode and whose `forward` it calls under torch.compile. None elsewhere."""
    marked = getattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb", None)
    wrappers = vars(module).get("_kernel_funcs", {}).values()  # keyed by the kernel's layer name
    wrapper = next((w for w in wrappers if isinstance(marked, torch.nn.Module) and type(w) is type(marked)), None)
    if wrapper is None:
        return None
    plain = _wrapped_function(type(wrapper))
    return None if plain is None else (wrapper, plain)


def _calls_rotary(cls) -> bool:
    code = inspect.unwrap(cls.forward).__code__
    return "apply_rotary_pos_emb" in code.co_names or "apply_rotary_emb" in code.co_names


# --- rotary embedding by complex frequencies: apply_rotary_emb(xq, xk, freqs_cis) (Llama4,
# DeepSeek-V2): x * freqs_cis over x's interleaved pairs viewed as complex numbers, which is
# ft.rope(interleaved=True) with cos / sin the real / imaginary parts, each twice.


def _fused_complex_rotary(original, layout):
    """apply_rotary_emb through ft.rope in `layout`, `original` for calls it does not take."""

    def apply_rotary_emb(xq, xk, freqs_cis):
        fits = (
            isinstance(freqs_cis, torch.Tensor)
            and freqs_cis.is_complex()
            and freqs_cis.dim() == 3
            and all(isinstance(x, torch.Tensor) and x.dim() == 4 and x.shape[-1] == 2 * freqs_cis.shape[-1] for x in (xq, xk))
            and freqs_cis.shape[0] in (1, xq.shape[0])
        )
        if not fits:
            return original(xq, xk, freqs_cis)
        freqs = freqs_cis.to(xq.device)
        cos, sin = (part.repeat_interleave(2, dim=-1) for part in (freqs.real, freqs.imag))
        if cos.shape[0] != xq.shape[0]:
            cos, sin = cos[0], sin[0]  # [1, S, D] tables shared by the batch: [S, D]
        return tuple(rope(x, cos, sin, layout=layout, interleaved=True) for x in (xq, xk))

    return apply_rotary_emb


def _complex_rotary_layout(plain, like):
    """The x layout ("bshd" / "bhsd") in which ft.rope equals `plain` on a probe, or a reason."""
    if tuple(inspect.signature(plain).parameters) != ("xq", "xk", "freqs_cis"):
        return None, f"apply_rotary_emb{inspect.signature(plain)}: not the call fuselet serves"
    gen = _generator()
    angles = torch.rand(2, 5, 4, generator=gen).to(like.device) * 6
    freqs = torch.polar(torch.ones_like(angles), angles)
    for layout, shape in (("bshd", (2, 5, 3, 8)), ("bhsd", (2, 3, 5, 8))):
        xs = tuple(_randn(*shape, like=angles, gen=gen) for _ in range(2))
        try:
            with torch.no_grad():
                want, got = plain(*xs, freqs), _fused_complex_rotary(plain, layout)(*xs, freqs)
        except Exception:
            continue
        if all(_close(g, w, torch.float32) for g, w in zip(got, want)):
            return layout, None
    return None, "no ft.rope layout (bshd, bhsd) equals its apply_rotary_emb (complex freqs_cis) on the probe"


@functools.cache
def _complex_rope_forward(cls, layout):
    """cls.forward with apply_rotary_emb through ft.rope (one copy per attention class)."""
    fn = cls.forward
    original = inspect.unwrap(fn).__globals__["apply_rotary_emb"]
    return _with_global(fn, "apply_rotary_emb", _fused_complex_rotary(original, layout), f"{cls.__name__}_complex")


def _fuse_complex_rope(module, plain) -> str:
    if not inspect.isfunction(plain):
        raise _Left("its apply_rotary_emb is not a function fuselet can probe")
    layout, why = _complex_rotary_layout(plain, _probe_device(module))
    if layout is None:
        raise _Left(why)
    if not _own_forward(module, _complex_rope_forward(type(module), layout)):
        raise _Left("it already has a forward of its own (hooked, or fused)")
    return f"ft.rope(interleaved, complex freqs_cis, {layout})"


@functools.cache
def _rope_forward(cls, form, kind):
    """cls.forward with apply_rotary_pos_emb through ft.rope (one copy per attention class and form)."""
    fn = cls.forward
    base = inspect.unwrap(fn)
    tag = f"{cls.__name__}_{form[0].replace(',', '').replace(' ', '_')}"
    return _with_global(fn, "apply_rotary_pos_emb", _fused_rotary(base.__globals__["apply_rotary_pos_emb"], form, kind), tag)


def _fuse_rope(module, tables_key) -> str:
    forward = inspect.unwrap(type(module).forward)
    if "apply_rotary_emb" in forward.__code__.co_names and "apply_rotary_pos_emb" not in forward.__code__.co_names:
        return _fuse_complex_rope(module, forward.__globals__.get("apply_rotary_emb"))
    kernelized = _kernelized_rotary(module)
    if kernelized is not None:
        wrapper, plain = kernelized
    else:
        plain = inspect.unwrap(type(module).forward).__globals__.get("apply_rotary_pos_emb")
        plain = _wrapped_function(type(plain)) if isinstance(plain, torch.nn.Module) else plain
    if not inspect.isfunction(plain):
        raise _Left("its apply_rotary_pos_emb is not a function fuselet can probe")
    form, kind = _rotary_form(plain, tables_key)
    if form is None:
        raise _Left(kind)
    if kernelized is not None:
        fused = _fused_rotary(plain, form, kind)
        done = _own_forward(wrapper, lambda self, *args, **kwargs: fused(*args, **kwargs))
    else:
        done = _own_forward(module, _rope_forward(type(module), form, kind))
    if not done:
        raise _Left("it already has a forward of its own (hooked, or fused)")
    return f"ft.rope({form[0]})"


# --- causal-LM loss --------------------------------------------------------------------------

_LOSS_KWARGS = ("shift_labels", "num_items_in_batch", "ignore_index")


def _head_extras(model):
    """(scale, softcap) candidates of the head: logits = softcap(scale * hidden @ W.T)."""
    configs = [getattr(model, "config", None)]
    text = getattr(configs[0], "get_text_config", None)
    if callable(text):
        configs.append(text())
    scales, caps = [None], [None]
    for c in configs + [model]:
        for name in ("logits_scaling", "logits_mup_width_multiplier"):  # logits = head(hidden) / v
            v = getattr(c, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v:
                scales.append(1.0 / v)
        for name in ("logit_scale", "output_multiplier"):
            v = getattr(c, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                scales.append(float(v))
        for name in ("final_logit_softcapping", "logits_soft_cap"):
            v = getattr(c, name, None)
            if isinstance(v, (int, float)) and v:
                caps.append(float(v))
    return [(s, c) for c in dict.fromkeys(caps) for s in dict.fromkeys(scales)]


def _head_loss(hidden, head, labels, ignore_index, extras, reduction="mean"):
    scale, softcap = extras
    if scale is not None:
        hidden = hidden * scale
    labels = labels.to(hidden.device)
    weight = head.weight
    local = is_dtensor(weight) and not is_dtensor(hidden)
    if local:
        # a tensor-parallel lm_head (vocab-sharded DTensor weight) after a base model whose
        # output is the same plain tensor on every rank: the loss of the replicated tokens,
        # the weight gathered by the op's sharding rule
        dtensor = importlib.import_module("torch.distributed.tensor")
        replicate = [dtensor.Replicate()] * weight.device_mesh.ndim
        hidden = dtensor.DTensor.from_local(hidden, weight.device_mesh, replicate, run_check=False)
        labels = dtensor.DTensor.from_local(labels, weight.device_mesh, replicate, run_check=False)
    loss = fused_linear_cross_entropy(
        hidden, weight, labels, bias=head.bias, ignore_index=ignore_index, softcap=softcap, reduction=reduction
    )
    return loss.full_tensor() if local else loss


def _fused_loss_forward(self, *args, **kwargs):
    signature, base_params, output_cls, fields, extras = self._fuselet_loss
    cls_forward = type(self).forward
    bound = signature.bind_partial(self, *args, **kwargs).arguments
    bound.pop("self", None)
    extra = dict(bound.pop("kwargs", {}))
    labels = bound.pop("labels", None)
    if labels is None or extra.get("output_router_logits", getattr(self.config, "output_router_logits", False)):
        return cls_forward(self, *args, **kwargs)  # no loss asked (shift_labels alone included), or an aux loss
    return_dict = extra.pop("return_dict", bound.pop("return_dict", None))
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    if "past_key_values" in extra and base_params is not None and "cache" in base_params:
        bound["cache"] = extra.pop("past_key_values")  # the name transformers still takes for `cache`
    shift_labels, num_items, ignore_index = (extra.pop(k, None) for k in _LOSS_KWARGS)
    ignore_index = -100 if ignore_index is None else ignore_index
    logits_to_keep = bound.pop("logits_to_keep", 0)
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        raise ValueError(f"logits_to_keep: the fused loss needs every position (0) when labels are given, got {logits_to_keep!r}")
    passed = {k: v for k, v in bound.items() if base_params is None or k in base_params}
    outputs = _base_model(self)(**passed, **extra)
    hidden = outputs[0]
    if shift_labels is None:  # tokens < n predict n
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = _head_loss(hidden, self.lm_head, shift_labels, ignore_index, extras, "mean" if num_items is None else "sum")
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    out = output_cls(loss=loss, logits=None, **{f: getattr(outputs, f) for f in fields if hasattr(outputs, f)})
    return out if return_dict else out.to_tuple()


def _base_model(module):
    """The decoder under the LM head: the child its base_model_prefix names, else `model` (where
    the prefix names another: Llama4ForCausalLM's "language_model"), or None."""
    for name in (getattr(module, "base_model_prefix", None), "model"):
        child = getattr(module, name or "", None)
        if isinstance(child, torch.nn.Module) and child is not getattr(module, "lm_head", None):
            return child
    return None


def _is_lm(module) -> bool:
    head = getattr(module, "lm_head", None)
    if not isinstance(head, torch.nn.Module) or _base_model(module) is None:
        return False
    return "labels" in inspect.signature(inspect.unwrap(type(module).forward)).parameters


def _scaled_output(module, args, output, gain):
    """A forward hook: the base model's last hidden state times gain."""
    if isinstance(output, tuple) and not hasattr(output, "last_hidden_state"):
        return (output[0] * gain, *output[1:])
    output.last_hidden_state = output.last_hidden_state * gain
    return output


def _head_probe(module, signature, base_params, hidden, tokens, want):
    """The head's (scale, softcap) whose fused loss equals `want`'s, set on the module, and the
    fused forward's output on the same probe."""
    if not (isinstance(getattr(want, "loss", None), torch.Tensor) and want.loss.dim() == 0):
        raise _Left("its forward gives no scalar loss for labels")
    head = module.lm_head
    shifted = torch.nn.functional.pad(tokens, (0, 1), value=-100)[..., 1:]
    extras = _closest(
        _head_extras(module), lambda e: [(_head_loss(hidden, head, shifted, -100, e), want.loss)], head.weight.dtype
    )
    if extras is None:
        raise _Left("no fused linear cross-entropy (scale, softcap) equals its loss on the probe")
    fields = tuple(f.name for f in dataclasses.fields(type(want)) if f.name not in ("loss", "logits"))
    module._fuselet_loss = (signature, base_params, type(want), fields, extras)
    return extras, _fused_loss_forward(module, input_ids=tokens, labels=tokens)


def _fuse_loss(module) -> str:
    head = module.lm_head
    if not _plain_linear(head):
        raise _Left(f"lm_head is a {type(head).__name__}, not a plain torch.nn.Linear")
    like = _probe_device(module)
    signature = inspect.signature(inspect.unwrap(type(module).forward))
    base = _base_model(module)
    params = inspect.signature(inspect.unwrap(type(base).forward)).parameters
    base_params = None if any(p.kind is p.VAR_KEYWORD for p in params.values()) else set(params)
    vocab = min(head.out_features, getattr(getattr(module, "config", None), "vocab_size", None) or head.out_features)
    tokens = torch.randint(0, vocab, (1, 8), generator=_generator()).to(like.device)
    with torch.no_grad():
        try:
            hidden = base(input_ids=tokens)[0]
            # the base model's output scaled so that the logits reach about 10: a softcap of 30
            # or a logit scale then moves the loss by far more than float32's rounding does
            gain = 10.0 / max(float(head(hidden).abs().max()), 1e-3)
            hidden = hidden * gain
            hook = base.register_forward_hook(functools.partial(_scaled_output, gain=gain))
            try:
                want = type(module).forward(module, input_ids=tokens, labels=tokens)
                extras, got = _head_probe(module, signature, base_params, hidden, tokens, want)
            finally:
                hook.remove()
        except _Left:
            raise
        except Exception as e:
            raise _Left(f"its forward failed on a probe of 8 tokens ({type(e).__name__}: {str(e)[:80]})") from None
        if not _close(got.loss, want.loss, head.weight.dtype):
            del module._fuselet_loss
            raise _Left("the fused forward's loss differs from its forward's on the probe")
    if not _own_forward(module, _fused_loss_forward):
        raise _Left("it already has a forward of its own (hooked, or fused)")
    scale, softcap = extras
    opts = ([f"scale={scale:g}"] if scale is not None else []) + ([f"softcap={softcap:g}"] if softcap is not None else [])
    return f"ft.fused_linear_cross_entropy({', '.join(opts)})"


# --- fuse ------------------------------------------------------------------------------------


def _kind_of(module):
    """(kind, argument) for a module fuse() considers, or None."""
    if _is_norm(module):
        return "norm", None
    layout = _mlp_layout(module)
    if layout is not None:
        return "mlp", layout
    name = type(module).__name__
    if name.endswith("Experts") or any(isinstance(getattr(module, n, None), torch.nn.Parameter) for n in ("gate_up_proj", "w1")):
        return "mlp", "experts"
    projections = sum(getattr(getattr(m, "weight", None), "ndim", 0) == 2 for m in module.children())
    if name.endswith("MLP") and projections >= 2:
        return "mlp", "plain"  # fc1 / fc2, GPT-2's Conv1D pair (a block of router and experts is not one)
    if _calls_rotary(type(module)) or _kernelized_rotary(module) is not None:
        return "rope", None
    if _is_lm(module):
        return "loss", None
    return None


def _left_reason(arg) -> str:
    return {"plain": "no gate / up projection pair: fuselet has no op for an ungated act(x W1) W2"}[arg]


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
            try:
                if kind == "norm":
                    detail = _fuse_norm(module)
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


# --- transformers' own door: the `kernels` package's local layer repository ---------------------
#
# transformers marks layers for kernel swapping (`@use_kernel_forward_from_hub("RMSNorm")` on a
# norm class, `("rotary_pos_emb")` on apply_rotary_pos_emb) and `use_kernels=True` /
# `model.kernelize()` has the `kernels` package swap each marked layer's forward for the layer
# of the same name in a kernel repository. fuselet ships one (fuselet/torch/hub, the layout
# kernels' LocalLayerRepository loads): its layers, in fuselet.torch.hub.layers, take the
# checks below. kernels swaps by name alone, so each of them first checks the class it
# replaces (once per class, on a probe instance of its own, the checks fuse() runs) and runs
# the class's own forward where fuselet's op does not equal it.

HUB_REPOSITORY = pathlib.Path(__file__).with_name("hub")
HUB_LAYERS = ("RMSNorm", "RMSNormZeroCentered", "rotary_pos_emb")


def kernel_mapping(devices=("cpu", "cuda")) -> dict:
    """{layer name: {device: {mode: kernels.LocalLayerRepository}}} of fuselet's layers, for
    `kernels.use_kernel_mapping(...)` or `kernels.register_kernel_mapping(...)` around
    `from_pretrained(..., use_kernels=True)` / `model.set_use_kernels(True)`: every mode
    (training, inference, torch.compile) on each device. The CPU's form: on CUDA, use_kernels
    registers transformers' own hub mapping over this one (its RMSNorm and rotary_pos_emb
    kernels), so there take kernel_config()."""
    from kernels import LocalLayerRepository, Mode

    if isinstance(devices, str) or not all(d in ("cpu", "cuda") for d in devices):
        raise ValueError(f"devices: expected a tuple of 'cpu' / 'cuda', got {devices!r}")
    modes = (Mode.TRAINING, Mode.INFERENCE, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.INFERENCE | Mode.TORCH_COMPILE)
    return {
        name: {d: dict.fromkeys(modes, LocalLayerRepository(repo_path=HUB_REPOSITORY, layer_name=name)) for d in devices}
        for name in HUB_LAYERS
    }


def kernel_config(layers=("RMSNorm", "rotary_pos_emb")):
    """A transformers KernelConfig of fuselet's local layers, for
    `from_pretrained(..., use_kernels=True, kernel_config=kernel_config())`. transformers 5.25
    takes a KernelConfig on GPUs only (cuda, rocm, xpu, ...): on the CPU, use kernel_mapping().
    `layers`: the names of HUB_LAYERS the model marks (KernelConfig refuses one it does not; the
    default: the two most models mark)."""
    from transformers import KernelConfig

    unknown = [n for n in layers if n not in HUB_LAYERS] if not isinstance(layers, str) else [layers]
    if unknown:
        raise ValueError(f"layers: expected names among {HUB_LAYERS}, got {unknown}")
    return KernelConfig({name: f"{HUB_REPOSITORY}:{name}" for name in layers}, use_local_kernel=True)


_EPS_PROBES = dict(zip(_EPS_ATTRS, (0.31, 0.047, 0.0053, 0.00071)))  # one eps value per attribute name


@functools.cache
def _class_norm_form(cls):
    """(op, eps attribute, zero_centered, mixed) of a norm class, checked on an instance of its own
    (weight [16], each eps attribute a different value); None where fuselet's op does not equal it."""
    try:
        probe = cls.__new__(cls)
        torch.nn.Module.__init__(probe)
        probe.weight = torch.nn.Parameter(_randn(16, like=torch.empty(0)) * 0.5 + 1)
        for attr, value in _EPS_PROBES.items():
            setattr(probe, attr, value)
        (op, eps, zc), mixed = _norm_form(probe)
    except Exception:  # _Left, or a forward that needs more of its class than weight and eps
        return None
    attr = next((a for a, v in _EPS_PROBES.items() if v == eps), None)
    return None if attr is None else (op, attr, zc, mixed)


@functools.cache
def _class_rotary_form(cls, size, width):
    """The index into _ROPE_FORMS of the form of ft.rope that equals a marked apply_rotary_pos_emb
    on heads of `size` with tables [1, 5, width] of random, unstructured angles (the call's own
    widths: a half-width table is GPT-OSS's form or a partial rotary); None where none does."""
    plain = _wrapped_function(cls)
    if plain is None or _ROPE_SIGNATURES.get(tuple(inspect.signature(plain).parameters)) != "plain":
        return None
    angles = torch.rand(1, 5, width, generator=_generator()) * 6
    form, _ = _rotary_form_on(plain, angles.cos(), angles.sin(), size)
    return None if form is None else _ROPE_FORMS.index(form)
