"""The layers `kernels.kernelize` swaps into transformers' marked layers. kernels takes a layer
as a stateless class (no constructor, no members beyond forward) whose forward has the
signature of the one it replaces. Each checks the class it replaces once (the checks of
fuselet.torch.transformers) and runs that class's own forward where fuselet's op does not
equal it. Under torch.compile the check runs at trace time, its answer a constant
(torch.compiler.assume_constant_result, which imports torch._dynamo: hence here, imported
only when kernels loads the repository, and not in fuselet.torch.transformers)."""

import torch

from fuselet.torch import transformers as _t


@torch.compiler.assume_constant_result
def _norm_form_of(cls):
    return _t._class_norm_form(cls)


@torch.compiler.assume_constant_result
def _rotary_form_of(cls, size, width):
    return _t._class_rotary_form(cls, size, width)


def _norm(module, x):
    form = _norm_form_of(type(module))
    if form is None:
        return type(module).forward(module, x)
    op, attr, zc, mixed = form
    return _t._norm_run(module, x, (op, getattr(module, attr), zc), mixed)


def _rotary(module, q, k, cos, sin, unsqueeze_dim):
    plain = type(module).forward
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in (q, k, cos)):
        return plain(module, q, k, cos, sin, unsqueeze_dim)
    index = _rotary_form_of(type(module), q.shape[-1], cos.shape[-1])
    if index is None:
        return plain(module, q, k, cos, sin, unsqueeze_dim)
    fused = _t._fused_rotary(lambda *a, **kw: plain(module, *a, **kw), _t._ROPE_FORMS[index])
    return fused(q, k, cos, sin, unsqueeze_dim)


class RMSNorm(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states):
        return _norm(self, hidden_states)


class RMSNormZeroCentered(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x):
        return _norm(self, x)


class rotary_pos_emb(torch.nn.Module):  # noqa: N801 (transformers' name for the layer)
    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return _rotary(self, q, k, cos, sin, unsqueeze_dim)
