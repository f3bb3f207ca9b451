"""The rotary embedding by complex frequencies, `apply_rotary_emb(xq, xk, freqs_cis)` (Llama4,
DeepSeek-V2): the probe that finds the x layout in which ft.rope(interleaved=True) equals it,
the fused function (fuselet's op, or the original for a call it does not take), and the swap
that gives an attention instance a copy of its class's forward calling it."""

from __future__ import annotations

import functools
import inspect

import torch

from fuselet.torch.rope import rope
from fuselet.torch.transformers.probe import _close, _generator, _Left, _own_forward, _probe_device, _randn
from fuselet.torch.transformers.shadow import _with_global

# --- rotary embedding by complex frequencies: apply_rotary_emb(xq, xk, freqs_cis) (Llama4,
# DeepSeek-V2): x * freqs_cis over x's interleaved pairs viewed as complex numbers, which is
# ft.rope(interleaved=True, pair_table=True) with cos / sin the real / imaginary parts: one angle
# per pair, no repeated copy.


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
        cos, sin = freqs.real.contiguous(), freqs.imag.contiguous()  # [B, S, D/2]: .real has stride 2
        if cos.shape[0] != xq.shape[0]:
            cos, sin = cos[0], sin[0]  # [1, S, D/2] tables shared by the batch: [S, D/2]
        return tuple(rope(x, cos, sin, layout=layout, interleaved=True, pair_table=True) for x in (xq, xk))

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
