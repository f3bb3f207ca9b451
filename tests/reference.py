"""The one float64 numpy reference of fuselet's kernels, and the one tolerance table.

Both the torch and the jax tests compare against these functions. Feed them the values
the kernel actually received: the low-precision inputs, cast to float64 after rounding
(see `to_float64`). Math: csrc/core/include/fuselet/norm.h.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

DTYPE_NAMES = ("float32", "float16", "bfloat16")
NUMPY_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# (rtol, atol) per dtype name.
#   "out":    elementwise outputs (y, dx) and float32 statistics: float32 math, one rounding
#             to the dtype at the end: within half an ulp of the dtype (2^-11 float16,
#             2^-8 bfloat16 relative) plus float32 error; the table allows about one ulp.
#   "reduce": sums over rows (dweight, dbias); atol is per sqrt(row), see `tolerance`.
TOLERANCES = {
    "float32": {"out": (1e-5, 1e-5), "reduce": (1e-5, 1e-5)},
    "float16": {"out": (1e-3, 1e-3), "reduce": (1e-3, 1e-3)},
    "bfloat16": {"out": (8e-3, 8e-3), "reduce": (8e-3, 8e-3)},
}


def tolerance(dtype: str, kind: str, rows: int = 1) -> tuple[float, float]:
    """(rtol, atol) for `kind` ("out" or "reduce") of `dtype`; "reduce" atol grows as sqrt(rows)."""
    rtol, atol = TOLERANCES[dtype][kind]
    if kind == "reduce":
        atol *= max(1.0, float(rows)) ** 0.5
    return rtol, atol


def assert_close(actual, expected, dtype: str, kind: str = "out", rows: int = 1, name: str = "") -> None:
    """actual: the kernel's result as a float64 array; expected: the reference's."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != reference {expected.shape}"
    rtol, atol = tolerance(dtype, kind, rows)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=f"{name} ({dtype}, {kind}, rows={rows})")


def to_float64(a) -> np.ndarray:
    """A numpy-convertible array of any float dtype (bfloat16 included) as float64."""
    return np.asarray(a).astype(np.float64)


