"""Every rule of every op spec (python/fuselet/spec/<op>.py) refuses alike in both layers.

Each spec module keeps beside its rules EXAMPLES (a valid call of each public op) and REFUSALS (a
bad value for each rule, with the refusal). Every refusal is given here to the torch layer's
public function, the JAX layer's, and, where the raw op takes that argument, to the raw op
torch.ops.fuselet.<op> on meta tensors (which runs its fake impl): each must raise the same
exception type with the same message, which names the argument first (an argument of one layer
alone, as fuselet.torch.cross_entropy's inplace_backward, is given to that layer). OP_REFUSALS
are the raw ops' own rules (their backward tensors, their option codes), given to the raw ops on
meta tensors.

test_every_rule_has_a_refusal holds the tables complete: every rule call and every raise of a spec
module, and every raise of spec/_rules.py, is reached by some refusal.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import fuselet.spec
import pytest
from fuselet.spec._rules import Array

from tests.conftest import import_layer

pytestmark = pytest.mark.smoke

ft = import_layer("torch")
fj = import_layer("jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

SPEC_DIR = Path(fuselet.spec.__file__).parent
SPECS = {
    m.name: importlib.import_module(f"fuselet.spec.{m.name}") for m in pkgutil.iter_modules([str(SPEC_DIR)]) if m.name[0] != "_"
}


def _softcap_as_op(args: dict) -> dict:
    """cross_entropy's options as its raw ops take them: softcap None is 0.0 there."""
    return {**args, "softcap": 0.0 if args.get("softcap") is None else args["softcap"]}


def _logprobs_as_op(args: dict) -> dict:
    """logprobs_chunk's arguments as logprobs_fwd takes them: softcap None is 0.0, outputs the flags
    with_entropy and with_stats (outputs that are no such set stay, which that op lacks)."""
    args = _softcap_as_op(args)
    outputs = args.get("outputs", frozenset())
    if isinstance(outputs, (set, frozenset)) and outputs <= {"entropy", "log_sum_sq_probs", "mean_logits", "is_top1"}:
        args.pop("outputs", None)
        args["with_entropy"] = "entropy" in outputs
        args["with_stats"] = bool(outputs - {"entropy"})
    return args


def _layout_as_op(args: dict) -> dict:
    """rope's layout as its raw ops take it: the flag bhsd (a layout of neither name stays);
    sections a list, [] for None (a value of another type stays)."""
    args = dict(args)
    if args.get("layout", "bshd") in ("bshd", "bhsd"):
        args["bhsd"] = args.pop("layout", "bshd") == "bhsd"
    if isinstance(args.get("sections"), tuple):
        args["sections"] = list(args["sections"])
    return args


def _linear_logprobs_as_op(args: dict) -> dict:
    """fused_linear_logprobs' options as its raw ops take them: softcap None 0.0, outputs as flags
    (a value the spec refuses stays, for the public layers), chunk_size None 0."""
    from fuselet.spec import fused_linear_logprobs as logprobs

    args = {**_softcap_as_op(args), "chunk_size": args.get("chunk_size") or 0}
    outputs = args.get("outputs", ("log_probs",))
    if isinstance(outputs, tuple) and set(outputs) <= set(logprobs.OUTPUTS):
        args["outputs"] = logprobs.flags(outputs)
    return args


# public op -> (its raw forward op, how the public arguments become the raw op's, by name); every
# public op is named (test_every_public_op_has_a_spec)
RAW = {
    "rms_norm": ("rms_norm_fwd", None),
    "layer_norm": ("layer_norm_fwd", None),
    "add_rms_norm": ("add_rms_norm_fwd", None),
    "gated_rms_norm": ("gated_rms_norm_fwd", lambda args: {**args, "group_size": args.get("group_size") or 0}),
    "cross_entropy": ("cross_entropy_fwd", _softcap_as_op),
    "cross_entropy.fwd_bwd": ("cross_entropy_fwd_bwd", _softcap_as_op),
    "cross_entropy.logprobs_chunk": ("logprobs_fwd", _logprobs_as_op),
    "swiglu": ("swiglu_fwd", None),
    "geglu": ("geglu_fwd", None),
    "clamped_swiglu": ("clamped_swiglu_fwd", None),
    "softmax": ("softmax_fwd", None),
    "rope": ("rope_fwd", _layout_as_op),
    "kl_div": ("divergence_fwd", lambda args: {**args, "kind": 0, "beta": 0.0}),
    "jsd": ("divergence_fwd", lambda args: {**args, "kind": 1, "log_target": True}),
    "tvd": ("divergence_fwd", lambda args: {**args, "kind": 2, "log_target": True, "beta": 0.0}),
    "fused_linear_cross_entropy": (
        "fused_linear_cross_entropy_none",
        lambda args: {**_softcap_as_op(args), "chunk_size": args.get("chunk_size") or 0},
    ),
    "fused_linear_logprobs": ("fused_linear_logprobs_fwd", _linear_logprobs_as_op),
    # composed in Python over another public op's raw ops (which the refusals above reach): none of their own
    "fused_linear_jsd": None,
    "fused_linear_jsd_per_token": None,
    "fused_linear_preference_loss": None,
    "fused_linear_kto_loss": None,
    "fused_linear_grpo_loss": None,
}


