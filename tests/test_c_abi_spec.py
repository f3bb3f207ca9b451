"""Every rule of the op specs refuses alike in the C ABI.

tests/test_spec.py gives each refusal of the spec tables (python/fuselet/spec/<op>.py: REFUSALS
and OP_REFUSALS) to both layers' public functions and to the raw torch ops. Here each is also
given to libfuselet's `_check` functions of its op (fuselet/<op>.h; fuselet.h says what they
promise), through ctypes, as a C caller would: a fuselet_tensor view of each array (NULL data,
contiguous strides, the fuselet_dtype code of its dtype) and the options as the layers pass them
(the spec's options object and its op_args(), made into the C function's codes, flags and option
structs as csrc/torch/<op>.cpp does). C_OPS says which `_check` functions each raw op calls, with
their parameters in order; PUBLIC says which raw op serves each public op. The C ABI must refuse
as Python does:

- the same kind: FUSELET_ERR_INVALID_ARGUMENT, its message "<arg>: expected dtype ..." where Python
  raises TypeError and without those words where it raises ValueError (csrc/torch/checks.h
  check_args raises them so);
- the same argument, named first;
- the same words: the C message starts with the refusal's message, or with its `raw` words where
  it has them (the raw op's own rule: a view read as rows of elements, where the public function
  speaks of shapes; the core states the raw op's rule). Where the C ABI has other terms for the
  same thing, the words may differ there and only there, as `_expected` writes them:
  - a shape: Python writes a tuple, (2, 4) or (4,), the C ABI [2, 4] or [4];
  - a dtype the C ABI has no code for (float64) is given as an unknown code (UNKNOWN_DTYPE), and
    the C message says "got code 99" where Python names the dtype;
  - C_TERMS: an option the C ABI takes as a bit of its flags is refused as the flags argument
    naming the bit ("flags: FUSELET_SOFTMAX_CAUSAL needs x of shape ..." for "causal: needs x of
    shape ..."); enum constants, 1 and 0 for True and False, NULL for None.

A refusal that cannot reach the C ABI is skipped by one of these rules (`_unreachable`), each
checked against the refusal, so that none passes silently:

- composed: an op of a COMPOSED spec, composed in Python over other ops' kernels (the fused
  linear losses), has no `_check` of its own (test_every_op_is_mapped_or_composed); the rules it
  shares with those ops reach the C ABI through their refusals;
- no C parameter: the argument is neither a tensor of the C functions nor an option they take
  (reduction, labels, inplace_backward, ...: the layers apply them around the kernels);
- a Python type: a TypeError about the Python type of a value not an array ("expected a bool,
  got str"), which the C ABI's typed parameters cannot be given;
- a name: a str outside the choices of an option the C ABI takes as a code (approximate,
  layout), which the layers map to a code only from a known name;
- beyond the C type: a float that float32 (the C ABI's float) turns into inf or 0, or an int
  beyond int64; the values the C ABI can be given (inf, NaN, 0) have refusals of their own.

A refusal whose `raw` is False (the raw op takes the value, with another meaning: softcap 0.0 is
"no softcap" there) is given to the C ABI too, which must take it as the raw op does.
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import inspect
import math
import pkgutil
import re
from pathlib import Path

import pytest
from fuselet.spec import _rules, cross_entropy, divergence, glu, norm, rope, softmax
from fuselet.spec._rules import Array

from tests.conftest import import_layer
from tests.test_c_abi import Tensor

ROOT = Path(__file__).resolve().parents[1]
HEADERS = sorted((ROOT / "csrc/core/include/fuselet").glob("*.h"))
# The enum constants of the headers (FUSELET_FLOAT32 = 0, FUSELET_NORM_ZERO_CENTERED_GAMMA = 1, ...).
CODES = {
    name: int(value) for h in HEADERS for name, value in re.findall(r"^\s*(FUSELET_[A-Z0-9_]+) = (\d+)", h.read_text(), re.M)
}
INVALID_ARGUMENT = CODES["FUSELET_ERR_INVALID_ARGUMENT"]
# The code given for a dtype fuselet_dtype lacks (float64, ...): none of the enum's.
UNKNOWN_DTYPE = 99


class GluOptions(ctypes.Structure):
    _fields_ = [
        ("activation", ctypes.c_int32),
        ("interleaved", ctypes.c_int32),
        ("alpha", ctypes.c_float),
        ("limit", ctypes.c_float),
    ]


class CrossEntropyOptions(ctypes.Structure):
    _fields_ = [
        ("ignore_index", ctypes.c_int64),
        ("label_smoothing", ctypes.c_float),
        ("z_loss", ctypes.c_float),
        ("softcap", ctypes.c_float),
    ]


class DivergenceOptions(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("log_target", ctypes.c_int32), ("beta", ctypes.c_float)]


# --- the C parameters of the raw ops' scalars (as csrc/torch/<op>.cpp makes them) ---------------


def _flags(op: str, s: dict) -> int:
    """The flags of the norm, softmax and rope functions."""
    bits = {
        "FUSELET_NORM_ZERO_CENTERED_GAMMA": s.get("zero_centered_gamma", False),
        "FUSELET_NORM_GATE_FIRST": not s.get("norm_before_gate", True),
        "FUSELET_SOFTMAX_CAUSAL": s.get("causal", False),
        "FUSELET_ROPE_BHSD": s.get("bhsd", False),
        "FUSELET_ROPE_INTERLEAVED": s.get("interleaved", False),
        "FUSELET_ROPE_PAIR_TABLE": s.get("pair_table", False),
        "FUSELET_ROPE_SECTIONS_INTERLEAVED": s.get("interleaved_sections", False),
    }
    family = {"softmax": "SOFTMAX", "rope": "ROPE"}.get(op.split("_")[0], "NORM")
    return sum(CODES[name] for name, on in bits.items() if on and name.startswith(f"FUSELET_{family}_"))


def _activation(op: str, s: dict) -> int:
    if op.startswith("geglu"):
        return CODES["FUSELET_GLU_GELU_TANH" if s["approximate"] == "tanh" else "FUSELET_GLU_GELU"]
    return CODES["FUSELET_GLU_SILU_CLAMPED" if op.startswith("clamped") else "FUSELET_GLU_SILU"]


def _opts(op: str, s: dict):
    if op.startswith("logprobs"):  # no label smoothing, no z-loss
        return CrossEntropyOptions(s["ignore_index"], 0.0, 0.0, s["softcap"])
    if op.startswith("cross_entropy"):
        return CrossEntropyOptions(s["ignore_index"], s["label_smoothing"], s["z_loss"], s["softcap"])
    if op.startswith("divergence"):
        return DivergenceOptions(s["kind"], int(s["log_target"]), s["beta"])
    alpha, limit = (s["alpha"], s["limit"]) if op.startswith("clamped") else (0.0, 0.0)
    return GluOptions(_activation(op, s), int(s.get("interleaved", False)), alpha, limit)


def _sections(op: str, s: dict):
    """rope's sections as the C ABI takes them: an int64 array, NULL for None."""
    values = s.get("sections") or []
    return (ctypes.c_int64 * len(values))(*values) if values else None