def make_inputs(shape, dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Random x [..., H], weight [H], bias [H], dy [..., H], already rounded to `dtype`."""
    rng = np.random.default_rng(seed)
    hidden = shape[-1]
    values = {
        "x": rng.standard_normal(shape) * 2.0 + 0.5,
        "weight": 1.0 + 0.5 * rng.standard_normal(hidden),
        "bias": 0.5 * rng.standard_normal(hidden),
        "dy": rng.standard_normal(shape),
    }
    return {k: v.astype(NUMPY_DTYPES[dtype]) for k, v in values.items()}


def rows_of(shape) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64))


def _eps(eps: float) -> float:
    return float(np.float32(eps))  # the kernels take eps as a float32


def _scale(weight, shape, zero_centered=False):
    """The factor the math applies: weight, 1 + weight (zero-centered), or 1 (no weight)."""
    if weight is None:
        return np.ones(shape[-1])
    return to_float64(weight) + (1.0 if zero_centered else 0.0)


def _shift(bias, shape):
    return np.zeros(shape[-1]) if bias is None else to_float64(bias)


def rms_norm_fwd(x, weight, eps, zero_centered=False):
    """-> y [..., H], rstd [...] (x.shape[:-1]). weight may be None (scale 1)."""
    x = to_float64(x)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + _eps(eps))
    return x * rstd[..., None] * _scale(weight, x.shape, zero_centered), rstd


def rms_norm_bwd(dy, x, weight, eps, zero_centered=False):
    """-> dx [..., H], dweight [H] (None without weight)."""
    dy, x = to_float64(dy), to_float64(x)
    _, rstd = rms_norm_fwd(x, weight, eps)
    xhat = x * rstd[..., None]
    g = dy * _scale(weight, x.shape, zero_centered)
    dx = rstd[..., None] * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    dweight = None if weight is None else (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx, dweight


def layer_norm_fwd(x, weight, bias, eps, zero_centered=False):
    """-> y [..., H], mean [...], rstd [...]. weight / bias may be None (scale 1 / shift 0)."""
    x = to_float64(x)
    mean = np.mean(x, axis=-1)
    centered = x - mean[..., None]
    rstd = 1.0 / np.sqrt(np.mean(centered * centered, axis=-1) + _eps(eps))
    return centered * rstd[..., None] * _scale(weight, x.shape, zero_centered) + _shift(bias, x.shape), mean, rstd


def layer_norm_bwd(dy, x, weight, eps, zero_centered=False, bias=True):
    """-> dx [..., H], dweight [H], dbias [H] (None for an absent weight, or bias=False)."""
    dy, x = to_float64(dy), to_float64(x)
    _, mean, rstd = layer_norm_fwd(x, None, None, eps)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * _scale(weight, x.shape, zero_centered)
    dx = rstd[..., None] * (g - np.mean(g, axis=-1, keepdims=True) - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    flat = (-1, x.shape[-1])
    dweight = None if weight is None else (dy * xhat).reshape(flat).sum(axis=0)
    return dx, dweight, dy.reshape(flat).sum(axis=0) if bias else None


def add_rms_norm_fwd(x, residual, weight, eps, dtype: str, zero_centered=False):
    """-> y, residual_out (x + residual rounded to `dtype`, as float64), rstd."""
    h = to_float64((to_float64(x) + to_float64(residual)).astype(NUMPY_DTYPES[dtype]))
    y, rstd = rms_norm_fwd(h, weight, eps, zero_centered)
    return y, h, rstd


def add_rms_norm_bwd(dy, dresidual_out, residual_out, weight, eps, zero_centered=False):
    """-> dx (= dresidual), dweight: RMSNorm's backward at residual_out plus d(residual_out)."""
    dx, dweight = rms_norm_bwd(dy, residual_out, weight, eps, zero_centered)
    return dx + to_float64(dresidual_out), dweight


def _groups(a, group_size):
    """[..., H] -> [..., G, S] (group_size None or 0: one group)."""
    size = group_size or a.shape[-1]
    return a.reshape(*a.shape[:-1], a.shape[-1] // size, size)


def gated_rms_norm_fwd(x, z, weight, eps, group_size=None, norm_before_gate=True, zero_centered=False):
    """-> y [..., H], rstd [..., G]: rms_norm per group of x (or of x * silu(z)) times silu(z)."""
    x, z = to_float64(x), to_float64(z)
    gate = z / (1.0 + np.exp(-z))
    h = _groups(x if norm_before_gate else x * gate, group_size)
    rstd = 1.0 / np.sqrt(np.mean(h * h, axis=-1) + _eps(eps))
    y = (h * rstd[..., None]).reshape(x.shape) * _scale(weight, x.shape, zero_centered)
    return (y * gate if norm_before_gate else y), rstd


def gated_rms_norm_bwd(dy, x, z, weight, eps, group_size=None, norm_before_gate=True, zero_centered=False):
    """-> dx, dz [..., H], dweight [H] (None without weight)."""
    dy, x, z = to_float64(dy), to_float64(x), to_float64(z)
    sig = 1.0 / (1.0 + np.exp(-z))
    gate, dgate = z * sig, sig * (1.0 + z * (1.0 - sig))
    h = x if norm_before_gate else x * gate
    _, rstd = gated_rms_norm_fwd(x, z, None, eps, group_size, norm_before_gate)
    scale = _scale(weight, x.shape, zero_centered)
    xhat = (_groups(h, group_size) * rstd[..., None]).reshape(x.shape)
    gy = dy * gate if norm_before_gate else dy
    g = _groups(gy * scale, group_size)
    xg = _groups(xhat, group_size)
    dh = (rstd[..., None] * (g - xg * np.mean(g * xg, axis=-1, keepdims=True))).reshape(x.shape)
    dweight = None if weight is None else (gy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    if norm_before_gate:
        return dh, dy * xhat * scale * dgate, dweight
    return dh * gate, dh * x * dgate, dweight


_ERF = np.vectorize(math.erf, otypes=[np.float64])
GLU_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _activation(g, kind: str):
    """-> act(g), act'(g) in float64."""
    if kind == "silu":
        s = 1.0 / (1.0 + np.exp(-g))
        return g * s, s * (1.0 + g * (1.0 - s))
    if kind == "gelu":
        cdf = 0.5 * (1.0 + _ERF(g / math.sqrt(2.0)))
        return g * cdf, cdf + g * np.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)
    k, c = math.sqrt(2.0 / math.pi), 0.044715
    t = np.tanh(k * (g + c * g**3))
    return 0.5 * g * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * c * g * g)


def _gate_up(x, interleaved: bool):
    half = x.shape[-1] // 2
    return (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])