def _cases(table: str):
    for name, module in SPECS.items():
        for i, refusal in enumerate(getattr(module, table, [])):
            for op in refusal.ops:
                overrides = ",".join(
                    f"{k}={v!r}" if not isinstance(v, Array) else f"{k}={v.shape}{v.dtype}" for k, v in refusal.args.items()
                )
                yield pytest.param(name, i, op, id=f"{name}-{op}-{i}-{overrides}")


def _array(framework: str, value, device: str = "cpu"):
    if not isinstance(value, Array):
        return value
    if framework == "torch":
        return torch.ones(value.shape, dtype=getattr(torch, value.dtype), device=device)
    with jax.enable_x64(value.dtype in ("float64", "int64")):  # a real float64 jax.Array
        return jnp.ones(value.shape, dtype=value.dtype)


def _function(layer, op: str):
    fn = layer
    for part in op.split("."):
        fn = getattr(fn, part)
    return fn


def _public(layer, op: str, args: dict):
    fn = _function(layer, op)
    framework = layer.__name__.split(".")[-1]
    return fn(**{k: _array(framework, v) for k, v in args.items()})


def _fits(kind: str, value) -> bool:
    """Whether the raw op's schema takes `value` for an argument of type `kind` (else torch's
    dispatcher refuses it before the fake impl runs)."""
    if kind in ("Tensor", "Optional[Tensor]"):
        return isinstance(value, Array) or (value is None and kind.startswith("Optional"))
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "float": number,
        "int": number and isinstance(value, int),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "Optional[List[int]]": value is None
        or (isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)),
    }.get(kind, False)


def _raw(op: str, args: dict):
    """The call of torch.ops.fuselet.<op> with `args` (by its schema's names; arrays on meta) and
    the schema's defaults for the others, or None where the schema cannot take them."""
    schema = getattr(torch.ops.fuselet, op).default._schema
    values = []
    for a in schema.arguments:
        if a.name in args:
            if not _fits(str(a.type), args[a.name]):
                return None
            values.append(_array("torch", args[a.name], "meta"))
        elif a.has_default_value():
            values.append(a.default_value)
        else:
            raise AssertionError(f"{op}: no value for {a.name}")
    return lambda: getattr(torch.ops.fuselet, op)(*values)


def _raw_call(op: str, refusal):
    """The raw forward op's call of the public op `op` with the refusal's arguments, or None where
    the raw op does not take them (an argument it lacks, or of a type its schema refuses)."""
    if RAW[op] is None:
        return None
    raw_op, convert = RAW[op]
    fn = _function(ft, op)
    defaults = {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
    args = {**defaults, **SPECS_EXAMPLES[op], **refusal.args}
    args = convert(args) if convert else args
    names = {a.name for a in getattr(torch.ops.fuselet, raw_op).default._schema.arguments}
    if not set(convert(dict(refusal.args)) if convert else refusal.args) <= names:
        return None
    return _raw(raw_op, {k: v for k, v in args.items() if k in names})


SPECS_EXAMPLES = {op: example for module in SPECS.values() for op, example in getattr(module, "EXAMPLES", {}).items()}


def _refused(call) -> BaseException:
    try:
        call()
    except (TypeError, ValueError, NotImplementedError) as e:
        return e
    raise AssertionError("not refused")


def _check(exc, refusal, where: str) -> None:
    assert type(exc) is refusal.error, f"{where}: {type(exc).__name__}: {exc}"
    assert str(exc).startswith(refusal.message), f"{where}: {exc}"


@pytest.mark.parametrize(("spec", "index", "op"), list(_cases("REFUSALS")))
def test_both_layers_and_the_raw_op_refuse_alike(spec, index, op):
    refusal = SPECS[spec].REFUSALS[index]
    args = {**SPECS_EXAMPLES[op], **refusal.args}
    argument = refusal.message.split(":")[0]
    assert argument in inspect.signature(_function(ft, op)).parameters, f"the message names {argument!r}, not an argument of {op}"
    torch_error = _refused(lambda: _public(ft, op, args))
    _check(torch_error, refusal, f"fuselet.torch.{op}")
    if set(refusal.args) <= set(inspect.signature(_function(fj, op)).parameters):  # else an argument of torch's alone
        jax_error = _refused(lambda: _public(fj, op, args))
        _check(jax_error, refusal, f"fuselet.jax.{op}")
        assert str(jax_error) == str(torch_error)
    raw = _raw_call(op, refusal) if refusal.raw is not False else None
    if raw is not None:
        raw_error = _refused(raw)
        if refusal.raw is True:
            _check(raw_error, refusal, f"torch.ops.fuselet.{RAW[op][0]} (meta)")
            assert str(raw_error) == str(torch_error)
        else:
            assert type(raw_error) is refusal.error and str(raw_error).startswith(refusal.raw), raw_error


@pytest.mark.parametrize(("spec", "index", "op"), list(_cases("OP_REFUSALS")))
def test_the_raw_ops_refuse(spec, index, op):
    refusal = SPECS[spec].OP_REFUSALS[index]
    call = _raw(op, refusal.args)
    assert call is not None, refusal
    _check(_refused(call), refusal, f"torch.ops.fuselet.{op} (meta)")


def test_every_public_op_has_a_spec():
    """Every public op of the layers has a valid call in a spec's EXAMPLES and its raw op named here."""
    ops = {name for name in ft.__all__ if name.islower() and callable(getattr(ft, name)) and name != "transformers"}
    assert ops <= set(SPECS_EXAMPLES), f"no spec module (fuselet/spec) has EXAMPLES of {sorted(ops - set(SPECS_EXAMPLES))}"
    assert set(SPECS_EXAMPLES) <= set(RAW), f"RAW names no raw op of {sorted(set(SPECS_EXAMPLES) - set(RAW))}"


def test_the_specs_import_no_framework():
    """fuselet.spec is plain Python: importing every spec module brings in neither framework."""
    modules = ", ".join(f"fuselet.spec.{name}" for name in SPECS)
    code = f"import sys, {modules}; print(sorted({{'torch', 'jax', 'numpy'}} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"], out.stdout


