"""Copies of a modeling file's function that read one global as another value: the shadow
module (a real, importable copy of the file's namespace, one per tag, as torch.compile needs)
and the copy of the function, through the decorators wrapped around it. The rotary swaps give
an attention instance such a copy of its class's forward."""

from __future__ import annotations

import sys
import types


def _shadow_module(globals_: dict, name: str, value, tag: str) -> dict:
    """The namespace of a module registered in sys.modules: a copy of globals_ (a modeling
    file's) with `name` bound to `value`. A real, importable module, because torch.compile
    reaches the globals of an inlined function by importing its module's __name__."""
    module_name = f"fuselet.torch._shadow.{globals_['__name__']}.{tag}"
    module = sys.modules.get(module_name)
    if module is None:
        module = types.ModuleType(module_name)
        module.__dict__.update({k: v for k, v in globals_.items() if k not in ("__name__", "__spec__", "__loader__")})
        sys.modules[module_name] = module
    module.__dict__[name] = value
    return module.__dict__


def _with_global(fn, name, value, tag):
    """A copy of fn, and of the decorators wrapped around it (followed through __wrapped__ and
    their closures), whose innermost function reads the global `name` as `value` (from a shadow
    module of fn's, one per tag)."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        namespace = _shadow_module(fn.__globals__, name, value, tag)
        closure = fn.__closure__
    else:
        new_inner = _with_global(inner, name, value, tag)
        cells = fn.__closure__ or ()
        if not any(c.cell_contents is inner for c in cells):
            raise RuntimeError(f"{fn.__qualname__}: cannot follow its decorator to the function it wraps")
        closure = tuple(types.CellType(new_inner) if c.cell_contents is inner else c for c in cells)
        namespace = fn.__globals__
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    if inner is not None:
        copy.__wrapped__ = new_inner
    copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return copy
