"""The gated MLPs and the MoE experts' gates: the projection layouts (gate / up / down, w1 / w3 /
w2, Phi3's fused gate_up), the fuselet GLU of a transformers activation, the fused MLP forward
(gate and up in one matmul, then ft.swiglu / ft.geglu), and the gate of transformers' experts
interface (`_apply_gate`) through the GLU of its act_fn or GPT-OSS's ft.clamped_swiglu."""

from __future__ import annotations

import functools
import importlib
import inspect
import types

import torch

from fuselet.torch.glu import clamped_swiglu, geglu, swiglu
from fuselet.torch.transformers.probe import _close, _closest, _Left, _own_forward, _plain_linear, _probe_device, _randn

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
