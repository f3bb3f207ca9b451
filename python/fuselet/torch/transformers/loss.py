"""The causal-LM loss: which modules are LMs (a plain-Linear lm_head over a base model, a
`labels` argument), the head's extras (logit scale, final softcap) the probe confirms, and the
fused forward that, given labels, runs the base model and ft.fused_linear_cross_entropy on its
last hidden states as transformers' ForCausalLMLoss does, without the [tokens, vocab] logits."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

import torch

from fuselet.torch._dtensor import is_dtensor
from fuselet.torch.fused_linear_cross_entropy import fused_linear_cross_entropy
from fuselet.torch.transformers.probe import (
    _close,
    _closest,
    _generator,
    _Left,
    _own_forward,
    _plain_linear,
    _probe_device,
)

_LOSS_KWARGS = ("shift_labels", "num_items_in_batch", "ignore_index")
# the keyword an outer model's fused forward passes down to its inner LM's (multimodal.py): return
# the last hidden states as `logits`, no loss
HIDDEN_KWARG = "_fuselet_hidden_as_logits"


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
        # the head kept sharded (vocab-parallel: each rank its own rows, docs: Tensor parallel)
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
    hidden_as_logits = extra.pop(HIDDEN_KWARG, False)  # from an outer model's fused forward (multimodal.py)
    if hidden_as_logits:
        if labels is not None:
            raise ValueError(f"labels: {type(self).__name__} is asked for its hidden states and a loss at once")
    elif labels is None or extra.get("output_router_logits", getattr(self.config, "output_router_logits", False)):
        return cls_forward(self, *args, **kwargs)  # no loss asked (shift_labels alone included), or an aux loss
    return_dict = extra.pop("return_dict", bound.pop("return_dict", None))
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    if "past_key_values" in extra and base_params is not None and "cache" in base_params:
        bound["cache"] = extra.pop("past_key_values")  # the name transformers still takes for `cache`
    shift_labels, num_items, ignore_index = (extra.pop(k, None) for k in _LOSS_KWARGS)
    logits_to_keep = bound.pop("logits_to_keep", 0)
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        raise ValueError(f"logits_to_keep: the fused loss needs every position (0) when labels are given, got {logits_to_keep!r}")
    passed = {k: v for k, v in bound.items() if base_params is None or k in base_params}
    outputs = _base_model(self)(**passed, **extra)
    hidden = outputs[0]
    if hidden_as_logits:
        out = output_cls(loss=None, logits=hidden, **{f: getattr(outputs, f) for f in fields if hasattr(outputs, f)})
        return out if return_dict else out.to_tuple()
    loss = _lm_loss(self, hidden, labels, shift_labels, num_items, ignore_index)
    out = output_cls(loss=loss, logits=None, **{f: getattr(outputs, f) for f in fields if hasattr(outputs, f)})
    return out if return_dict else out.to_tuple()


def _lm_loss(lm, hidden, labels, shift_labels=None, num_items=None, ignore_index=None):
    """The fused LM `lm`'s loss on its last hidden states, as transformers' ForCausalLMLoss: labels
    shifted by one (or shift_labels as given), mean over counted tokens or sum / num_items."""
    extras = lm._fuselet_loss[4]
    ignore_index = -100 if ignore_index is None else ignore_index
    if shift_labels is None:  # tokens < n predict n
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = _head_loss(hidden, lm.lm_head, shift_labels, ignore_index, extras, "mean" if num_items is None else "sum")
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return loss


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