# C parameter -> (its ctypes type, or None for a pointer to a struct; its value from the raw op's
# name and its scalars by name)
SCALARS = {
    "eps": (ctypes.c_float, lambda op, s: s["eps"]),
    "scale": (ctypes.c_float, lambda op, s: s["scale"]),
    "grad_scale": (ctypes.c_float, lambda op, s: s["grad_scale"]),
    "group_size": (ctypes.c_int64, lambda op, s: s["group_size"]),
    "flags": (ctypes.c_uint32, _flags),
    "activation": (ctypes.c_int32, _activation),
    "opts": (None, _opts),  # a pointer to the options struct
    "sections": (ctypes.POINTER(ctypes.c_int64), _sections),
    "n_sections": (ctypes.c_int32, lambda op, s: len(s.get("sections") or [])),
}

# --- the table: raw op -> its scalars and its C `_check` functions --------------------------------

_GLU_FWD = ("fuselet_glu_fwd_check", "x activation"), ("fuselet_glu_fwd_ex_check", "x opts")
_GLU_BWD = ("fuselet_glu_bwd_check", "dy x activation"), ("fuselet_glu_bwd_ex_check", "dy x opts")
_CE_SCALARS = "ignore_index label_smoothing z_loss softcap"
_ROPE_SCALARS = "bhsd=False interleaved=False pair_table=False sections=None interleaved_sections=False"
# raw op (torch.ops.fuselet.<op>) -> (its scalar arguments in order, with the schema's defaults;
# its C `_check` functions, each with its parameters in order: a tensor by the raw op's name of it,
# a scalar as SCALARS makes it)
C_OPS = {
    "rms_norm_fwd": ("eps zero_centered_gamma=False", [("fuselet_rms_norm_fwd_check", "x weight eps flags")]),
    "rms_norm_bwd": ("zero_centered_gamma=False", [("fuselet_rms_norm_bwd_check", "dy x weight rstd flags")]),
    "layer_norm_fwd": ("eps zero_centered_gamma=False", [("fuselet_layer_norm_fwd_check", "x weight bias eps flags")]),
    "layer_norm_bwd": (
        "zero_centered_gamma=False",
        [("fuselet_layer_norm_bwd_check", "dy x weight bias mean rstd flags")],
    ),
    "add_rms_norm_fwd": ("eps zero_centered_gamma=False", [("fuselet_add_rms_norm_fwd_check", "x residual weight eps flags")]),
    "add_rms_norm_bwd": (
        "zero_centered_gamma=False",
        [("fuselet_add_rms_norm_bwd_check", "dy dresidual_out residual_out weight rstd flags")],
    ),
    "gated_rms_norm_fwd": (
        "eps group_size=0 norm_before_gate=True zero_centered_gamma=False",
        [("fuselet_gated_rms_norm_fwd_check", "x z weight eps group_size flags")],
    ),
    "gated_rms_norm_bwd": (
        "group_size=0 norm_before_gate=True zero_centered_gamma=False",
        [("fuselet_gated_rms_norm_bwd_check", "dy x z weight rstd group_size flags")],
    ),
    "swiglu_fwd": ("", _GLU_FWD),
    "swiglu_bwd": ("", _GLU_BWD),
    "geglu_fwd": ("approximate='none'", _GLU_FWD),
    "geglu_bwd": ("approximate='none'", _GLU_BWD),
    "clamped_swiglu_fwd": ("alpha=1.702 limit=7.0 interleaved=False", _GLU_FWD[1:]),
    "clamped_swiglu_bwd": ("alpha=1.702 limit=7.0 interleaved=False", _GLU_BWD[1:]),
    "softmax_fwd": ("scale=1.0 causal=False", [("fuselet_softmax_fwd_check", "x scale flags")]),
    "softmax_bwd": ("scale=1.0", [("fuselet_softmax_bwd_check", "dy y scale")]),
    "rope_fwd": (
        _ROPE_SCALARS,
        [
            ("fuselet_rope_fwd_check", "x cos sin flags"),
            ("fuselet_rope_sections_fwd_check", "x cos sin sections n_sections flags"),
        ],
    ),
    "rope_bwd": (
        _ROPE_SCALARS,
        [
            ("fuselet_rope_bwd_check", "dy cos sin flags"),
            ("fuselet_rope_sections_bwd_check", "dy cos sin sections n_sections flags"),
        ],
    ),
    "cross_entropy_fwd": (_CE_SCALARS, [("fuselet_cross_entropy_fwd_check", "logits target opts")]),
    "cross_entropy_bwd": (_CE_SCALARS, [("fuselet_cross_entropy_bwd_check", "dloss logits target lse opts")]),
    "cross_entropy_fwd_bwd": (
        _CE_SCALARS + " grad_scale",
        [("fuselet_cross_entropy_fwd_bwd_check", "logits target opts grad_scale")],
    ),
    "logprobs_fwd": ("ignore_index softcap with_entropy with_stats", [("fuselet_logprobs_fwd_check", "logits target opts")]),
    "logprobs_bwd_": (
        "ignore_index softcap",
        [("fuselet_logprobs_bwd_check", "dlogp dentropy logits target lse entropy opts")],
    ),
    "divergence_fwd": ("kind log_target beta", [("fuselet_divergence_fwd_check", "input target opts")]),
    "divergence_bwd": ("kind log_target beta wrt_target", [("fuselet_divergence_bwd_check", "dloss input target opts")]),
    "divergence_logits_": (
        "kind log_target beta scale",
        [("fuselet_divergence_logits_check", "input target dloss opts scale")],
    ),
}


