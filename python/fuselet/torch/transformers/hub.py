"""transformers' own door: kernel_mapping() and kernel_config() name fuselet's layers in its
local kernel repository (fuselet/torch/hub) for the `kernels` package, and the per-class checks
those layers (fuselet.torch.hub.layers) run before they take a marked norm class or rotary
function: the norm and rotary probes of fuse(), on a probe instance of the class's own."""

from __future__ import annotations

import functools
import inspect
import pathlib

import torch

from fuselet.torch.transformers.norms import _EPS_ATTRS, _norm_form
from fuselet.torch.transformers.probe import _generator, _randn
from fuselet.torch.transformers.rotary import _ROPE_FORMS, _ROPE_SIGNATURES, _rotary_form_on, _wrapped_function

# --- transformers' own door: the `kernels` package's local layer repository ---------------------
#
# transformers marks layers for kernel swapping (`@use_kernel_forward_from_hub("RMSNorm")` on a
# norm class, `("rotary_pos_emb")` on apply_rotary_pos_emb) and `use_kernels=True` /
# `model.kernelize()` has the `kernels` package swap each marked layer's forward for the layer
# of the same name in a kernel repository. fuselet ships one (fuselet/torch/hub, the layout
# kernels' LocalLayerRepository loads): its layers, in fuselet.torch.hub.layers, take the
# checks below. kernels swaps by name alone, so each of them first checks the class it
# replaces (once per class, on a probe instance of its own, the checks fuse() runs) and runs
# the class's own forward where fuselet's op does not equal it.

HUB_REPOSITORY = pathlib.Path(__file__).parent.with_name("hub")  # fuselet/torch/hub
HUB_LAYERS = ("RMSNorm", "RMSNormZeroCentered", "rotary_pos_emb")


def kernel_mapping(devices=("cpu", "cuda")) -> dict:
    """{layer name: {device: {mode: kernels.LocalLayerRepository}}} of fuselet's layers: every
    mode (training, inference, torch.compile) on each device. register_kernels() registers it
    for use_kernels=True; `kernels.use_kernel_mapping(...)` scopes it to a block, and a model
    kernelized inside one loses fuselet's layers at its next train() / eval() outside it (see
    register_kernels). The CPU's form: on CUDA, use_kernels registers transformers' own hub
    mapping over this one (its RMSNorm and rotary_pos_emb kernels), so there take kernel_config()."""
    from kernels import LocalLayerRepository, Mode

    if isinstance(devices, str) or not all(d in ("cpu", "cuda") for d in devices):
        raise ValueError(f"devices: expected a tuple of 'cpu' / 'cuda', got {devices!r}")
    modes = (Mode.TRAINING, Mode.INFERENCE, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.INFERENCE | Mode.TORCH_COMPILE)
    return {
        name: {d: dict.fromkeys(modes, LocalLayerRepository(repo_path=HUB_REPOSITORY, layer_name=name)) for d in devices}
        for name in HUB_LAYERS
    }


def register_kernels(devices=("cpu", "cuda")) -> None:
    """Register fuselet's layers (kernel_mapping(devices)) in the `kernels` package's global
    mapping, for `from_pretrained(..., use_kernels=True)` / `model.set_use_kernels(True)` after
    it: the CPU's form of transformers' own door. transformers re-kernelizes a model at each
    train() / eval() that changes its mode (Trainer calls train() every step), with the mapping
    registered at that moment; registered here, fuselet's layers stay across those switches,
    while a `with kernels.use_kernel_mapping(kernel_mapping()):` block's mapping is gone once the
    block ends, and the first mode switch after it silently gives each layer its own forward
    back. Call it once per process, outside any use_kernel_mapping block (inside one, the
    registration ends with the block); calling it again changes nothing. On CUDA take
    kernel_config() instead: use_kernels registers transformers' own hub mapping (RMSNorm and
    rotary_pos_emb kernels) over this one at each kernelization."""
    from kernels import register_kernel_mapping

    register_kernel_mapping(kernel_mapping(devices))


def kernel_config(layers=("RMSNorm", "rotary_pos_emb")):
    """A transformers KernelConfig of fuselet's local layers, for
    `from_pretrained(..., use_kernels=True, kernel_config=kernel_config())`. transformers 5.25
    takes a KernelConfig on GPUs only (cuda, rocm, xpu, ...): on the CPU, use kernel_mapping().
    `layers`: the names of HUB_LAYERS the model marks (KernelConfig refuses one it does not; the
    default: the two most models mark)."""
    from transformers import KernelConfig

    unknown = [n for n in layers if n not in HUB_LAYERS] if not isinstance(layers, str) else [layers]
    if unknown:
        raise ValueError(f"layers: expected names among {HUB_LAYERS}, got {unknown}")
    return KernelConfig({name: f"{HUB_REPOSITORY}:{name}" for name in layers}, use_local_kernel=True)


_EPS_PROBES = dict(zip(_EPS_ATTRS, (0.31, 0.047, 0.0053, 0.00071)))  # one eps value per attribute name


@functools.cache
def _class_norm_form(cls):
    """(op, eps attribute, zero_centered, mixed) of a norm class, checked on an instance of its own
    (weight [16], each eps attribute a different value); None where fuselet's op does not equal it."""
    try:
        probe = cls.__new__(cls)
        torch.nn.Module.__init__(probe)
        probe.weight = torch.nn.Parameter(_randn(16, like=torch.empty(0)) * 0.5 + 1)
        for attr, value in _EPS_PROBES.items():
            setattr(probe, attr, value)
        (op, eps, zc), mixed = _norm_form(probe)
    except Exception:  # _Left, or a forward that needs more of its class than weight and eps
        return None
    attr = next((a for a, v in _EPS_PROBES.items() if v == eps), None)
    return None if attr is None else (op, attr, zc, mixed)


@functools.cache
def _class_rotary_form(cls, size, width):
    """The index into _ROPE_FORMS of the form of ft.rope that equals a marked apply_rotary_pos_emb
    on heads of `size` with tables [1, 5, width] of random, unstructured angles (the call's own
    widths: a half-width table is GPT-OSS's form or a partial rotary); None where none does."""
    plain = _wrapped_function(cls)
    if plain is None or _ROPE_SIGNATURES.get(tuple(inspect.signature(plain).parameters)) != "plain":
        return None
    angles = torch.rand(1, 5, width, generator=_generator()) * 6
    form, _ = _rotary_form_on(plain, angles.cos(), angles.sin(), size)
    return None if form is None else _ROPE_FORMS.index(form)