def glu_fwd(x, kind: str, alpha=1.702, limit=7.0, interleaved=False):
    """y [..., F] = act(gate) * up of x [..., 2F] = [gate, up] (or interleaved pairs); kind in
    GLU_ACTIVATIONS, or "silu_clamped": GPT-OSS's min(g, limit) * sigmoid(alpha g) * (clamp(u) + 1)."""
    g, u = _gate_up(to_float64(x), interleaved)
    if kind == "silu_clamped":
        alpha, limit = float(np.float32(alpha)), float(np.float32(limit))  # the kernels' float32 options
        gc, uc = np.minimum(g, limit), np.clip(u, -limit, limit)
        return gc / (1.0 + np.exp(-alpha * gc)) * (uc + 1.0)
    return _activation(g, kind)[0] * u


def glu_bwd(dy, x, kind: str, alpha=1.702, limit=7.0, interleaved=False):
    """-> dx [..., 2F] = [dy * up * act'(gate), dy * act(gate)] (laid out like x); the clamped
    SwiGLU passes no gradient beyond its clamps (torch.clamp's rule: the bounds pass it)."""
    dy = to_float64(dy)
    g, u = _gate_up(to_float64(x), interleaved)
    if kind == "silu_clamped":
        alpha, limit = float(np.float32(alpha)), float(np.float32(limit))
        gc, uc = np.minimum(g, limit), np.clip(u, -limit, limit)
        s = 1.0 / (1.0 + np.exp(-alpha * gc))
        dg = np.where(g <= limit, dy * (uc + 1.0) * s * (1.0 + alpha * gc * (1.0 - s)), 0.0)
        du = np.where((u >= -limit) & (u <= limit), dy * gc * s, 0.0)
    else:
        a, da = _activation(g, kind)
        dg, du = dy * u * da, dy * a
    if interleaved:
        return np.stack([dg, du], axis=-1).reshape(*dg.shape[:-1], 2 * dg.shape[-1])
    return np.concatenate([dg, du], axis=-1)


def causal_mask(q: int, k: int) -> np.ndarray:
    """[Q, K] bool, True where key j is visible to query i: j <= i + (K - Q) (bottom-right)."""
    return np.arange(k)[None, :] <= np.arange(q)[:, None] + (k - q)