def _ce(ignore_index, label_smoothing, z_loss, softcap) -> tuple:
    return cross_entropy.CrossEntropyOptions(ignore_index, label_smoothing, z_loss, softcap).op_args()


# public op -> (its raw op; the spec function whose defaults it has; its raw op's scalars, the
# op_args() of the spec's options made of the public arguments the lambda names)
PUBLIC = {
    "rms_norm": (
        "rms_norm_fwd",
        norm.norm,
        lambda eps, zero_centered_gamma: norm.NormOptions(eps, zero_centered_gamma).op_args(),
    ),
    "layer_norm": (
        "layer_norm_fwd",
        norm.norm,
        lambda eps, zero_centered_gamma: norm.NormOptions(eps, zero_centered_gamma).op_args(),
    ),
    "add_rms_norm": (
        "add_rms_norm_fwd",
        norm.norm,
        lambda eps, zero_centered_gamma: norm.NormOptions(eps, zero_centered_gamma).op_args(),
    ),
    "gated_rms_norm": (
        "gated_rms_norm_fwd",
        norm.gated,
        lambda eps, group_size, norm_before_gate, zero_centered_gamma: norm.GatedNormOptions(
            eps, 0 if group_size is None else group_size, norm_before_gate, zero_centered_gamma
        ).op_args(),
    ),
    "swiglu": ("swiglu_fwd", glu.swiglu, lambda: glu.GluOptions("swiglu").op_args()),
    "geglu": ("geglu_fwd", glu.geglu, lambda approximate: glu.GluOptions("geglu", approximate).op_args()),
    "clamped_swiglu": (
        "clamped_swiglu_fwd",
        glu.clamped_swiglu,
        lambda alpha, limit, interleaved: glu.GluOptions(
            "clamped_swiglu", alpha=alpha, limit=limit, interleaved=interleaved
        ).op_args(),
    ),
    "softmax": ("softmax_fwd", softmax.softmax, lambda scale, causal: softmax.SoftmaxOptions(scale, causal).op_args()),
    "rope": (
        "rope_fwd",
        rope.rope,
        lambda layout, interleaved, pair_table, sections, interleaved_sections: rope.RopeOptions(
            layout, interleaved, pair_table, sections, interleaved_sections
        ).op_args(),
    ),
    "cross_entropy": ("cross_entropy_fwd", cross_entropy.options, _ce),
    "cross_entropy.fwd_bwd": (
        "cross_entropy_fwd_bwd",
        cross_entropy.options,
        lambda ignore_index, label_smoothing, z_loss, softcap, grad_scale: (
            *_ce(ignore_index, label_smoothing, z_loss, softcap),
            grad_scale,
        ),
    ),
    "cross_entropy.logprobs_chunk": (
        "logprobs_fwd",
        cross_entropy.logprobs,
        lambda ignore_index, softcap: cross_entropy.LogprobsOptions(ignore_index, softcap).op_args(),
    ),
    "kl_div": (
        "divergence_fwd",
        divergence.kl_div,
        lambda log_target: divergence.DivergenceOptions("kl_div", log_target).op_args(),
    ),
    "jsd": ("divergence_fwd", divergence.jsd, lambda beta: divergence.DivergenceOptions("jsd", beta=beta).op_args()),
    "tvd": ("divergence_fwd", divergence.tvd, lambda: divergence.DivergenceOptions("tvd").op_args()),
}

