"""Every per-op list of fuselet names the same ops. The one list is the public ops of the layers
(fuselet.torch and fuselet.jax export the same ones); each other list — the torch schemas
(csrc/torch/registration.cpp), the XLA FFI targets (fuselet/jax/_load.py OPS), the ONNX
translations, the DTensor sharding rules, the bad-input tests, the docs' tables and API pages —
is held to it here, and a test names what is missing where. docs/development.md "Adding an op"
lists the files in the order a new op fills them."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from tests.conftest import import_layer

ROOT = Path(__file__).resolve().parents[1]
ft = import_layer("torch")
fj = import_layer("jax")
# The JAX layer's FFI target family for a public op whose kernel it shares with another.
FFI_FAMILY = {
    "swiglu": "glu",
    "geglu": "glu",
    "clamped_swiglu": "glu",
    "fused_linear_cross_entropy": "cross_entropy",
    "fused_linear_logprobs": "cross_entropy",
}
# Public ops composed in Python from other ops' kernels (no schema or FFI target of their own).
COMPOSED = {"fused_linear_cross_entropy": "cross_entropy", "fused_linear_logprobs": "cross_entropy"}
# Public ops that are one kernel family's modes (the kind argument of its schema and FFI target).
FAMILIES = {"kl_div": "divergence", "jsd": "divergence", "tvd": "divergence"}
# Public losses composed in Python from another public op (fuselet/_losses.py's math over its
# per-token results): that op's kernels, ONNX translations and sharding rules are theirs.
LOSSES = {
    "fused_linear_preference_loss": "fused_linear_cross_entropy",
    "fused_linear_grpo_loss": "fused_linear_cross_entropy",
    "fused_linear_kto_loss": "fused_linear_cross_entropy",
    "fused_linear_jsd": "jsd",
    "fused_linear_jsd_per_token": "jsd",
}


def public_ops(layer) -> set[str]:
    return {
        name
        for name in layer.__all__
        if name.islower() and callable(getattr(layer, name)) and not isinstance(getattr(layer, name), types.ModuleType)
    }


OPS = sorted(public_ops(ft))
KERNEL_OPS = [op for op in OPS if op not in LOSSES]


def test_every_loss_is_composed_of_a_public_op():
    assert set(LOSSES) <= set(OPS) and set(LOSSES.values()) <= set(KERNEL_OPS), LOSSES


def torch_schemas() -> set[str]:
    source = (ROOT / "csrc/torch/registration.cpp").read_text()
    return set(re.findall(r'm\.def\(\s*"([a-z_0-9]+)\(', source))


def test_both_layers_export_the_same_ops():
    assert public_ops(ft) == public_ops(fj), (
        f"only in torch: {public_ops(ft) - public_ops(fj)}; only in jax: {public_ops(fj) - public_ops(ft)}"
    )


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_every_op_has_a_forward_and_backward_kernel_in_both_layers(op):
    family = COMPOSED.get(op, FAMILIES.get(op, op))
    schemas = torch_schemas()
    missing = [s for s in (f"{family}_fwd", f"{family}_bwd") if s not in schemas]
    assert not missing, f"{op}: csrc/torch/registration.cpp defines no torch.ops.fuselet.{missing}"
    from fuselet.jax import _load

    ffi = FFI_FAMILY.get(op, family)
    missing = [t for t in (f"{ffi}_fwd", f"{ffi}_bwd") if t not in _load.OPS]
    assert not missing, f"{op}: fuselet/jax/_load.py OPS has no XLA FFI target {missing}"


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_every_forward_has_an_onnx_translation(op):
    from fuselet.torch import onnx

    wanted = {
        "fused_linear_cross_entropy": ["fused_linear_cross_entropy_none", "fused_linear_cross_entropy_reduced"],
        "fused_linear_logprobs": ["fused_linear_logprobs_fwd"],
    }.get(op, [f"{FAMILIES.get(op, op)}_fwd"])
    missing = [name for name in wanted if name not in onnx._OPS]
    assert not missing, f"{op}: fuselet/torch/onnx.py translates no {missing}"


def test_every_torch_schema_has_a_dtensor_rule():
    from fuselet.torch import _dtensor

    ruled = {name for names, _, _ in _dtensor._RULES for name in names}
    missing = sorted(torch_schemas() - ruled)
    assert not missing, f"no @sharding rule (fuselet/torch/_dtensor.py) declares torch.ops.fuselet.{missing}"


@pytest.mark.parametrize("layer", [ft, fj], ids=["torch", "jax"])
def test_every_op_module_is_in_the_api_reference(layer):
    page = f"docs/api/{layer.__name__.split('.')[-1]}.md"
    text = (ROOT / page).read_text()
    missing = sorted({getattr(layer, op).__module__ for op in OPS} - set(re.findall(r"^::: (\S+)", text, re.M)))
    assert not missing, f"{page} has no API reference (::: module) of {missing}"


# where each op must be named: the losses' memory and time are measured against the unfused
# path in their own benchmark (peak memory of a whole step, not the saved set of one kernel)
PAGES = {
    "README.md": OPS,
    "docs/ops.md": OPS,
    "tests/bad_input": OPS,
    "benchmarks/bench_memory.py": KERNEL_OPS,
    "benchmarks/bench_losses.py": sorted(LOSSES),
}


@pytest.mark.parametrize("page", PAGES)
def test_every_op_is_named_where_users_and_tests_look(page):
    path = ROOT / page  # a folder: its Python files together
    text = "\n".join(f.read_text() for f in sorted(path.glob("*.py"))) if path.is_dir() else path.read_text()
    missing = [op for op in PAGES[page] if not re.search(rf"\b{op}\b", text)]
    assert not missing, f"{page} does not name {missing}"
