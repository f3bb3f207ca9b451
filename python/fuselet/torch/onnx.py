"""ONNX export of modules that use fuselet ops: each forward op written in standard ONNX.

    import fuselet.torch.onnx
    torch.onnx.export(model, args, dynamo=True, opset_version=23,
                      custom_translation_table=fuselet.torch.onnx.translations(opset_version=23))

`translations()` maps each forward op (`torch.ops.fuselet.<op>_fwd.default`, and the python ops
`fused_linear_cross_entropy_{none,reduced}.default`) to a python function of onnxscript ops: the op's math
(csrc/core/include/fuselet/*.h), in float32, cast back to x's dtype where the op does. Pass it
the opset_version given to torch.onnx.export (18 or more): from 23 the RMS norms use
RMSNormalization, from 20 GeGLU uses Gelu, below that decompositions; LayerNorm is
LayerNormalization, softmax Softmax (the causal mask a Where), rope, SwiGLU and cross-entropy
decompositions. The TorchScript exporter (torch.onnx.export(..., dynamo=False), opsets up to 20,
deprecated in torch) gets the same math from register_torchscript().

The ops that return gradients with the loss are translated with their gradients
(cross_entropy.fwd_bwd, fused_linear_cross_entropy with reduction "mean" / "sum"; a graph that
uses only the loss drops them). The others (the backward ops, fwd_bwd(inplace=True)) are in the
table too, as translations that fail with the reason and what to call instead. (A mutating op
never reaches its translation in the dynamo exporter of torch 2.13: its auto_functionalized_v2
node fails with a KeyError on the op's name first.)

onnxscript is imported when translations() is called: importing fuselet.torch needs neither it
nor onnx.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch

ops = torch.ops.fuselet

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TANH_K, _TANH_C = math.sqrt(2.0 / math.pi), 0.044715
_FLOAT, _INT64 = 1, 7  # onnx.TensorProto element types


# --- the math, once, against a small builder (one for each exporter) --------------------


def _f32(b, x):
    """x as float32 (a traced value's type may be unknown: then a Cast, a no-op on float32)."""
    return x if b.elem_type(x) == _FLOAT else b.op("Cast", x, to=_FLOAT)


def _like(b, y, x):
    """y (float32) in x's element type."""
    return y if b.elem_type(x) == _FLOAT else b.op("Cast", y, to=b.elem_type(x))


def _axes(b, *axes):
    return b.const(list(axes), _INT64)


def _scale(b, weight, zero_centered_gamma):
    """The float32 factor of the norms: weight, 1 + weight, or None (no weight)."""
    if weight is None:
        return None
    w = _f32(b, weight)
    return b.op("Add", w, b.const(1.0, _FLOAT)) if zero_centered_gamma else w


def _ones_of_last_dim(b, xf):
    return b.op("ConstantOfShape", b.op("Shape", xf, start=-1), value=b.tensor([1.0], _FLOAT))


def _rms(b, x, weight, eps, zero_centered_gamma, like=None):
    """(y in the dtype of `like` (default x), rstd [...] float32) of RMSNorm over the last dim."""
    xf = _f32(b, x)
    mean_sq = b.op("ReduceMean", b.op("Mul", xf, xf), _axes(b, -1), keepdims=1)
    rstd = b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean_sq, b.const(float(eps), _FLOAT))))
    scale = _scale(b, weight, zero_centered_gamma)
    if b.opset >= 23:
        y = b.op(
            "RMSNormalization",
            xf,
            _ones_of_last_dim(b, xf) if scale is None else scale,
            axis=-1,
            epsilon=float(eps),
            stash_type=_FLOAT,
        )
    else:
        y = b.op("Mul", xf, rstd)
        y = y if scale is None else b.op("Mul", y, scale)
    return _like(b, y, x if like is None else like), b.op("Squeeze", rstd, _axes(b, -1))


def rms_norm_fwd(b, x, weight, eps, zero_centered_gamma=False):
    return _rms(b, x, weight, eps, zero_centered_gamma)