# The spec modules of the ops composed in Python over other ops' kernels: no `_check` of their own.
COMPOSED = ("fused_linear_cross_entropy", "fused_linear_jsd", "fused_linear_logprobs", "losses")

# Python's terms -> the C ABI's, for the same thing: the options it takes as bits of its flags
# (named first: the flags argument), as enum codes and as int32 flags (1 and 0 for True and
# False), its NULL for None
C_TERMS = {
    "zero_centered_gamma: ": "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA ",
    "causal: ": "flags: FUSELET_SOFTMAX_CAUSAL ",
    "interleaved_sections: ": "flags: FUSELET_ROPE_SECTIONS_INTERLEAVED ",
    "(layout 'bshd')": "(flags without FUSELET_ROPE_BHSD)",
    "(layout 'bhsd')": "(flags with FUSELET_ROPE_BHSD)",
    "kind: expected 0 (KL), 1 (JSD) or 2 (TVD)": (
        "kind: expected FUSELET_DIVERGENCE_KL (0), FUSELET_DIVERGENCE_JSD (1) or FUSELET_DIVERGENCE_TVD (2)"
    ),
    "log_target: expected True": "log_target: expected 1",
    "got False": "got 0",
    "=None": "=NULL",
}
# A shape as Python writes it, a tuple: (2, 4), (8,), (); the C ABI writes [2, 4], [8], [].
_TUPLE = re.compile(r"\((\d+(?:, \d+)*)?,?\)")

