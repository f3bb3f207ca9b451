"""Image-text (and other multimodal) models: which modules are their language stack, which are
their encoders, and the loss of a model whose head belongs to a language model inside it.

A model whose config has sub-configs (a text config apart from the model's own) and whose
`get_decoder()` is a module inside it is multimodal: fuse() serves the modules under that
decoder and the ones above it (the LMs whose loss it fuses), and leaves every other module (the
vision tower, an audio tower, the multimodal projector) as it is, with the reason in the report.

Most image-text classes (Qwen2/2.5/3-VL, Qwen3.5, Gemma3, Mistral3, LLaVA, InternVL) hold their
`lm_head` beside a base model that runs the encoders and the decoder, and take the causal-LM
path of fuselet.torch.transformers.loss as they are. Llama4ForConditionalGeneration holds a
whole Llama4ForCausalLM (`language_model`) and computes the loss itself from its logits: the
outer forward here, given labels, has the inner LM return its last hidden states in place of the
logits (a keyword its fused forward takes, passed down through the outer forward's **kwargs)
and runs the inner LM's fused loss on them."""

from __future__ import annotations

import inspect

import torch

from fuselet.torch.transformers.loss import HIDDEN_KWARG, _lm_loss
from fuselet.torch.transformers.probe import _close, _generator, _Left, _own_forward, _probe_device


def _language_scope(model):
    """The path of a multimodal model's decoder (its language model, `get_decoder()`), or None
    where the model is not multimodal or its decoder is not a module inside it."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    get_decoder = getattr(model, "get_decoder", None)
    if not callable(text) or not callable(get_decoder) or text() is config:
        return None
    try:
        decoder = get_decoder()
    except Exception:  # noqa: BLE001 - a model without one: no scope
        return None
    path = next((p for p, m in model.named_modules() if m is decoder), None)
    if not path:  # not found, or the model itself
        return None
    return path


def _outside(path: str, decoder_path: str) -> bool:
    """Whether the module at `path` is outside the language stack under `decoder_path`: neither
    inside the decoder nor one of the modules above it."""
    inside = path == decoder_path or path.startswith(decoder_path + ".")
    above = path == "" or decoder_path.startswith(path + ".")
    return not (inside or above)


def _outside_reason(model, path: str, decoder_path: str) -> str:
    """Why a module outside the language stack is left: the encoder or projector it is in."""
    top = path
    for part in range(1, path.count(".") + 2):
        prefix = ".".join(path.split(".")[:part])
        if not decoder_path.startswith(prefix + "."):
            top = prefix
            break
    owner = model.get_submodule(top)
    return (
        f"in {top} ({type(owner).__name__}), outside the language model ({decoder_path}): fuse() serves a multimodal "
        "model's language stack and leaves its encoders and projector as they are"
    )


def _inner_lm(module):
    """The fused LM inside `module` whose lm_head is module's output embeddings, or None."""
    if getattr(module, "lm_head", None) is not None or not callable(getattr(module, "get_output_embeddings", None)):
        return None
    try:
        head = module.get_output_embeddings()
    except Exception:  # noqa: BLE001 - a model without output embeddings: no inner LM
        return None
    if head is None:
        return None
    for child in module.modules():
        if child is not module and getattr(child, "lm_head", None) is head and "_fuselet_loss" in vars(child):
            return child
    return None


def _fused_outer_forward(self, *args, **kwargs):
    """The outer model's forward; given labels, its inner LM's fused loss on the last hidden states."""
    signature, inner = self._fuselet_outer_loss
    bound = signature.bind_partial(self, *args, **kwargs).arguments
    bound.pop("self", None)
    extra = dict(bound.pop("kwargs", {}))
    labels = bound.pop("labels", None)
    cls_forward = type(self).forward
    if labels is None or extra.get("output_router_logits", getattr(inner.config, "output_router_logits", False)):
        return cls_forward(self, *args, **kwargs)
    return_dict = bound.pop("return_dict", None)
    return_dict = getattr(self.config, "return_dict", True) if return_dict is None else return_dict
    loss_kwargs = {k: extra.pop(k) for k in ("shift_labels", "num_items_in_batch", "ignore_index") if k in extra}
    logits_to_keep = bound.get("logits_to_keep", 0)
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        raise ValueError(f"logits_to_keep: the fused loss needs every position (0) when labels are given, got {logits_to_keep!r}")
    outputs = cls_forward(self, **bound, return_dict=True, **extra, **{HIDDEN_KWARG: True})
    hidden = outputs.logits
    loss = _lm_loss(inner, hidden, labels, *(loss_kwargs.get(k) for k in ("shift_labels", "num_items_in_batch", "ignore_index")))
    out = type(outputs)(**{**{k: v for k, v in outputs.items() if k != "logits"}, "loss": loss, "logits": None})
    return out if return_dict else out.to_tuple()


def _fuse_outer_loss(module, inner) -> str:
    """Swap the outer forward of `module` (its head in the fused LM `inner`), checked on a probe."""
    signature = inspect.signature(inspect.unwrap(type(module).forward))
    if "labels" not in signature.parameters or not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        raise _Left("its forward takes no labels, or no **kwargs to pass down to its language model")
    like = _probe_device(module)
    vocab = min(inner.lm_head.out_features, getattr(module.config.get_text_config(), "vocab_size", None) or 1 << 62)
    tokens = torch.randint(0, vocab, (1, 8), generator=_generator()).to(like.device)
    module._fuselet_outer_loss = (signature, inner)
    with torch.no_grad():
        try:
            want = type(module).forward(module, input_ids=tokens, labels=tokens)
            got = _fused_outer_forward(module, input_ids=tokens, labels=tokens)
        except Exception as e:  # noqa: BLE001 - reported as the reason it is left
            del module._fuselet_outer_loss
            raise _Left(f"its forward failed on a probe of 8 tokens ({type(e).__name__}: {str(e)[:80]})") from None
    if not (isinstance(getattr(want, "loss", None), torch.Tensor) and _close(got.loss, want.loss, inner.lm_head.weight.dtype)):
        del module._fuselet_outer_loss
        raise _Left("the fused forward's loss differs from its forward's on the probe")
    if not _own_forward(module, _fused_outer_forward):
        del module._fuselet_outer_loss
        raise _Left("it already has a forward of its own (hooked, or fused)")
    path = next(p for p, m in module.named_modules() if m is inner)
    return f"ft.fused_linear_cross_entropy on {path}.lm_head"