def test_the_valid_calls_run():
    """The examples the refusals start from are themselves valid (each refusal is its own)."""
    for op, args in SPECS_EXAMPLES.items():
        _public(ft, op, args)
        _public(fj, op, args)


# --- the tables are complete ------------------------------------------------------------------


def _rule_calls(tree) -> list[tuple[str, int, int]]:
    """(rule, first line, last line) of each call r.<rule>(...) in the functions of a module."""
    return [
        (n.func.attr, n.lineno, n.end_lineno)
        for f in tree.body
        if isinstance(f, (ast.FunctionDef, ast.ClassDef))
        for n in ast.walk(f)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "r"
    ]


def _raises(f) -> list[tuple[int, int]]:
    return [(n.lineno, n.end_lineno) for n in ast.walk(f) if isinstance(n, ast.Raise)]


def _sites() -> dict[str, list[tuple[int, int]]]:
    """file -> (first, last) lines of each raise and each call of a rule (r.<rule>) that raises in
    the functions of the spec modules, and of each raise in the rules of spec/_rules.py they use."""
    rules = {f.name: f for f in ast.parse((SPEC_DIR / "_rules.py").read_text()).body if isinstance(f, ast.FunctionDef)}
    calls = {
        name: {n.func.id for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for name, f in rules.items()
    }
    raising = {name for name, f in rules.items() if _raises(f)}
    while more := {name for name in rules if calls[name] & raising} - raising:
        raising |= more
    sites, used = {}, set()
    for path in sorted(SPEC_DIR.glob("*.py")):
        if path.name == "_rules.py":
            continue
        tree = ast.parse(path.read_text())
        found = [(a, b) for f in tree.body if isinstance(f, (ast.FunctionDef, ast.ClassDef)) for a, b in _raises(f)]
        found += [(a, b) for rule, a, b in _rule_calls(tree) if rule in raising]
        # and each call of a helper of the module that raises (losses.py's _number): each of its
        # callers states a rule of its own argument
        helpers = {
            f.name
            for f in tree.body
            if isinstance(f, ast.FunctionDef)
            and (_raises(f) or any(rule in raising for rule, _, _ in _rule_calls(ast.Module(body=[f], type_ignores=[]))))
        }
        found += [
            (n.lineno, n.end_lineno)
            for f in tree.body
            if isinstance(f, (ast.FunctionDef, ast.ClassDef))
            for n in ast.walk(f)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in helpers
        ]
        used |= {rule for rule, _, _ in _rule_calls(tree)}
        sites[path.name] = found
    while more := set().union(*(calls[name] & set(rules) for name in used)) - used:
        used |= more
    sites["_rules.py"] = [site for name in sorted(used) for site in _raises(rules[name])]
    return sites


def _reached(exc: BaseException) -> set[tuple[str, int]]:
    lines, tb = set(), exc.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if path.parent == SPEC_DIR:
            lines.add((path.name, tb.tb_lineno))
        tb = tb.tb_next
    return lines


def test_every_rule_has_a_refusal():
    reached = set()
    for module in SPECS.values():
        for refusal in getattr(module, "REFUSALS", []):
            for op in refusal.ops:
                args = {**SPECS_EXAMPLES[op], **refusal.args}
                reached |= _reached(_refused(lambda op=op, args=args: _public(ft, op, args)))
                raw = _raw_call(op, refusal) if refusal.raw is not False else None
                if raw is not None:
                    reached |= _reached(_refused(raw))
        for refusal in getattr(module, "OP_REFUSALS", []):
            for op in refusal.ops:
                reached |= _reached(_refused(_raw(op, refusal.args)))
    missing = [
        f"{name}:{first}"
        for name, found in _sites().items()
        for first, last in found
        if not any((name, line) in reached for line in range(first, last + 1))
    ]
    assert not missing, f"no refusal of the tables (REFUSALS, OP_REFUSALS) reaches these rules: {missing}"