SPEC_DIR = Path(_rules.__file__).parent
SPECS = {
    m.name: importlib.import_module(f"fuselet.spec.{m.name}") for m in pkgutil.iter_modules([str(SPEC_DIR)]) if m.name[0] != "_"
}
EXAMPLES = {op: example for module in SPECS.values() for op, example in module.EXAMPLES.items()}
COMPOSED_OPS = {
    op
    for name in COMPOSED
    for op in [*SPECS[name].EXAMPLES, *(op for refusal in getattr(SPECS[name], "OP_REFUSALS", []) for op in refusal.ops)]
}


def _scalar_names(raw_op: str) -> tuple[list[str], dict]:
    """The raw op's scalar arguments in order, and their defaults (C_OPS)."""
    names, defaults = [], {}
    for item in C_OPS[raw_op][0].split():
        name, _, default = item.partition("=")
        names.append(name)
        if default:
            defaults[name] = ast.literal_eval(default)
    return names, defaults


def _cases(table: str):
    for name, module in SPECS.items():
        for i, refusal in enumerate(getattr(module, table, [])):
            for op in refusal.ops:
                yield pytest.param(name, i, op, id=f"{name}-{op}-{i}-{refusal.message.split(':')[0]}")


@pytest.fixture(scope="module")
def lib():
    from fuselet import _core

    return _core.load()


def _view(value) -> Tensor | None:
    """A fuselet_tensor of the Array `value` (None: NULL): no data, contiguous strides, the code of
    its dtype (UNKNOWN_DTYPE for one fuselet_dtype lacks). More than FUSELET_MAX_DIMS dimensions
    are given by their count alone (ndim), which the checks refuse before they read a shape."""
    if value is None:
        return None
    t = Tensor()
    t.data = None
    t.dtype = CODES.get(f"FUSELET_{value.dtype.upper()}", UNKNOWN_DTYPE)
    t.ndim = len(value.shape)
    stride = 1
    for d in reversed(range(len(value.shape))):
        if d < len(t.shape):
            t.shape[d], t.strides[d] = value.shape[d], stride
        stride *= max(value.shape[d], 1)
    return t


def _call(lib, function: str, params: str, raw_op: str, args: dict, scalars: dict) -> tuple[int, str]:
    """The C function called with the arrays of `args` and the raw op's `scalars` (by name): its
    status and fuselet_last_error()."""
    values, types, keep = [], [], []
    for param in params.split():
        if param in SCALARS:
            ctype, make = SCALARS[param]
            value = make(raw_op, scalars)
            keep.append(value)
            values.append(ctypes.byref(value) if ctype is None else value)
            types.append(ctypes.POINTER(type(value)) if ctype is None else ctype)
        else:
            view = _view(args.get(param))
            keep.append(view)
            values.append(None if view is None else ctypes.byref(view))
            types.append(ctypes.POINTER(Tensor))
    fn = getattr(lib, function)
    fn.argtypes, fn.restype = types, ctypes.c_int
    status = fn(*values)
    return status, lib.fuselet_last_error().decode()


def _public_call(op: str, overrides: dict) -> tuple[str, dict, dict]:
    """(its raw op, the arguments by name, the raw op's scalars by name) of the public op's call:
    its valid call (EXAMPLES, the spec function's defaults) with `overrides`."""
    raw_op, spec_fn, options = PUBLIC[op]
    defaults = {n: p.default for n, p in inspect.signature(spec_fn).parameters.items() if p.default is not p.empty}
    args = {**defaults, **EXAMPLES[op], **overrides}
    values = options(**{n: args[n] for n in inspect.signature(options).parameters})
    return raw_op, args, dict(zip(_scalar_names(raw_op)[0], values, strict=True))


