"""The layers `kernels.kernelize` swaps into transformers' marked layers. kernels takes a layer
as a stateless class (no constructor, no members beyond forward) whose forward has the
signature of the one it replaces; the work is in fuselet.torch.transformers."""

import torch

from fuselet.torch.transformers import _hub_norm, _hub_rotary


class RMSNorm(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states):
        return _hub_norm(self, hidden_states)


class RMSNormZeroCentered(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x):
        return _hub_norm(self, x)


class rotary_pos_emb(torch.nn.Module):  # noqa: N801 (transformers' name for the layer)
    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return _hub_rotary(self, q, k, cos, sin, unsqueeze_dim)
