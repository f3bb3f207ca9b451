"""Load the fuselet XLA FFI library and register all of its targets with JAX (at import).

Every target is registered when fuselet.jax is imported, so that a jax.export artifact
deserialized in a fresh process finds its handlers before anything is traced. Registering
initializes no JAX backend (jaxlib queues a target until the platform's client is created),
so jax.distributed.initialize() may still follow the import. CUDA handlers are registered
where the CUDA kernels were built; they run only where JAX finds a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import sys

from fuselet import _core, _guard

LIBRARY_NAME = "libfuselet_jax.so"
# The ops of csrc/jax (FUSELET_JAX_HANDLERS): target fuselet_<op>, symbols fuselet_jax_<op>_{cpu,cuda}.
OPS = (
    "rms_norm_fwd",
    "rms_norm_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
    "add_rms_norm_fwd",
    "add_rms_norm_bwd",
    "gated_rms_norm_fwd",
    "gated_rms_norm_bwd",
    "glu_fwd",
    "glu_bwd",
    "softmax_fwd",
    "softmax_bwd",
    "rope_fwd",
    "rope_bwd",
    "rope_sections_fwd",
    "rope_sections_bwd",
    "cross_entropy_fwd",
    "cross_entropy_bwd",
    "cross_entropy_fwd_bwd",
    "logprobs_fwd",
    "logprobs_bwd",
    "divergence_fwd",
    "divergence_bwd",
    "divergence_logits",
)
TARGETS = tuple(f"fuselet_{op}" for op in OPS)
_lib = None


def _install_hint(built: dict | None) -> str:
    if built is None:
        return _core.missing_layer_hint("jax", "pip install jax")
    return (
        f"pip install 'jax[cpu]=={built['jaxlib_version']}' (any jaxlib whose XLA FFI API is "
        f"{'.'.join(map(str, built['ffi_api']))} or newer works), or with conda: conda install fuselet-jax"
    )


def load() -> dict:
    """Check the FFI library against the running jaxlib and load it; returns its build info."""
    global _lib
    where = _core.layer_dir("jax")
    built = _guard.read_build_info(where) if where else None
    try:
        import jax  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"fuselet.jax needs JAX, which cannot be imported in this environment ({sys.executable}): "
            f"{exc}. Fix: {_install_hint(built)}."
        ) from exc
    if built is None or not (where / LIBRARY_NAME).exists():
        raise ImportError(
            "fuselet.jax: this fuselet was built without its JAX extension (looked in "
            + ", ".join(map(str, _core.layer_candidates("jax")))
            + "). Fix: "
            "FUSELET_FRAMEWORK=jax pip install --no-build-isolation --force-reinstall <fuselet source>, "
            "or conda install fuselet-jax."
        )
    running = _guard.running_jaxlib()
    fix = (
        f"install the fuselet-jax build for your jaxlib (conda install fuselet-jax), rebuild against it "
        f"(pip install --no-build-isolation --force-reinstall <fuselet source>), or {_install_hint(built)}"
    )
    _guard.enforce("jax", built, running, _guard.jax_mismatches(built, running), fix)
    _lib = ctypes.CDLL(str(where / LIBRARY_NAME))
    _register(bool(built.get("cuda_kernels")))
    return built


def _register(cuda_kernels: bool) -> None:
    """Registers every target of OPS: its CPU handler, and its CUDA handler in CUDA builds."""
    import jax

    for op, name in zip(OPS, TARGETS):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(_lib, f"fuselet_jax_{op}_cpu")), platform="cpu")
        if cuda_kernels:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(_lib, f"fuselet_jax_{op}_cuda")), platform="CUDA")


def cuda_targets(cuda_kernels: bool) -> bool:
    """Whether the CUDA handlers run here: CUDA kernels built and a GPU seen (initializes the backends)."""
    return cuda_kernels and _has_gpu()


@functools.cache
def _has_gpu() -> bool:
    import jax

    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def target(op: str) -> str:
    """The FFI target name of `op` ("rms_norm_fwd" -> "fuselet_rms_norm_fwd"), registered at import."""
    if op not in OPS:
        raise AssertionError(f"fuselet.jax: FFI op {op!r} is not in _load.OPS, so it was never registered")
    return f"fuselet_{op}"