def _raw_call(op: str, args: dict) -> tuple[str, dict, dict]:
    names, defaults = _scalar_names(op)
    args = {**defaults, **args}
    return op, args, {n: args[n] for n in names}


def _c_arguments(op: str, public: bool) -> set[str]:
    """The arguments of `op` that reach the C ABI: the tensors of its C functions, its options."""
    raw_op = PUBLIC[op][0] if public else op
    tensors = {p for _, params in C_OPS[raw_op][1] for p in params.split() if p not in SCALARS}
    options = set(inspect.signature(PUBLIC[op][2]).parameters) if public else set(_scalar_names(raw_op)[0])
    return tensors | options


def _beyond_c_type(value) -> bool:
    """An int beyond int64, or a finite float that float32 makes inf or 0."""
    if type(value) is int:
        return not _rules.INT64_MIN <= value <= _rules.INT64_MAX
    if type(value) is float and math.isfinite(value):
        c = ctypes.c_float(value).value
        return math.isinf(c) or (c == 0.0 and value != 0.0)
    return False


def _unreachable(op: str, refusal, public: bool) -> str | None:
    """The rule by which the refusal cannot reach the C ABI (the module's docstring), or None."""
    if op in COMPOSED_OPS:
        return f"composed: {op} has no C check of its own"
    assert op in (PUBLIC if public else C_OPS), f"{op}: in neither PUBLIC nor C_OPS, nor an op of a COMPOSED spec"
    argument = refusal.message.split(":")[0]
    if argument not in _c_arguments(op, public):
        return f"no C parameter: the C ABI takes no {argument}"
    value = refusal.args.get(argument, EXAMPLES.get(op, {}).get(argument))
    if refusal.error is TypeError and not isinstance(value, Array):
        assert refusal.message.endswith(f", got {type(value).__name__}"), f"a TypeError not about the Python type: {refusal}"
        return f"a Python type: {argument} given a {type(value).__name__}"
    if isinstance(value, str):
        assert refusal.error is ValueError, refusal
        return f"a name: {argument} {value!r}, which has no C code"
    if _beyond_c_type(value):
        return f"beyond the C type: {argument} = {value!r}"
    return None


def _expected(refusal, args: dict) -> str:
    """How the C message must start: the refusal's words (the raw op's where it has its own), its
    shapes as the C ABI writes them, a dtype with no code by its code, in the C ABI's terms."""
    words = refusal.raw if isinstance(refusal.raw, str) else refusal.message
    words = _TUPLE.sub(lambda m: f"[{m.group(1) or ''}]", words)
    for value in args.values():
        if isinstance(value, Array) and f"FUSELET_{value.dtype.upper()}" not in CODES:
            words = words.replace(f"got {value.dtype}", f"got code {UNKNOWN_DTYPE}")
    for python, c in C_TERMS.items():
        words = words.replace(python, c)
    return words


def _functions(raw_op: str, scalars: dict) -> list[tuple[str, str]]:
    """The C functions of the raw op that its call reaches: those without a sections parameter
    (rope's entry points of one table) only where sections is empty."""
    return [(f, params) for f, params in C_OPS[raw_op][1] if "sections" in params.split() or not scalars.get("sections")]


def _check(lib, op: str, refusal, public: bool) -> None:
    reason = _unreachable(op, refusal, public)
    if reason:
        pytest.skip(reason)
    raw_op, args, scalars = _public_call(op, refusal.args) if public else _raw_call(op, refusal.args)
    expected = _expected(refusal, args)
    argument = expected.split(":")[0]
    for function, params in _functions(raw_op, scalars):
        status, message = _call(lib, function, params, raw_op, args, scalars)
        where = f"{function} ({op})"
        if refusal.raw is False:  # the raw op takes the value, with another meaning: so does the C ABI
            assert status == 0, f"{where} refuses what the raw op takes: {message!r}"
            continue
        assert status == INVALID_ARGUMENT, f"{where}: status {status} ({message!r}) for {refusal}"
        assert message.startswith(f"{argument}: "), f"{where} names another argument first: {message!r}, not {argument}"
        kind = TypeError if ": expected dtype " in message else ValueError
        assert kind is refusal.error, (
            f"{where}: a {kind.__name__} in the torch binding, not a {refusal.error.__name__}: {message!r}"
        )
        assert message.startswith(expected), f"{where}: other words\n  C:      {message!r}\n  Python: {expected!r}"


