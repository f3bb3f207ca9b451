"""The rotary embedding of `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`: the call's
signatures and the forms of ft.rope (half-split, interleaved, over a half-width table), the
probe that picks the form equal to the modeling file's function on the model's own tables, and
the two swaps: the attention instance's own kernel wrapper where transformers marks the class
for the `kernels` package, else a copy of the class's forward whose global names the fused
function. The complex form, apply_rotary_emb, is fuselet.torch.transformers.complex_rotary."""

from __future__ import annotations

import functools
import inspect
import sys

import torch

from fuselet.torch.rope import rope
from fuselet.torch.transformers.complex_rotary import _fuse_complex_rope
from fuselet.torch.transformers.probe import _close, _generator, _Left, _own_forward, _randn
from fuselet.torch.transformers.shadow import _with_global

_ROPE_SIGNATURES = {
    ("q", "k", "cos", "sin", "unsqueeze_dim"): "plain",
    ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"): "position_ids",
    ("x", "cos", "sin", "unsqueeze_dim"): "single",  # one tensor at a time (Gemma4's)
}


def _first_half(t):
    """A table whose first half holds one angle per interleaved pair (GLM's): that half, a pair
    table of ft.rope (pair_table=True), read without a full-width copy."""
    return t[..., : t.shape[-1] // 2]


# (name, interleaved, table transform, pair_table): the last two forms read one angle per pair,
# GLM's first half of its table and GPT-OSS's half-width table as it is
_ROPE_FORMS = (
    ("half-split", False, None, False),
    ("interleaved", True, None, False),
    ("interleaved, half table", True, _first_half, True),
    ("half-split, half-width table", False, None, True),
)


def _rope_layout(xs, cos, sin, unsqueeze_dim):
    """The rope layout of this call ("bhsd" / "bshd") and its [S, R] or [B, S, R] tables, or None."""
    layout = "bhsd" if unsqueeze_dim == 1 else "bshd" if unsqueeze_dim == 2 else None
    if layout is None or not all(isinstance(t, torch.Tensor) for t in (*xs, cos, sin)):
        return None
    if any(x.dim() != 4 for x in xs) or cos.dim() != 3 or cos.shape != sin.shape:
        return None
    if cos.shape[0] != xs[0].shape[0]:
        if cos.shape[0] != 1:
            return None
        cos, sin = cos[0], sin[0]  # [1, S, D] position tables shared by the batch: [S, D]
    return layout, cos, sin


def _rope_apply(xs, cos, sin, layout, form):
    _, interleaved, table, pair_table = form
    if table is not None:
        cos, sin = table(cos), table(sin)
    return tuple(rope(x, cos, sin, layout=layout, interleaved=interleaved, pair_table=pair_table) for x in xs)


def _fused_rotary(original, form, kind="plain"):
    """apply_rotary_pos_emb through ft.rope in `form`, `original` for calls it does not take."""

    def fused(xs, cos, sin, unsqueeze_dim):
        found = _rope_layout(xs, cos, sin, unsqueeze_dim)
        if found is None:
            return original(*xs, cos, sin, unsqueeze_dim=unsqueeze_dim)
        layout, cos2, sin2 = found
        out = _rope_apply(xs, cos2, sin2, layout, form)
        return out[0] if len(out) == 1 else out

    if kind == "single":

        def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
            return fused((x,), cos, sin, unsqueeze_dim)

    elif kind == "position_ids":

        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            if position_ids is not None:
                return original(q, k, cos, sin, position_ids, unsqueeze_dim)
            return fused((q, k), cos, sin, unsqueeze_dim)

    else:

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            return fused((q, k), cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb


def _rotary_tables(model, size, like):
    """[1, S, R] cos / sin tables: the model's own rotary embedding's (the first that answers
    (x, position_ids)), else transformers' usual half-split table of random angles."""
    positions = torch.arange(5, device=like.device)[None]
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            try:
                with torch.no_grad():
                    cos, sin = module(torch.zeros(1, 5, 1, device=like.device), positions)
            except Exception:
                continue
            if isinstance(cos, torch.Tensor) and cos.dim() == 3 and cos.shape[-1] <= size:
                return cos.float(), sin.float()
    angles = torch.rand(1, 5, size // 2, generator=_generator()).to(like.device) * 6
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


@functools.cache
def _rotary_form(plain, tables_key):
    """The form of ft.rope equal to `plain` (an apply_rotary_pos_emb) on the probe, or a reason."""
    return _rotary_form_on(plain, *_TABLES[tables_key])


def _rotary_form_on(plain, cos, sin, size):
    """(form, kind): the form of ft.rope equal to `plain` on x [.., size] with these [1, S, R]
    tables, and the call's kind; (None, reason) where none is."""
    kind = _ROPE_SIGNATURES.get(tuple(inspect.signature(plain).parameters))
    if kind is None:
        return None, f"apply_rotary_pos_emb{inspect.signature(plain)}: not the call fuselet serves"
    gen = _generator()
    for form in _ROPE_FORMS:
        ok = True
        for unsqueeze_dim, shape in ((1, (2, 3, 5, size)), (2, (2, 5, 3, size))):
            xs = tuple(_randn(*shape, like=cos, gen=gen) for _ in range(1 if kind == "single" else 2))
            try:
                with torch.no_grad():
                    want = plain(*xs, cos, sin, unsqueeze_dim=unsqueeze_dim)
                    layout, c, s = _rope_layout(xs, cos, sin, unsqueeze_dim)
                    got = _rope_apply(xs, c, s, layout, form)
            except Exception:
                ok = False
                break
            want = (want,) if kind == "single" else want
            ok = ok and all(_close(g, w, torch.float32) for g, w in zip(got, want))
        if ok:
            return form, kind
    return None, "no ft.rope layout (half-split, interleaved) equals its apply_rotary_pos_emb on the model's tables"


_TABLES: dict = {}


def _wrapped_function(cls):
    """The function a kernel-marked transformers `Func` class (apply_rotary_pos_emb's) wraps, or None."""
    plain = inspect.getclosurevars(cls.forward).nonlocals.get("func")
    return plain if inspect.isfunction(plain) else None


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
    plain = _wrapped_function(type(wrapper))
    return None if plain is None else (wrapper, plain)


def _calls_rotary(cls) -> bool:
    code = inspect.unwrap(cls.forward).__code__
    return "apply_rotary_pos_emb" in code.co_names or "apply_rotary_emb" in code.co_names


@functools.cache
def _rope_forward(cls, form, kind):
    """cls.forward with apply_rotary_pos_emb through ft.rope (one copy per attention class and form)."""
    fn = cls.forward
    base = inspect.unwrap(fn)
    tag = f"{cls.__name__}_{form[0].replace(',', '').replace(' ', '_')}"
    return _with_global(fn, "apply_rotary_pos_emb", _fused_rotary(base.__globals__["apply_rotary_pos_emb"], form, kind), tag)


def _fuse_rope(module, tables_key) -> str:
    forward = inspect.unwrap(type(module).forward)
    if "apply_rotary_emb" in forward.__code__.co_names and "apply_rotary_pos_emb" not in forward.__code__.co_names:
        return _fuse_complex_rope(module, forward.__globals__.get("apply_rotary_emb"))
    kernelized = _kernelized_rotary(module)
    if kernelized is not None:
        wrapper, plain = kernelized
    else:
        plain = inspect.unwrap(type(module).forward).__globals__.get("apply_rotary_pos_emb")
        plain = _wrapped_function(type(plain)) if isinstance(plain, torch.nn.Module) else plain
    if not inspect.isfunction(plain):
        raise _Left("its apply_rotary_pos_emb is not a function fuselet can probe")
    form, kind = _rotary_form(plain, tables_key)
    if form is None:
        raise _Left(kind)
    if kernelized is not None:
        fused = _fused_rotary(plain, form, kind)
        done = _own_forward(wrapper, lambda self, *args, **kwargs: fused(*args, **kwargs))
    else:
        done = _own_forward(module, _rope_forward(type(module), form, kind))
    if not done:
        raise _Left("it already has a forward of its own (hooked, or fused)")
    return f"ft.rope({form[0]})"