def add_rms_norm_fwd(b, x, residual, weight, eps, zero_centered_gamma=False):
    residual_out = b.op("Add", x, residual)  # in x's dtype, as the op rounds it
    y, rstd = _rms(b, residual_out, weight, eps, zero_centered_gamma, like=x)
    return y, residual_out, rstd


def gated_rms_norm_fwd(b, x, z, weight, eps, group_size=0, norm_before_gate=True, zero_centered_gamma=False):
    xf, zf = _f32(b, x), _f32(b, z)
    gate = b.op("Mul", zf, b.op("Sigmoid", zf))
    h = xf if norm_before_gate else b.op("Mul", xf, gate)
    if group_size:  # [..., H] -> [..., G, S]
        groups = b.op("Reshape", h, b.op("Concat", b.op("Shape", h, end=-1), b.const([-1, int(group_size)], _INT64), axis=0))
    else:  # one group: [..., 1, H]
        groups = b.op("Unsqueeze", h, _axes(b, -2))
    mean_sq = b.op("ReduceMean", b.op("Mul", groups, groups), _axes(b, -1), keepdims=1)
    rstd = b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean_sq, b.const(float(eps), _FLOAT))))
    y = b.op("Reshape", b.op("Mul", groups, rstd), b.op("Shape", h))
    scale = _scale(b, weight, zero_centered_gamma)
    y = y if scale is None else b.op("Mul", y, scale)
    y = b.op("Mul", y, gate) if norm_before_gate else y
    return _like(b, y, x), b.op("Squeeze", rstd, _axes(b, -1))


def layer_norm_fwd(b, x, weight, bias, eps, zero_centered_gamma=False):
    xf = _f32(b, x)
    scale = _scale(b, weight, zero_centered_gamma)
    inputs = [xf, _ones_of_last_dim(b, xf) if scale is None else scale]
    if bias is not None:
        inputs.append(_f32(b, bias))
    y, mean, rstd = b.op("LayerNormalization", *inputs, axis=-1, epsilon=float(eps), stash_type=_FLOAT, outputs=3)
    return _like(b, y, x), b.op("Squeeze", mean, _axes(b, -1)), b.op("Squeeze", rstd, _axes(b, -1))


def _halves(b, x):
    """x [..., 2F] -> (x[..., :F], x[..., F:])."""
    return b.op("Split", x, axis=-1, num_outputs=2, outputs=2)


def swiglu_fwd(b, x):
    gate, up = (_f32(b, h) for h in _halves(b, x))
    return _like(b, b.op("Mul", b.op("Mul", gate, b.op("Sigmoid", gate)), up), x)


def _pairs(b, x):
    """x [..., 2F] interleaved [g0, u0, g1, u1, ...] -> (x[..., 0::2], x[..., 1::2])."""
    end, axes, steps = b.const([2**62], _INT64), b.const([-1], _INT64), b.const([2], _INT64)
    return tuple(b.op("Slice", x, b.const([start], _INT64), end, axes, steps) for start in (0, 1))


def clamped_swiglu_fwd(b, x, alpha=1.702, limit=7.0, interleaved=False):
    gate, up = (_f32(b, h) for h in (_pairs(b, x) if interleaved else _halves(b, x)))
    bound = b.const(float(limit), _FLOAT)
    gate = b.op("Min", gate, bound)
    up = b.op("Clip", up, b.const(-float(limit), _FLOAT), bound)
    glu = b.op("Mul", gate, b.op("Sigmoid", b.op("Mul", gate, b.const(float(alpha), _FLOAT))))
    return _like(b, b.op("Mul", glu, b.op("Add", up, b.const(1.0, _FLOAT))), x)