@pytest.mark.parametrize(("spec", "index", "op"), list(_cases("REFUSALS")))
def test_the_c_abi_refuses_as_the_layers(lib, spec, index, op):
    _check(lib, op, SPECS[spec].REFUSALS[index], public=True)


@pytest.mark.parametrize(("spec", "index", "op"), list(_cases("OP_REFUSALS")))
def test_the_c_abi_refuses_as_the_raw_ops(lib, spec, index, op):
    _check(lib, op, SPECS[spec].OP_REFUSALS[index], public=False)


# --- the tables are right and complete --------------------------------------------------------


@pytest.mark.parametrize("op", sorted(PUBLIC))
def test_the_valid_calls_pass(lib, op):
    """Each public op's valid call (EXAMPLES) passes each of its C functions: a refusal above is
    that of its bad value alone."""
    raw_op, args, scalars = _public_call(op, {})
    for function, params in _functions(raw_op, scalars):
        status, message = _call(lib, function, params, raw_op, args, scalars)
        assert status == 0, f"{function} ({op}): {message!r}"


def _declared_checks() -> dict[str, list[str]]:
    """The `_check` functions of the headers: name -> their parameters' names in order."""
    found = {}
    for header in HEADERS:
        for name, params in re.findall(r"FUSELET_API fuselet_status (fuselet_\w+_check)\(([^)]*)\);", header.read_text()):
            found[name] = [p.split()[-1].lstrip("*") for p in params.split(",")]
    return found


def test_the_table_has_every_c_check_with_its_parameters():
    """C_OPS names every `_check` function of the headers, with their parameters in order."""
    declared = _declared_checks()
    assert len(declared) >= 21, sorted(declared)
    table = {function: params.split() for _, functions in C_OPS.values() for function, params in functions}
    assert sorted(set(declared) - set(table)) == [], "a `_check` function C_OPS does not call"
    assert {f: declared.get(f) for f in table} == table


def test_every_op_is_mapped_or_composed():
    """Every op of the spec tables is a key of PUBLIC (a public op) or C_OPS (a raw op), or an op
    of a COMPOSED spec, which no header declares a `_check` function of."""
    assert set(COMPOSED) <= set(SPECS)
    assert {raw for raw, _, _ in PUBLIC.values()} <= set(C_OPS)
    public = {op for name, m in SPECS.items() if name not in COMPOSED for op in m.EXAMPLES}
    assert public == set(PUBLIC), f"PUBLIC lacks {sorted(public - set(PUBLIC))}, has {sorted(set(PUBLIC) - public)}"
    raw = {op for name, m in SPECS.items() if name not in COMPOSED for r in getattr(m, "OP_REFUSALS", []) for op in r.ops}
    assert raw <= set(C_OPS), f"C_OPS lacks {sorted(raw - set(C_OPS))}"
    stems = {op.split(".")[0] for op in COMPOSED_OPS} | set(COMPOSED)
    own = [f for f in _declared_checks() if any(f.startswith(f"fuselet_{stem}_") for stem in stems)]
    assert not own, f"a COMPOSED op has a `_check` of its own: {own} (give it C_OPS and PUBLIC rows)"


def test_the_raw_scalars_are_the_schemas():
    """C_OPS's scalars of each raw op are its schema's (names, order, defaults)."""
    import_layer("torch")
    import torch

    for raw_op in C_OPS:
        schema = getattr(torch.ops.fuselet, raw_op).default._schema
        scalars = [
            (a.name, a.default_value if a.has_default_value() else None) for a in schema.arguments if "Tensor" not in str(a.type)
        ]
        names, defaults = _scalar_names(raw_op)
        assert scalars == [(n, defaults.get(n)) for n in names], raw_op
