"""RMSNorm, LayerNorm, residual add + RMSNorm and gated RMSNorm for PyTorch: checked wrappers, fake impls,
autograd, modules.

Math and shapes: csrc/core/include/fuselet/norm.h. Statistics are float32; x is float32,
float16 or bfloat16; weight and bias are optional (None) and in x's dtype or float32 (the
math runs in float32, y has x's dtype, each parameter's gradient its parameter's dtype).
zero_centered_gamma=True scales by (1 + weight).
"""

from __future__ import annotations

import torch

from fuselet.spec import norm as spec
from fuselet.torch._args import check_dense, check_same_device, facts, op_tensors
from fuselet.torch._dtensor import rowwise, sharding

ops = torch.ops.fuselet


def _check(x, eps, zero_centered_gamma, **params) -> spec.NormOptions:
    check_dense("x", x)
    for name, t in params.items():
        check_dense(name, t, optional=True)
    options = spec.norm(facts(x), {n: facts(t) for n, t in params.items()}, eps, zero_centered_gamma)
    check_same_device("x", x, **params)
    return options


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, zero_centered_gamma: bool = False
) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, over the last dim of x [..., H].

    weight=None scales by 1; zero_centered_gamma=True scales by (1 + weight)."""
    options = _check(x, eps, zero_centered_gamma, weight=weight)
    return ops.rms_norm_fwd(x, weight, *options.op_args())[0]


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim of x [..., H].

    weight=None scales by 1, bias=None adds 0; zero_centered_gamma=True scales by (1 + weight)."""
    options = _check(x, eps, zero_centered_gamma, weight=weight, bias=bias)
    return ops.layer_norm_fwd(x, weight, bias, *options.op_args())[0]


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual_out): residual_out = x + residual (in x's dtype), y = rms_norm(residual_out, weight, eps).

    The pre-norm transformer step in one pass; residual has x's shape and dtype."""
    options = _check(x, eps, zero_centered_gamma, weight=weight)
    check_dense("residual", residual)
    spec.residual(facts(residual), facts(x))
    check_same_device("x", x, residual=residual)
    y, residual_out, _ = ops.add_rms_norm_fwd(x, residual, weight, *options.op_args())
    return y, residual_out


def gated_rms_norm(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """y = rms_norm(x) * weight * silu(z), or rms_norm(x * silu(z)) * weight with
    norm_before_gate=False (Mamba2's), each row of x [..., H] normalized in groups of group_size
    elements (None: the whole row).

    The gated norm of Qwen3-Next and Qwen3.5 (RMSNormGated), Mamba2, Bamba, FalconH1 and FLA;
    z (the gate) has x's shape and dtype."""
    check_dense("x", x)
    check_dense("z", z)
    check_dense("weight", weight, optional=True)
    options = spec.gated(facts(x), facts(z), {"weight": facts(weight)}, eps, group_size, norm_before_gate, zero_centered_gamma)
    check_same_device("x", x, z=z, weight=weight)
    return ops.gated_rms_norm_fwd(x, z, weight, *options.op_args())[0]


def _extra_repr(module) -> str:
    """What print(module) shows, in torch.nn's words: `1024, eps=1e-06, elementwise_affine=True, ...`."""
    parts = [str(module.hidden), f"eps={module.eps}", f"elementwise_affine={module.weight is not None}"]
    if hasattr(module, "bias"):
        parts.append(f"bias={module.bias is not None}")
    if module.zero_centered_gamma:
        parts.append("zero_centered_gamma=True")
    return ", ".join(parts)


def _add_parameter(module, name, present, hidden, fill, device, dtype):
    """module.<name>: a Parameter of `hidden` values `fill`, or None (registered, like torch.nn's)."""
    param = torch.nn.Parameter(torch.full((hidden,), fill, device=device, dtype=dtype)) if present else None
    module.register_parameter(name, param)


class RMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm's arguments (eps defaults to 1e-6 here), plus zero_centered_gamma:
    weight starts at 0 and the scale is (1 + weight)."""

    def __init__(
        self,
        hidden: int,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.hidden, self.eps, self.zero_centered_gamma = hidden, eps, zero_centered_gamma
        _add_parameter(self, "weight", elementwise_affine, hidden, 0.0 if zero_centered_gamma else 1.0, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        return _extra_repr(self)


class LayerNorm(torch.nn.Module):
    """torch.nn.LayerNorm's arguments (elementwise_affine, bias), plus zero_centered_gamma:
    weight starts at 0 and the scale is (1 + weight)."""

    def __init__(
        self,
        hidden: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.hidden, self.eps, self.zero_centered_gamma = hidden, eps, zero_centered_gamma
        _add_parameter(self, "weight", elementwise_affine, hidden, 0.0 if zero_centered_gamma else 1.0, device, dtype)
        _add_parameter(self, "bias", elementwise_affine and bias, hidden, 0.0, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        return _extra_repr(self)


class GatedRMSNorm(torch.nn.Module):
    """gated_rms_norm as a module, forward(x, z): weight of `hidden` ones (zeros with
    zero_centered_gamma), groups of group_size elements (None: the row), norm_before_gate."""

    def __init__(
        self,
        hidden: int,
        eps: float = 1e-6,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        elementwise_affine: bool = True,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.hidden, self.eps, self.zero_centered_gamma = hidden, eps, zero_centered_gamma
        self.group_size, self.norm_before_gate = group_size, norm_before_gate
        _add_parameter(self, "weight", elementwise_affine, hidden, 0.0 if zero_centered_gamma else 1.0, device, dtype)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, z, self.weight, self.eps, self.group_size, self.norm_before_gate, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        return f"{_extra_repr(self)}, group_size={self.group_size}, norm_before_gate={self.norm_before_gate}"


# --- fake (meta) implementations: shapes only, for torch.compile and FakeTensor ---------


def _rows(x):
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


def _grad_of(param, x):
    """The gradient output for an optional parameter: like it, or empty when it is None."""
    return x.new_empty(0) if param is None else torch.empty_like(param)


@torch.library.register_fake("fuselet::rms_norm_fwd")
def _(x, weight, eps, zero_centered_gamma=False):
    op_tensors(("weight",), x=x, weight=weight)
    spec.fwd_op(facts(x), {"weight": facts(weight)}, eps, zero_centered_gamma)
    return torch.empty_like(x, memory_format=torch.contiguous_format), _rows(x)


@torch.library.register_fake("fuselet::rms_norm_bwd")
def _(dy, x, weight, rstd, zero_centered_gamma=False):
    op_tensors(("weight",), x=x, dy=dy, weight=weight, rstd=rstd)
    spec.bwd_op(facts(x), {"weight": facts(weight)}, zero_centered_gamma, {"dy": facts(dy)}, {"rstd": facts(rstd)})
    return torch.empty_like(x, memory_format=torch.contiguous_format), _grad_of(weight, x)


@torch.library.register_fake("fuselet::add_rms_norm_fwd")
def _(x, residual, weight, eps, zero_centered_gamma=False):
    op_tensors(("weight",), x=x, residual=residual, weight=weight)
    spec.fwd_op(facts(x), {"weight": facts(weight)}, eps, zero_centered_gamma, residual=facts(residual))
    like = torch.empty_like(x, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like), _rows(x)


@torch.library.register_fake("fuselet::add_rms_norm_bwd")
def _(dy, dresidual_out, residual_out, weight, rstd, zero_centered_gamma=False):
    op_tensors(("weight",), residual_out=residual_out, dy=dy, dresidual_out=dresidual_out, weight=weight, rstd=rstd)
    grads = {"dy": facts(dy), "dresidual_out": facts(dresidual_out)}
    spec.bwd_op(facts(residual_out), {"weight": facts(weight)}, zero_centered_gamma, grads, {"rstd": facts(rstd)}, "residual_out")
    return torch.empty_like(residual_out, memory_format=torch.contiguous_format), _grad_of(weight, residual_out)


@torch.library.register_fake("fuselet::layer_norm_fwd")
def _(x, weight, bias, eps, zero_centered_gamma=False):
    op_tensors(("weight", "bias"), x=x, weight=weight, bias=bias)
    spec.fwd_op(facts(x), {"weight": facts(weight), "bias": facts(bias)}, eps, zero_centered_gamma)
    return torch.empty_like(x, memory_format=torch.contiguous_format), _rows(x), _rows(x)


@torch.library.register_fake("fuselet::layer_norm_bwd")
def _(dy, x, weight, bias, mean, rstd, zero_centered_gamma=False):
    op_tensors(("weight", "bias"), x=x, dy=dy, weight=weight, bias=bias, mean=mean, rstd=rstd)
    params = {"weight": facts(weight), "bias": facts(bias)}
    spec.bwd_op(facts(x), params, zero_centered_gamma, {"dy": facts(dy)}, {"mean": facts(mean), "rstd": facts(rstd)})
    return torch.empty_like(x, memory_format=torch.contiguous_format), _grad_of(weight, x), _grad_of(bias, x)


@torch.library.register_fake("fuselet::gated_rms_norm_fwd")
def _(x, z, weight, eps, group_size=0, norm_before_gate=True, zero_centered_gamma=False):
    op_tensors(("weight",), x=x, z=z, weight=weight)
    groups = spec.gated_fwd_op(facts(x), facts(z), {"weight": facts(weight)}, eps, group_size, zero_centered_gamma)
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((*x.shape[:-1], groups), dtype=torch.float32)


@torch.library.register_fake("fuselet::gated_rms_norm_bwd")
def _(dy, x, z, weight, rstd, group_size=0, norm_before_gate=True, zero_centered_gamma=False):
    op_tensors(("weight",), x=x, dy=dy, z=z, weight=weight, rstd=rstd)
    spec.gated_bwd_op(facts(x), facts(z), {"weight": facts(weight)}, group_size, zero_centered_gamma, facts(dy), facts(rstd))
    like = torch.empty_like(x, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like), _grad_of(weight, x)


# --- DTensor sharding (fuselet.torch._dtensor): rows keep their sharding, H is whole --------
# weight / bias replicated; dweight / dbias Partial (each rank sums its rows' share).


@sharding("rms_norm_fwd")
def _(x, weight, eps, zero_centered_gamma=False):
    return rowwise([(x, "rows"), (weight, "param"), (eps, None), (zero_centered_gamma, None)], ["rows", "rows"])


@sharding("rms_norm_bwd")
def _(dy, x, weight, rstd, zero_centered_gamma=False):
    return rowwise(
        [(dy, "rows"), (x, "rows"), (weight, "param"), (rstd, "rows"), (zero_centered_gamma, None)], ["rows", ("sum", weight)]
    )


@sharding("add_rms_norm_fwd")
def _(x, residual, weight, eps, zero_centered_gamma=False):
    return rowwise(
        [(x, "rows"), (residual, "rows"), (weight, "param"), (eps, None), (zero_centered_gamma, None)], ["rows", "rows", "rows"]
    )


@sharding("add_rms_norm_bwd")
def _(dy, dresidual_out, residual_out, weight, rstd, zero_centered_gamma=False):
    return rowwise(
        [
            (dy, "rows"),
            (dresidual_out, "rows"),
            (residual_out, "rows"),
            (weight, "param"),
            (rstd, "rows"),
            (zero_centered_gamma, None),
        ],
        ["rows", ("sum", weight)],
    )


@sharding("layer_norm_fwd")
def _(x, weight, bias, eps, zero_centered_gamma=False):
    return rowwise(
        [(x, "rows"), (weight, "param"), (bias, "param"), (eps, None), (zero_centered_gamma, None)], ["rows", "rows", "rows"]
    )


@sharding("layer_norm_bwd")
def _(dy, x, weight, bias, mean, rstd, zero_centered_gamma=False):
    return rowwise(
        [
            (dy, "rows"),
            (x, "rows"),
            (weight, "param"),
            (bias, "param"),
            (mean, "rows"),
            (rstd, "rows"),
            (zero_centered_gamma, None),
        ],
        ["rows", ("sum", weight), ("sum", bias)],
    )


@sharding("gated_rms_norm_fwd")
def _(x, z, weight, eps, group_size=0, norm_before_gate=True, zero_centered_gamma=False):
    scalars = [(eps, None), (group_size, None), (norm_before_gate, None), (zero_centered_gamma, None)]
    return rowwise([(x, "rows"), (z, "rows"), (weight, "param"), *scalars], ["rows", "rows"])


@sharding("gated_rms_norm_bwd")
def _(dy, x, z, weight, rstd, group_size=0, norm_before_gate=True, zero_centered_gamma=False):
    scalars = [(group_size, None), (norm_before_gate, None), (zero_centered_gamma, None)]
    return rowwise(
        [(dy, "rows"), (x, "rows"), (z, "rows"), (weight, "param"), (rstd, "rows"), *scalars], ["rows", "rows", ("sum", weight)]
    )


# --- autograd: the backward of each forward op is itself a registered op ----------------


def _rms_setup(ctx, inputs, output):
    x, weight, _, ctx.zero_centered_gamma = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    dx, dweight = ops.rms_norm_bwd(dy, x, weight, rstd, ctx.zero_centered_gamma)
    return dx, None if weight is None else dweight, None, None


def _layer_setup(ctx, inputs, output):
    x, weight, bias, _, ctx.zero_centered_gamma = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])


def _layer_backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    dx, dweight, dbias = ops.layer_norm_bwd(dy, x, weight, bias, mean, rstd, ctx.zero_centered_gamma)
    return dx, None if weight is None else dweight, None if bias is None else dbias, None, None


def _add_rms_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not a plain-tensor 0
    _, _, weight, _, ctx.zero_centered_gamma = inputs
    ctx.save_for_backward(output[1], weight, output[2])


def _add_rms_backward(ctx, dy, dresidual_out, _drstd):
    residual_out, weight, rstd = ctx.saved_tensors
    if dy is None and dresidual_out is None:
        return None, None, None, None, None
    dy = torch.zeros_like(residual_out) if dy is None else dy
    dresidual_out = torch.zeros_like(residual_out) if dresidual_out is None else dresidual_out
    dx, dweight = ops.add_rms_norm_bwd(dy, dresidual_out, residual_out, weight, rstd, ctx.zero_centered_gamma)
    return dx, dx, None if weight is None else dweight, None, None


def _gated_setup(ctx, inputs, output):
    x, z, weight, _, ctx.group_size, ctx.norm_before_gate, ctx.zero_centered_gamma = inputs
    ctx.save_for_backward(x, z, weight, output[1])


def _gated_backward(ctx, dy, _drstd):
    x, z, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    options = (ctx.group_size, ctx.norm_before_gate, ctx.zero_centered_gamma)
    dx, dz, dweight = ops.gated_rms_norm_bwd(dy, x, z, weight, rstd, *options)
    return dx, dz, None if weight is None else dweight, None, None, None, None


torch.library.register_autograd("fuselet::gated_rms_norm_fwd", _gated_backward, setup_context=_gated_setup)
torch.library.register_autograd("fuselet::add_rms_norm_fwd", _add_rms_backward, setup_context=_add_rms_setup)
torch.library.register_autograd("fuselet::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)
torch.library.register_autograd("fuselet::layer_norm_fwd", _layer_backward, setup_context=_layer_setup)