def _gelu(b, g, approximate):
    if b.opset >= 20:
        return b.op("Gelu", g, approximate=approximate)
    half = b.op("Mul", g, b.const(0.5, _FLOAT))
    if approximate == "tanh":
        cube = b.op("Mul", b.op("Mul", g, g), g)
        inner = b.op("Mul", b.op("Add", g, b.op("Mul", cube, b.const(_TANH_C, _FLOAT))), b.const(_TANH_K, _FLOAT))
        return b.op("Mul", half, b.op("Add", b.op("Tanh", inner), b.const(1.0, _FLOAT)))
    erf = b.op("Erf", b.op("Mul", g, b.const(_SQRT1_2, _FLOAT)))
    return b.op("Mul", half, b.op("Add", erf, b.const(1.0, _FLOAT)))


def geglu_fwd(b, x, approximate="none"):
    gate, up = (_f32(b, h) for h in _halves(b, x))
    return _like(b, b.op("Mul", _gelu(b, gate, approximate), up), x)


def softmax_fwd(b, x, scale=1.0, causal=False):
    """softmax(scale * x) over the last dim; causal: key j hidden from query i when j > i + (K - Q),
    a fully masked row is zeros (the op's rule; ONNX Softmax would give NaN there)."""
    z = _f32(b, x)
    if scale != 1.0:
        z = b.op("Mul", z, b.const(float(scale), _FLOAT))
    if not causal:
        return _like(b, b.op("Softmax", z, axis=-1), x)
    q = b.op("Squeeze", b.op("Shape", z, start=-2, end=-1), _axes(b, 0))
    k = b.op("Squeeze", b.op("Shape", z, start=-1), _axes(b, 0))
    zero, one = b.const(0, _INT64), b.const(1, _INT64)
    rows = b.op("Unsqueeze", b.op("Add", b.op("Range", zero, q, one), b.op("Sub", k, q)), _axes(b, -1))
    hidden = b.op("Greater", b.op("Range", zero, k, one), rows)  # [Q, K]
    z = b.op("Where", hidden, b.const(-math.inf, _FLOAT), z)
    y = b.op("Where", hidden, b.const(0.0, _FLOAT), b.op("Softmax", z, axis=-1))
    return _like(b, y, x)


