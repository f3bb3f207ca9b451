"""fuselet in a transformers model: `fuse(model)` swaps, on that one instance, its RMSNorms,
gated MLPs, rotary embedding and causal-LM loss for fuselet's ops, and returns it.

Nothing outside the model changes: no class or module of transformers is patched. Each swapped
module gets its own `forward` (an instance attribute, the pattern accelerate's hooks use), so
other instances of the same class, fused or not, keep theirs. No parameter or buffer is added,
removed or renamed: a fused model's state_dict loads strictly into the unfused model and back.

- rms_norm: each <Family>RMSNorm runs ft.rms_norm (Gemma's (1 + weight) scale through
  zero_centered_gamma). Llama's norm rounds to x's dtype before the weight multiply and again
  after it, Gemma's once after; fuselet's math is float32 with one rounding at the end (Gemma's
  order; within about one ulp of the dtype of Llama's).
- swiglu: each <Family>MLP makes [gate, up] (what the GLU ops read), then runs ft.swiglu for
  silu or ft.geglu for gelu (approximate="tanh": Gemma's gelu_pytorch_tanh). With at least H
  tokens, in one matmul on the two weights concatenated on the fly (the parameters stay
  gate_proj / up_proj); with fewer, the copy of the two [tokens, F] outputs is the smaller one.
- rope: each <Family>Attention calls ft.rope (layout "bhsd", read in place) where its forward
  calls the module-level apply_rotary_pos_emb. Where transformers marks the attention class for
  kernel swapping (`use_kernelized_func`, transformers >= 5.25 with the `kernels` package), the
  instance's own rotary wrapper gets fuselet's forward, as `kernels.kernelize` would give it a
  hub kernel; elsewhere the instance gets a copy of its class's forward whose globals name
  fuselet's function instead (decorators kept).
- loss: the <Family>ForCausalLM's forward, when given labels, computes the loss with
  ft.fused_linear_cross_entropy from the last hidden states and lm_head.weight, as transformers'
  ForCausalLMLoss does (labels shifted by one, or shift_labels as given; ignore_index -100; mean
  over the counted tokens, or sum / num_items_in_batch); the [tokens, vocab] logits are never
  made and the output's `logits` is None. Gemma2's final_logit_softcapping is the op's softcap.
  Without labels the forward is the class's own.

A module whose inputs fuselet does not take (a Llama norm weight of another dtype than x, a
cos table of another batch, a LoRA-wrapped projection...) falls back to transformers' code for
that call or is left as it was. transformers is imported only when fuse() is called.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types

import torch

from fuselet.torch.fused_linear_cross_entropy import fused_linear_cross_entropy
from fuselet.torch.glu import geglu, swiglu
from fuselet.torch.norm import rms_norm
from fuselet.torch.rope import rope

# model_type -> (modeling module, class prefix, RMSNorm is Gemma's (1 + weight)).
FAMILIES = {
    "llama": ("llama", "Llama", False),
    "mistral": ("mistral", "Mistral", False),
    "qwen2": ("qwen2", "Qwen2", False),
    "qwen3": ("qwen3", "Qwen3", False),
    "gemma": ("gemma", "Gemma", True),
    "gemma2": ("gemma2", "Gemma2", True),
}


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


def _family(model):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a transformers PreTrainedModel (a torch.nn.Module), got {type(model).__name__}")
    _check_transformers()
    supported = ", ".join(FAMILIES)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(
            f"model: {type(model).__name__} (model_type {model_type!r}) is not supported by "
            f"fuselet.torch.transformers.fuse; supported model types: {supported}"
        )
    stem, prefix, gemma = FAMILIES[model_type]
    modeling = importlib.import_module(f"transformers.models.{stem}.modeling_{stem}")
    return modeling, prefix, gemma


def _own_forward(module, fn) -> bool:
    """Give `module` (this instance only) the forward fn(module, ...); False where something
    (accelerate's hooks, an earlier fuse) already set one on the instance."""
    if "forward" in vars(module):
        return False
    module.forward = types.MethodType(fn, module)
    return True


# --- RMSNorm ---------------------------------------------------------------------------------


def _llama_norm_forward(self, x):
    w = self.weight
    if not isinstance(x, torch.Tensor) or w.dtype != x.dtype:  # transformers' output would be promoted
        return type(self).forward(self, x)
    return rms_norm(x, w, self.variance_epsilon)


def _gemma_norm_forward(self, x):
    w = self.weight
    if not isinstance(x, torch.Tensor) or w.dtype not in (x.dtype, torch.float32):
        return type(self).forward(self, x)
    return rms_norm(x, w, self.eps, zero_centered_gamma=True)


# --- gated MLP -------------------------------------------------------------------------------


def _glu_of(act):
    """The fuselet GLU for a transformers activation module, or None."""
    acts = importlib.import_module("transformers.activations")
    if isinstance(act, (acts.SiLUActivation, torch.nn.SiLU)):
        return swiglu
    if isinstance(act, acts.GELUTanh) or (isinstance(act, torch.nn.GELU) and act.approximate == "tanh"):
        return functools.partial(geglu, approximate="tanh")
    if isinstance(act, torch.nn.GELU) or type(act) is acts.GELUActivation:
        return functools.partial(geglu, approximate="none")
    return None


def _plain_linear(m) -> bool:
    """A torch.nn.Linear whose forward is Linear's own (not LoRA-wrapped or hooked)."""
    return isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward and "forward" not in vars(m)


def _mlp_forward(self, x):
    gate, up = self.gate_proj, self.up_proj
    if x.numel() >= x.shape[-1] * x.shape[-1]:
        # tokens >= H: concatenating the two [F, H] weights copies less than concatenating the
        # two [tokens, F] outputs; one matmul then gives [gate, up], what the GLU ops read
        weight = torch.cat((gate.weight, up.weight))
        bias = None if gate.bias is None else torch.cat((gate.bias, up.bias))
        gate_up = torch.nn.functional.linear(x, weight, bias)
    else:
        gate_up = torch.cat((gate(x), up(x)), dim=-1)
    return self.down_proj(self._fuselet_glu(gate_up))


# --- rotary embedding ------------------------------------------------------------------------


def _fused_rotary(original):
    """apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) through ft.rope, `original` otherwise."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
            return original(q, k, cos, sin, unsqueeze_dim)
        if cos.shape[0] != q.shape[0]:
            if cos.shape[0] != 1:
                return original(q, k, cos, sin, unsqueeze_dim)
            cos, sin = cos[0], sin[0]  # [1, S, D] position tables shared by the batch: [S, D]
        return rope(q, cos, sin, layout="bhsd"), rope(k, cos, sin, layout="bhsd")

    return apply_rotary_pos_emb


def _with_global(fn, name, value):
    """A copy of fn, and of the decorators wrapped around it (followed through __wrapped__ and
    their closures), whose innermost function reads the global `name` as `value`."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        namespace = dict(fn.__globals__)
        namespace[name] = value
        closure = fn.__closure__
    else:
        new_inner = _with_global(inner, name, value)
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
    plain = inspect.getclosurevars(type(wrapper).forward).nonlocals.get("func")
    return (wrapper, plain) if inspect.isfunction(plain) else None


def _fuse_kernelized_rotary(wrapper, plain) -> bool:
    """Give the instance's wrapper a forward through ft.rope (as `kernels.kernelize` gives it a
    hub kernel's): no copy of transformers' code, nothing for torch.compile to guard but it."""
    fused = _fused_rotary(plain)
    return _own_forward(wrapper, lambda self, *args, **kwargs: fused(*args, **kwargs))


@functools.cache
def _rope_forward(cls):
    """cls.forward with apply_rotary_pos_emb through ft.rope (one copy per attention class)."""
    fn = cls.forward
    base = inspect.unwrap(fn)
    if "apply_rotary_pos_emb" not in base.__code__.co_names:
        return None
    return _with_global(fn, "apply_rotary_pos_emb", _fused_rotary(base.__globals__["apply_rotary_pos_emb"]))


# --- causal-LM loss --------------------------------------------------------------------------

_LOSS_KWARGS = ("shift_labels", "num_items_in_batch", "ignore_index")


def _causal_lm_forward(lm_cls):
    """The fused-loss forward of the *ForCausalLM class lm_cls."""
    signature = inspect.signature(inspect.unwrap(lm_cls.forward))
    output_cls = importlib.import_module("transformers.modeling_outputs").CausalLMOutputWithPast

    def forward(self, *args, **kwargs):
        return _fused_loss_forward(self, signature, output_cls, args, kwargs)

    return forward


def _fused_loss_forward(self, signature, output_cls, args, kwargs):
    cls_forward = type(self).forward
    bound = signature.bind_partial(self, *args, **kwargs).arguments
    extra = dict(bound.pop("kwargs", {}))
    labels = bound.get("labels")
    if labels is None:  # transformers computes no loss then (shift_labels alone included)
        return cls_forward(self, *args, **kwargs)
    return_dict = extra.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    if "past_key_values" in extra:  # the name transformers still takes for `cache`
        bound["cache"] = extra.pop("past_key_values")
    shift_labels, num_items, ignore_index = (extra.pop(k, None) for k in _LOSS_KWARGS)
    ignore_index = -100 if ignore_index is None else ignore_index
    logits_to_keep = bound.get("logits_to_keep", 0)
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        raise ValueError(f"logits_to_keep: the fused loss needs every position (0) when labels are given, got {logits_to_keep!r}")
    outputs = self.model(
        **{k: bound.get(k) for k in ("input_ids", "attention_mask", "position_ids", "cache", "inputs_embeds", "use_cache")},
        **extra,
    )
    hidden = outputs.last_hidden_state
    if shift_labels is None:  # tokens < n predict n
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    lm_head = self.lm_head
    loss = fused_linear_cross_entropy(
        hidden,
        lm_head.weight,
        shift_labels.to(hidden.device),
        bias=lm_head.bias,
        ignore_index=ignore_index,
        softcap=getattr(self.config, "final_logit_softcapping", None),
        reduction="mean" if num_items is None else "sum",
    )
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    out = output_cls(
        loss=loss, logits=None, cache=outputs.cache, hidden_states=outputs.hidden_states, attentions=outputs.attentions
    )
    return out if return_dict else out.to_tuple()


# --- fuse ------------------------------------------------------------------------------------


def fuse(model, rms_norm: bool = True, swiglu: bool = True, rope: bool = True, loss: bool = True):
    """Swap fuselet's ops into this transformers model instance (Llama, Mistral, Qwen2, Qwen3,
    Gemma, Gemma2: a *ForCausalLM, or the bare *Model) and return it; see the module docstring.

    Each flag turns one swap on or off. Another architecture is a ValueError naming it and the
    supported model types; a non-module a TypeError. Fusing twice changes nothing more."""
    for name, flag in (("rms_norm", rms_norm), ("swiglu", swiglu), ("rope", rope), ("loss", loss)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    modeling, prefix, gemma = _family(model)
    norm_cls = getattr(modeling, f"{prefix}RMSNorm")
    mlp_cls = getattr(modeling, f"{prefix}MLP")
    attn_cls = getattr(modeling, f"{prefix}Attention")
    lm_cls = getattr(modeling, f"{prefix}ForCausalLM")
    for module in model.modules():
        if rms_norm and isinstance(module, norm_cls):
            _own_forward(module, _gemma_norm_forward if gemma else _llama_norm_forward)
        elif swiglu and isinstance(module, mlp_cls):
            glu = _glu_of(getattr(module, "act_fn", None))
            projections = (getattr(module, n, None) for n in ("gate_proj", "up_proj"))
            if glu is not None and all(map(_plain_linear, projections)) and "forward" not in vars(module):
                module._fuselet_glu = glu
                _own_forward(module, _mlp_forward)
        elif rope and isinstance(module, attn_cls):
            kernelized = _kernelized_rotary(module)
            if kernelized is not None:
                _fuse_kernelized_rotary(*kernelized)
            elif (forward := _rope_forward(attn_cls)) is not None:
                _own_forward(module, forward)
        elif loss and isinstance(module, lm_cls) and _plain_linear(module.lm_head):
            _own_forward(module, _causal_lm_forward(lm_cls))
    return model