def softmax_fwd(x, scale=1.0, causal=False):
    """y = softmax(scale * x) over the last dim; masked keys and fully masked rows are 0."""
    s = float(np.float32(scale)) * to_float64(x)  # the kernels take scale as a float32
    visible = causal_mask(*s.shape[-2:]) if causal else np.ones(s.shape[-1:], bool)
    visible = np.broadcast_to(visible, s.shape)
    s = np.where(visible, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax_bwd(dy, y, scale=1.0):
    """dx = scale * y * (dy - sum(dy * y)), from the forward's output y."""
    dy, y = to_float64(dy), to_float64(y)
    return float(np.float32(scale)) * y * (dy - np.sum(dy * y, axis=-1, keepdims=True))


def _rope_tables(cos, sin, x_ndim: int, bhsd: bool):
    """cos / sin [S, R] or [B, S, R] as float64, broadcastable against x's rotated part."""
    cos, sin = to_float64(cos), to_float64(sin)
    if bhsd:  # x [..., N, S, D]: the tables broadcast over N
        cos, sin = cos[..., None, :, :], sin[..., None, :, :]
    else:  # x [..., S, N, D]
        cos, sin = cos[..., :, None, :], sin[..., :, None, :]
    return cos, sin


def _rope_partner(x, interleaved: bool):
    """(x_p(i), e_i) over the rotated features (fuselet/rope.h): rot(x)_i = e_i * x_p(i)."""
    r = x.shape[-1]
    if interleaved:
        partner = np.arange(r) ^ 1
        sign = np.where(np.arange(r) % 2 == 0, -1.0, 1.0)
    else:
        partner = (np.arange(r) + r // 2) % r
        sign = np.where(np.arange(r) < r // 2, -1.0, 1.0)
    return x[..., partner], sign, partner


def rope_section_of(j: int, sections, interleaved_sections: bool) -> int:
    """The table pair j reads (fuselet/rope.h k(j)), written out here apart from fuselet.spec:
    contiguous, the k with s_0 + ... + s_{k-1} <= j < s_0 + ... + s_k; interleaved, with K
    tables and m = j mod K, m where m != 0 and j < K s_m, else 0."""
    k = len(sections)
    if interleaved_sections:
        m = j % k
        return m if m != 0 and j < k * sections[m] else 0
    bounds = np.cumsum(sections)
    return int(np.searchsorted(bounds, j, side="right"))


def rope_full_tables(cos, sin, interleaved=False, pair_table=False, sections=None, interleaved_sections=False):
    """The full-width float64 tables [S, R] or [B, S, R] that a pair table ([..., R/2]) and / or K
    section tables ([K, ...]) stand for: feature i reads its pair's column (pair_table) of its
    pair's table (sections)."""
    cos, sin = to_float64(cos), to_float64(sin)
    width = cos.shape[-1]
    r = 2 * width if pair_table else width
    h = r // 2
    pair = np.arange(r) // 2 if interleaved else np.arange(r) % h
    column = pair if pair_table else np.arange(r)
    if sections is None:
        return cos[..., column], sin[..., column]
    table = np.array([rope_section_of(int(j), sections, interleaved_sections) for j in pair])
    return cos[table, ..., column].transpose(*range(1, cos.ndim - 1), 0), sin[table, ..., column].transpose(
        *range(1, sin.ndim - 1), 0
    )


def rope_fwd(x, cos, sin, bhsd=False, interleaved=False):
    """y_i = x_i cos_i + e_i x_p(i) sin_i for i < R; x_i beyond."""
    x = to_float64(x)
    c, s = _rope_tables(cos, sin, x.ndim, bhsd)
    r = c.shape[-1]
    xp, sign, _ = _rope_partner(x[..., :r], interleaved)
    return np.concatenate([x[..., :r] * c + sign * xp * s, x[..., r:]], axis=-1)


def rope_bwd(dy, cos, sin, bhsd=False, interleaved=False):
    """dx_i = dy_i cos_i - e_i dy_p(i) sin_p(i) for i < R; dy_i beyond (the transposed rotation)."""
    dy = to_float64(dy)
    c, s = _rope_tables(cos, sin, dy.ndim, bhsd)
    r = c.shape[-1]
    dyp, sign, partner = _rope_partner(dy[..., :r], interleaved)
    return np.concatenate([dy[..., :r] * c - sign * dyp * s[..., partner], dy[..., r:]], axis=-1)


# Parameter configurations beyond "weight and bias in x's dtype": name -> (parameter dtype
# ("x" or "float32"), has weight, has bias (LayerNorm), zero-centered gamma).
VARIANTS = {
    "float32_params": ("float32", True, True, False),
    "no_bias": ("x", True, False, False),
    "no_affine": ("x", False, False, False),
    "bias_only": ("float32", False, True, False),
    "zero_centered": ("x", True, True, True),
    "zero_centered_float32_params": ("float32", True, False, True),
}


def variant_inputs(shape, dtype: str, variant: str, seed: int = 0) -> dict:
    """make_inputs for `variant`: weight / bias None when absent, float32 when it says so."""
    pdtype, has_w, has_b, _ = VARIANTS[variant]
    a = make_inputs(shape, dtype, seed)
    p32 = make_inputs(shape, "float32", seed)  # same values, not rounded to `dtype`
    for name, present in (("weight", has_w), ("bias", has_b)):
        a[name] = (p32[name] if pdtype == "float32" else a[name]) if present else None
    return a


def _ce_prepare(logits, target, ignore_index, softcap):
    """(s, valid, target with ignored -> 0, c): the soft-capped logits in float64."""
    x, t = to_float64(logits), np.asarray(target).astype(np.int64)
    c = None if softcap is None else float(np.float32(softcap))  # the kernels take it as a float32
    s = x if c is None else c * np.tanh(x / c)
    valid = t != ignore_index
    return s, valid, np.where(valid, t, 0), c


def _logsumexp(s):
    m = np.max(s, axis=-1, keepdims=True)
    return (m + np.log(np.sum(np.exp(s - m), axis=-1, keepdims=True)))[..., 0]


def cross_entropy_fwd(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None):
    """-> (loss, z, lse) per token [...] (target's shape), 0 where target == ignore_index.

    s = softcap * tanh(logits / softcap) (or logits), lse = logsumexp(s),
    loss = (1 - ls) (lse - s_t) + ls (lse - mean(s)) + z, z = z_loss lse^2."""
    s, valid, t, _ = _ce_prepare(logits, target, ignore_index, softcap)
    ls, zl = float(np.float32(label_smoothing)), float(np.float32(z_loss))
    lse = _logsumexp(s)
    st = np.take_along_axis(s, t[..., None], axis=-1)[..., 0]
    z = zl * lse**2
    loss = (1 - ls) * (lse - st) + ls * (lse - np.mean(s, axis=-1)) + z
    return tuple(np.where(valid, v, 0.0) for v in (loss, z, lse))


def cross_entropy_bwd(dloss, logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None):
    """-> dlogits: dloss * (p (1 + 2 z_loss lse) - (1 - ls) onehot(t) - ls / V), times
    1 - (s / softcap)^2 with a softcap; 0 rows where ignored."""
    s, valid, t, c = _ce_prepare(logits, target, ignore_index, softcap)
    ls, zl = float(np.float32(label_smoothing)), float(np.float32(z_loss))
    lse = _logsumexp(s)[..., None]
    onehot = np.arange(s.shape[-1]) == t[..., None]
    ds = to_float64(dloss)[..., None] * (np.exp(s - lse) * (1 + 2 * zl * lse) - (1 - ls) * onehot - ls / s.shape[-1])
    if c is not None:
        ds = ds * (1 - (s / c) ** 2)
    return np.where(valid[..., None], ds, 0.0)


def logprobs_fwd(logits, target, ignore_index=-100, softcap=None) -> dict:
    """The log-probabilities of fuselet/cross_entropy.h (fuselet_logprobs_*) per token, 0 where
    target == ignore_index: log_probs = s_t - lse, lse, entropy = lse - sum p s, log_sum_sq_probs =
    log sum p^2, mean_logits = mean s, is_top1 = (argmax s == t, ties to the lowest index)."""
    s, valid, t, _ = _ce_prepare(logits, target, ignore_index, softcap)
    lse = _logsumexp(s)
    p = np.exp(s - lse[..., None])
    out = {
        "log_probs": np.take_along_axis(s, t[..., None], axis=-1)[..., 0] - lse,
        "lse": lse,
        "entropy": lse - np.sum(p * s, axis=-1),
        "log_sum_sq_probs": np.log(np.sum(p * p, axis=-1)),
        "mean_logits": np.mean(s, axis=-1),
        "is_top1": (np.argmax(s, axis=-1) == t).astype(np.float64),
    }
    return {k: np.where(valid, v, 0.0) for k, v in out.items()}


def logprobs_bwd(dlogp, dentropy, logits, target, ignore_index=-100, softcap=None):
    """-> dlogits of sum(dlogp log_probs + dentropy entropy): dlogp (onehot(t) - p) - dentropy p
    ((s - lse) + entropy), times 1 - (s / softcap)^2 with a softcap; 0 rows where ignored. dlogp,
    dentropy: None for 0."""
    s, valid, t, c = _ce_prepare(logits, target, ignore_index, softcap)
    lse = _logsumexp(s)[..., None]
    p = np.exp(s - lse)
    entropy = lse - np.sum(p * s, axis=-1, keepdims=True)
    g = 0.0 if dlogp is None else to_float64(dlogp)[..., None]
    h = 0.0 if dentropy is None else to_float64(dentropy)[..., None]
    onehot = np.arange(s.shape[-1]) == t[..., None]
    ds = g * (onehot - p) - h * p * ((s - lse) + entropy)
    if c is not None:
        ds = ds * (1 - (s / c) ** 2)
    return np.where(valid[..., None], ds, 0.0)


def log_softmax(a) -> np.ndarray:
    """log_softmax over the last dim, float64."""
    a = to_float64(a)
    return a - _logsumexp(a)[..., None]


def _divergence_terms(kind: str, x, t, log_target=True, beta=0.0):
    """(terms, dx, dt) per element of fuselet/divergence.h, float64: x = log Q; t = log P (or P).
    Weight-0 terms are 0 (0 log 0 = 0)."""
    x, t = to_float64(x), to_float64(t)
    beta = float(np.float32(beta))  # the kernels take it as a float32
    q = np.exp(x)
    p = np.exp(t) if log_target else t
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = t if log_target else np.log(t)
        if kind == "tvd":
            s = 0.5 * np.sign(p - q)
            return 0.5 * np.abs(p - q), -s * q, s * p
        if kind == "kl_div" or beta == 0.0:
            terms = np.where(p > 0, p * (lp - x), 0.0)
            dt = np.where(p > 0, p * (lp - x + 1) if log_target else lp + 1 - x, 0.0)
            return terms, -p, dt
        if beta == 1.0:
            return np.where(q > 0, q * (x - lp), 0.0), np.where(q > 0, q * (x - lp + 1), 0.0), -q
        lm = np.log(beta * p + (1 - beta) * q)
        terms = np.where(p > 0, beta * p * (lp - lm), 0.0) + np.where(q > 0, (1 - beta) * q * (x - lm), 0.0)
        return terms, np.where(q > 0, (1 - beta) * q * (x - lm), 0.0), np.where(p > 0, beta * p * (lp - lm), 0.0)


def divergence_fwd(kind: str, x, t, log_target=True, beta=0.0):
    """-> the float64 loss per row [...] ("kl_div", "jsd", "tvd")."""
    return np.sum(_divergence_terms(kind, x, t, log_target, beta)[0], axis=-1)


def divergence_bwd(kind: str, dloss, x, t, log_target=True, beta=0.0):
    """-> (dx, dt): dloss per row times each element's derivatives."""
    _, dx, dt = _divergence_terms(kind, x, t, log_target, beta)
    g = to_float64(dloss)[..., None]
    return g * dx, g * dt


def fused_linear_logprobs(
    h, w, b, t, g_logp=None, g_entropy=None, temperature=1.0, logit_scale=1.0, softcap=None, ignore_index=-100
):
    """float64 outputs {"log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1"} [N] of
    the logits s = softcap(logit_scale (h @ w.T + b)) / temperature of h [N, H], w [V, H], b [V] or
    None, t [N] (0 where ignored), and (dh, dw, db) of sum(g_logp log_probs + g_entropy entropy)."""
    x = (h @ w.T + (0.0 if b is None else b)) * logit_scale
    th = np.tanh(x / softcap) if softcap else None
    s = (softcap * th if softcap else x) / temperature
    valid = t != ignore_index
    tt = np.where(valid, t, 0)
    m = s.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[:, 0]
    logp_all = s - lse[:, None]
    p = np.exp(logp_all)
    rows = np.arange(len(t))
    out = {
        "log_probs": logp_all[rows, tt],
        "entropy": -(p * logp_all).sum(-1),
        "log_sum_sq_probs": np.log((p * p).sum(-1)),
        "mean_logits": s.mean(-1),
        "is_top1": (s.argmax(-1) == tt).astype(np.float64),
    }
    out = {k: np.where(valid, v, 0.0) for k, v in out.items()}
    g_logp = np.zeros(len(t)) if g_logp is None else g_logp
    g_entropy = np.zeros(len(t)) if g_entropy is None else g_entropy
    onehot = np.zeros_like(s)
    onehot[rows, tt] = 1.0
    ds = g_logp[:, None] * (onehot - p) - g_entropy[:, None] * p * (logp_all + out["entropy"][:, None])
    ds *= valid[:, None]
    dx = ds * ((1 - th * th) if softcap else 1.0) / temperature * logit_scale
    return out, (dx @ w, dx.T @ h, None if b is None else dx.sum(0))