def _rope_full_table(b, t, interleaved, pair_table, sections, interleaved_sections):
    """A pair table and / or K section tables (fuselet/rope.h) as the full-width table they stand
    for, float32. With sections R = 2 sum(sections) is known, and feature i's table and column
    are constants; a pair table alone repeats its columns (interleaved) or itself (half-split)."""
    from fuselet.spec.rope import sections_table

    t = _f32(b, t)
    if not sections:
        if interleaved:  # [..., W] -> [..., W, 2] -> [..., 2W]
            t = b.op("Unsqueeze", t, _axes(b, -1))
            both = b.op("Concat", t, t, axis=-1)
            return b.op("Reshape", both, b.op("Concat", b.op("Shape", t, end=-2), b.const([-1], _INT64), axis=0))
        return b.op("Concat", t, t, axis=-1)
    r = 2 * sum(sections)
    pair = [i // 2 if interleaved else i % (r // 2) for i in range(r)]
    table = [sections_table(j, tuple(sections), interleaved_sections) for j in pair]
    column = b.const(pair if pair_table else list(range(r)), _INT64)
    full = None
    for k in sorted(set(table)):
        tk = b.op("Gather", t, b.const(k, _INT64), axis=0)  # table k: [..., W]
        part = b.op("Gather", tk, column, axis=-1)
        if full is None:
            full = part
        else:
            mask = b.op("Cast", b.const([1 if v == k else 0 for v in table], _INT64), to=9)  # BOOL
            full = b.op("Where", mask, part, full)
    return full


def rope_fwd(b, x, cos, sin, bhsd=False, interleaved=False, pair_table=False, sections=None, interleaved_sections=False):
    """y_i = x_i cos_i + rot(x)_i sin_i over the first R features, x_i beyond (a pair table and
    K section tables read as the full-width table they stand for)."""
    if pair_table or sections:
        cos, sin = (_rope_full_table(b, t, interleaved, pair_table, sections, interleaved_sections) for t in (cos, sin))
    c, s = (b.op("Unsqueeze", _f32(b, t), _axes(b, -3 if bhsd else -2)) for t in (cos, sin))
    rotary = b.op("Shape", cos, start=-1)
    xf = _f32(b, x)
    xr = b.op("Slice", xf, b.const([0], _INT64), rotary, _axes(b, -1))
    rest = b.op("Slice", xf, rotary, b.const([2**62], _INT64), _axes(b, -1))
    if interleaved:  # pairs (2j, 2j+1): rot = (-x_{2j+1}, x_{2j})
        pairs = b.op("Reshape", xr, b.op("Concat", b.op("Shape", xr, end=-1), b.const([-1, 2], _INT64), axis=0))
        even, odd = b.op("Split", pairs, axis=-1, num_outputs=2, outputs=2)
        rot = b.op("Reshape", b.op("Concat", b.op("Neg", odd), even, axis=-1), b.op("Shape", xr))
    else:  # halves: rot = (-x2, x1)
        x1, x2 = _halves(b, xr)
        rot = b.op("Concat", b.op("Neg", x2), x1, axis=-1)
    y = b.op("Add", b.op("Mul", xr, c), b.op("Mul", rot, s))
    return _like(b, b.op("Concat", y, rest, axis=-1), x)


def _cross_entropy(b, logits, target, ignore_index, label_smoothing, z_loss, softcap):
    """{"loss", "z", "lse" (float32 per token, 0 where target == ignore_index), "s" (the capped
    float32 logits), "valid", "target" (int64, 0 where ignored), "lse_raw" (unmasked)}."""
    s = _f32(b, logits)
    if softcap > 0.0:
        cap = b.const(float(softcap), _FLOAT)
        s = b.op("Mul", b.op("Tanh", b.op("Div", s, cap)), cap)
    m = b.op("ReduceMax", s, _axes(b, -1), keepdims=1)
    total = b.op("ReduceSum", b.op("Exp", b.op("Sub", s, m)), _axes(b, -1), keepdims=0)
    lse = b.op("Add", b.op("Log", total), b.op("Squeeze", m, _axes(b, -1)))
    t = b.op("Cast", target, to=_INT64)
    valid = b.op("Not", b.op("Equal", t, b.const(int(ignore_index), _INT64)))
    safe = b.op("Where", valid, t, b.const(0, _INT64))
    s_t = b.op("Squeeze", b.op("GatherElements", s, b.op("Unsqueeze", safe, _axes(b, -1)), axis=-1), _axes(b, -1))
    loss = b.op("Mul", b.op("Sub", lse, s_t), b.const(1.0 - float(label_smoothing), _FLOAT))
    if label_smoothing != 0.0:
        mean_s = b.op("ReduceMean", s, _axes(b, -1), keepdims=0)
        loss = b.op("Add", loss, b.op("Mul", b.op("Sub", lse, mean_s), b.const(float(label_smoothing), _FLOAT)))
    z = b.op("Mul", b.op("Mul", lse, lse), b.const(float(z_loss), _FLOAT))
    loss = b.op("Add", loss, z)
    zero = b.const(0.0, _FLOAT)
    out = {k: b.op("Where", valid, v, zero) for k, v in (("loss", loss), ("z", z), ("lse", lse))}
    return {**out, "s": s, "valid": valid, "target": safe, "lse_raw": lse}


def _dlogits(b, ce, label_smoothing, z_loss, softcap, scale):
    """float32 scale * d loss_token / d logits of _cross_entropy's result: scale * (p (1 + 2 z_loss
    lse) - (1 - ls) onehot(t) - ls / V), times 1 - (s / softcap)^2 with a softcap, 0 rows where ignored."""
    one = b.const(1.0, _FLOAT)
    s, lse = ce["s"], b.op("Unsqueeze", ce["lse_raw"], _axes(b, -1))
    vocab = b.op("Squeeze", b.op("Shape", s, start=-1), _axes(b, 0))
    zero_i, one_i = b.const(0, _INT64), b.const(1, _INT64)
    onehot = b.op(
        "Cast", b.op("Equal", b.op("Range", zero_i, vocab, one_i), b.op("Unsqueeze", ce["target"], _axes(b, -1))), to=_FLOAT
    )
    p = b.op("Exp", b.op("Sub", s, lse))
    ds = b.op("Mul", p, b.op("Add", one, b.op("Mul", lse, b.const(2.0 * float(z_loss), _FLOAT))))
    ds = b.op("Sub", ds, b.op("Mul", onehot, b.const(1.0 - float(label_smoothing), _FLOAT)))
    if label_smoothing != 0.0:
        ds = b.op("Sub", ds, b.op("Div", b.const(float(label_smoothing), _FLOAT), b.op("Cast", vocab, to=_FLOAT)))
    if softcap > 0.0:
        ratio = b.op("Div", s, b.const(float(softcap), _FLOAT))
        ds = b.op("Mul", ds, b.op("Sub", one, b.op("Mul", ratio, ratio)))
    return b.op("Where", b.op("Unsqueeze", ce["valid"], _axes(b, -1)), b.op("Mul", ds, scale), b.const(0.0, _FLOAT))


def cross_entropy_fwd(b, logits, target, ignore_index, label_smoothing, z_loss, softcap):
    """(loss, z, lse) float32 per token, 0 where target == ignore_index (cross_entropy.h)."""
    ce = _cross_entropy(b, logits, target, ignore_index, label_smoothing, z_loss, softcap)
    return ce["loss"], ce["z"], ce["lse"]


def cross_entropy_fwd_bwd(b, logits, target, ignore_index, label_smoothing, z_loss, softcap, grad_scale):
    """(loss, z, dlogits): the per-token loss and z-loss part, and grad_scale * d loss_token / d logits
    in the logits' dtype."""
    ce = _cross_entropy(b, logits, target, ignore_index, label_smoothing, z_loss, softcap)
    ds = _dlogits(b, ce, label_smoothing, z_loss, softcap, b.const(float(grad_scale), _FLOAT))
    return ce["loss"], ce["z"], _like(b, ds, logits)


def divergence_fwd(b, input, target, kind, log_target, beta):
    """The float32 loss per row of fuselet/divergence.h (kind 0 KL, 1 JSD, 2 TVD); a weight-0 term
    is 0 (0 log 0 = 0)."""
    x, t = _f32(b, input), _f32(b, target)
    zero = b.const(0.0, _FLOAT)

    def weighted(w, a):  # w * a, 0 where w == 0
        return b.op("Where", b.op("Greater", w, zero), b.op("Mul", w, a), zero)

    q = b.op("Exp", x)
    p, lp = (b.op("Exp", t), t) if log_target else (t, b.op("Log", t))
    if kind == 2:
        terms = b.op("Mul", b.op("Abs", b.op("Sub", p, q)), b.const(0.5, _FLOAT))
    elif kind == 0 or beta == 0.0:
        terms = weighted(p, b.op("Sub", lp, x))
    elif beta == 1.0:
        terms = weighted(q, b.op("Sub", x, lp))
    else:
        bp, bq = b.op("Mul", p, b.const(float(beta), _FLOAT)), b.op("Mul", q, b.const(1.0 - float(beta), _FLOAT))
        lm = b.op("Log", b.op("Add", bp, bq))
        terms = b.op("Add", weighted(bp, b.op("Sub", lp, lm)), weighted(bq, b.op("Sub", x, lm)))
    return b.op("ReduceSum", terms, _axes(b, -1), keepdims=0)


def _matmul_logits(b, hidden, weight, bias):
    logits = b.op("MatMul", hidden, b.op("Transpose", weight, perm=[1, 0]))
    return logits if bias is None else b.op("Add", logits, bias)


def fused_linear_cross_entropy_none(b, hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, chunk_size):
    """The per-token op with its logits materialized (no chunks: ONNX runtimes plan their own memory)."""
    return cross_entropy_fwd(b, _matmul_logits(b, hidden, weight, bias), target, ignore_index, label_smoothing, z_loss, softcap)


def fused_linear_cross_entropy_reduced(
    b, hidden, weight, bias, target, ignore_index, label_smoothing, z_loss, softcap, mean, chunk_size
):
    """(loss, z, dhidden, dweight, dbias) of the mean (or sum) loss over hidden [N, H]. The op returns
    its gradients with the loss, so they are written out too; a graph that uses only the loss loses
    them to the exporter's dead-code removal."""
    ce = _cross_entropy(b, _matmul_logits(b, hidden, weight, bias), target, ignore_index, label_smoothing, z_loss, softcap)
    one = b.const(1.0, _FLOAT)
    scale = one
    if mean:
        count = b.op("ReduceSum", b.op("Cast", ce["valid"], to=_FLOAT), keepdims=0)
        scale = b.op("Div", one, b.op("Max", count, one))
    loss, z = (b.op("Mul", b.op("ReduceSum", ce[k], keepdims=0), scale) for k in ("loss", "z"))
    dlogits = _like(b, _dlogits(b, ce, label_smoothing, z_loss, softcap, scale), hidden)
    dhidden = b.op("MatMul", dlogits, weight)
    dweight = b.op("MatMul", b.op("Transpose", dlogits, perm=[1, 0]), hidden)
    if bias is None:  # the op's empty stand-in
        dbias = _like(b, b.op("ConstantOfShape", b.const([0], _INT64), value=b.tensor([0.0], _FLOAT)), hidden)
    else:
        dbias = b.op("ReduceSum", dlogits, _axes(b, 0), keepdims=0)
    return loss, z, dhidden, dweight, dbias


def _logprobs(b, logits, target, ignore_index, softcap, asked):
    """(log_probs, lse, then the outputs of `asked` (names of FLAGS, in its order; the others
    empty)) float32 per token of fuselet's logprobs kernels (cross_entropy.h), 0 where target ==
    ignore_index, is_top1 1.0 / 0.0."""
    from fuselet.spec.fused_linear_logprobs import FLAGS

    ce = _cross_entropy(b, logits, target, ignore_index, 0.0, 0.0, softcap)
    s, lse, valid, zero = ce["s"], b.op("Unsqueeze", ce["lse_raw"], _axes(b, -1)), ce["valid"], b.const(0.0, _FLOAT)
    p = b.op("Exp", b.op("Sub", s, lse))
    stats = {
        "entropy": b.op("Sub", ce["lse_raw"], b.op("ReduceSum", b.op("Mul", p, s), _axes(b, -1), keepdims=0)),
        "log_sum_sq_probs": b.op("Log", b.op("ReduceSum", b.op("Mul", p, p), _axes(b, -1), keepdims=0)),
        "mean_logits": b.op("ReduceMean", s, _axes(b, -1), keepdims=0),
        "is_top1": b.op("Cast", b.op("Equal", b.op("ArgMax", s, axis=-1, keepdims=0), ce["target"]), to=_FLOAT),
    }
    empty = b.op("ConstantOfShape", b.const([0], _INT64), value=b.tensor([0.0], _FLOAT))
    rest = [b.op("Where", valid, stats[name], zero) if name in asked else empty for name in FLAGS]
    return b.op("Neg", ce["loss"]), ce["lse"], *rest


def logprobs_fwd(b, logits, target, ignore_index, softcap, with_entropy, with_stats):
    """The logprobs kernels' forward: (log_probs, lse, entropy, log_sum_sq_probs, mean_logits,
    is_top1) per row; with_entropy / with_stats false: those outputs empty."""
    asked = ({"entropy"} if with_entropy else set()) | ({"log_sum_sq_probs", "mean_logits", "is_top1"} if with_stats else set())
    return _logprobs(b, logits, target, ignore_index, softcap, asked)


def fused_linear_logprobs_fwd(b, hidden, weight, bias, target, ignore_index, softcap, outputs, chunk_size):
    """logprobs_fwd of the materialized logits, the outputs of the `outputs` flags."""
    from fuselet.spec.fused_linear_logprobs import names

    return _logprobs(b, _matmul_logits(b, hidden, weight, bias), target, ignore_index, softcap, names(outputs))


# The forward ops with a translation; their arguments come from the registered schemas.
_OPS = {
    fn.__name__: fn
    for fn in (
        rms_norm_fwd,
        add_rms_norm_fwd,
        gated_rms_norm_fwd,
        layer_norm_fwd,
        swiglu_fwd,
        geglu_fwd,
        clamped_swiglu_fwd,
        softmax_fwd,
        rope_fwd,
        cross_entropy_fwd,
        cross_entropy_fwd_bwd,
        divergence_fwd,
        fused_linear_cross_entropy_none,
        fused_linear_cross_entropy_reduced,
        logprobs_fwd,
        fused_linear_logprobs_fwd,
    )
}


# The other ops: exporting a model that calls one fails with the reason, not a lookup miss.
_BACKWARD = "a backward op: export runs the forward only (export the model for inference)"
_UNSUPPORTED = {
    **{
        f"{stem}_bwd": _BACKWARD
        for stem in (
            "rms_norm",
            "layer_norm",
            "add_rms_norm",
            "gated_rms_norm",
            "swiglu",
            "geglu",
            "clamped_swiglu",
            "softmax",
            "rope",
            "cross_entropy",
            "divergence",
        )
    },
    "cross_entropy_bwd_": _BACKWARD,
    "fused_linear_cross_entropy_none_bwd": _BACKWARD,
    "fused_linear_logprobs_bwd": _BACKWARD,
    "logprobs_bwd_": _BACKWARD,
    "divergence_logits_": "it writes the gradient into the student's logits (the training step of "
    "fused_linear_jsd's chunks): export the model for inference",
    "cross_entropy_fwd_bwd_": "it writes the gradient into the logits (cross_entropy.fwd_bwd(inplace=True), a "
    "training helper): call fuselet.torch.cross_entropy in the exported model",
}


def _unsupported(name):
    def fail(b, *args):
        raise NotImplementedError(f"fuselet::{name} has no ONNX translation: {_UNSUPPORTED[name]}")

    fail.__name__ = name
    return fail


def _overload(name):
    return getattr(ops, name).default


def _arguments(name):
    """[(name, python type of a scalar or None for a tensor, schema default, optional)] of fuselet::<name>
    (an int[]: Sequence[int])."""
    kinds = {"FloatType": float, "IntType": int, "BoolType": bool, "StringType": str}
    out = []
    for a in _overload(name)._schema.arguments:
        kind, optional = kinds.get(a.type.kind()), a.type.kind() == "OptionalType"
        if str(a.type) in ("List[int]", "Optional[List[int]]"):
            kind = Sequence[int]
        if kind is None and a.type.kind() != "TensorType" and str(a.type) != "Optional[Tensor]":
            raise TypeError(f"fuselet::{name}: argument {a.name} of type {a.type} has no ONNX translation")
        default = a.default_value if a.has_default_value() else inspect.Parameter.empty
        out.append((a.name, kind, default, optional))
    return out


# --- torch.onnx.export(dynamo=True): onnxscript ---------------------------------------


class _Script:
    """The builder over onnxscript's tracing: b.op("Mul", a, c) records a node of `opset`."""

    def __init__(self, opset_version):
        import onnx_ir as ir
        from onnxscript import values

        self.ir, self.opset = ir, opset_version
        self._ops = values.Opset("", opset_version)

    def op(self, name, *inputs, outputs=1, **attrs):
        result = getattr(self._ops, name)(*inputs, **attrs, **({"_outputs": outputs} if outputs > 1 else {}))
        return tuple(result) if outputs > 1 else result

    def elem_type(self, v):
        return None if v.dtype is None else int(v.dtype)

    def tensor(self, values, elem_type):
        return self.ir.tensor(values, dtype=self.ir.DataType(elem_type))

    def const(self, value, elem_type):
        import numpy as np

        dtype = np.float32 if elem_type == _FLOAT else np.int64
        return self._ops.Constant(value=self.ir.tensor(np.array(value, dtype=dtype)))


def _script_function(name, math_fn, opset_version):
    """math_fn as a python function of fuselet::<name>'s parameters: scalars annotated with their
    type (the exporter reads those as attributes), tensors unannotated (inputs)."""

    def fn(*args, **kwargs):
        return math_fn(_Script(opset_version), *sig.bind(*args, **kwargs).args)

    params, annotations = [], {}
    for arg, kind, default, _ in _arguments(name):
        params.append(
            inspect.Parameter(
                arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, **({} if kind is None else {"annotation": kind})
            )
        )
        if kind is not None:
            annotations[arg] = kind
    sig = inspect.Signature(params)
    fn.__signature__, fn.__annotations__ = sig, annotations
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = math_fn.__doc__
    return fn


def _check_opset(opset_version) -> None:
    if not isinstance(opset_version, int) or isinstance(opset_version, bool) or opset_version < 18:
        raise ValueError(f"opset_version: expected an int >= 18 (the ONNX opset the translations need), got {opset_version!r}")


def _table() -> dict:
    """{op name: math}, the ops without a translation included (they fail with their reason)."""
    return {name: _unsupported(name) for name in _UNSUPPORTED} | _OPS


def translations(opset_version: int | None = None) -> dict:
    """{torch op overload: onnxscript function} for torch.onnx.export(..., dynamo=True,
    custom_translation_table=...). opset_version: the one passed to export (None: torch's default)."""
    import onnxscript  # noqa: F401 - fails here, with its name, when onnxscript is missing

    if opset_version is None:
        from torch.onnx._constants import ONNX_DEFAULT_OPSET as opset_version
    _check_opset(opset_version)
    return {_overload(name): _script_function(name, fn, opset_version) for name, fn in _table().items()}


# --- torch.onnx.export(dynamo=False): TorchScript symbolics -----------------------------


class _Graph:
    """The builder over a TorchScript GraphContext: attributes get g.op's type suffixes."""

    _SUFFIX = {float: "f", int: "i", str: "s", bool: "i"}

    def __init__(self, g):
        self.g, self.opset = g, g.opset

    def op(self, name, *inputs, outputs=1, **attrs):
        named = {}
        for k, v in attrs.items():
            kind = "t" if isinstance(v, torch.Tensor) else self._SUFFIX[type(v[0]) if isinstance(v, list) else type(v)]
            named[f"{k}_{kind}"] = int(v) if isinstance(v, bool) else v
        return self.g.op(name, *inputs, outputs=outputs, **named)

    def elem_type(self, v):
        from torch.onnx import JitScalarType

        return int(JitScalarType.from_value(v).onnx_type())

    def tensor(self, values, elem_type):
        return torch.tensor(values, dtype=torch.float32 if elem_type == _FLOAT else torch.int64)

    def const(self, value, elem_type):
        return self.g.op("Constant", value_t=self.tensor(value, elem_type))


def _symbolic(name, math_fn):
    from torch.onnx import symbolic_helper

    arguments = _arguments(name)
    codes = {float: "f", int: "i", str: "s", bool: "b", Sequence[int]: "is"}

    def symbolic(g, *args):
        values = []
        for (_, kind, _, optional), v in zip(arguments, args):
            if kind is None:
                values.append(None if optional and symbolic_helper._is_none(v) else v)
            elif kind == Sequence[int]:
                value = None if symbolic_helper._is_none(v) else symbolic_helper._maybe_get_const(v, codes[kind])
                values.append(None if value is None else [int(e) for e in value])
            else:
                values.append(kind(symbolic_helper._maybe_get_const(v, codes[kind])))
        return math_fn(_Graph(g), *values)

    return symbolic


def register_torchscript(opset_version: int = 18) -> None:
    """Registers every forward op's symbolic for torch.onnx.export(..., dynamo=False) (the
    TorchScript exporter: deprecated in torch, opsets up to 20), from opset_version on."""
    _check_opset(opset_version)
    for name, fn in _table().items():
        torch.onnx.register_custom_op_symbolic(f"fuselet::{name}", _symbolic(name, fn), opset_version)
