"""Load the fuselet XLA FFI library and register its targets with JAX on first use.

Registration is lazy: registering custom-call targets before JAX has initialized its
backends can break the CPU backend of the whole process, so targets are registered the
first time an op is traced, after jax.devices() has run.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading

from fuselet import _core, _guard

LIBRARY_NAME = "libfuselet_jax.so"
_lock = threading.Lock()
_registered: set[str] = set()
_lib = None


def _install_hint(built: dict | None) -> str:
    if built is None:
        return "pip install jax"
    return (f"pip install 'jax[cpu]=={built['jaxlib_version']}' (any jaxlib whose XLA FFI API is "
            f"{'.'.join(map(str, built['ffi_api']))} or newer works), or with conda: conda install fuselet-jax")


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
            + ", ".join(map(str, _core.layer_candidates("jax"))) + "). Fix: "
            "FUSELET_FRAMEWORK=jax pip install --no-build-isolation --force-reinstall <fuselet source>, "
            "or conda install fuselet-jax."
        )
    running = _guard.running_jaxlib()
    fix = (f"install the fuselet-jax build for your jaxlib (conda install fuselet-jax), rebuild against it "
           f"(pip install --no-build-isolation --force-reinstall <fuselet source>), or {_install_hint(built)}")
    _guard.enforce("jax", built, running, _guard.jax_mismatches(built, running), fix)
    _lib = ctypes.CDLL(str(where / LIBRARY_NAME))
    return built


def cuda_targets(cuda_kernels: bool) -> bool:
    """Whether the CUDA handlers are (or will be) registered: CUDA kernels built and a GPU seen."""
    return cuda_kernels and _has_gpu()


@functools.cache
def _has_gpu() -> bool:
    import jax

    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def target(op: str, cuda_kernels: bool) -> str:
    """The FFI target name of `op` ("rms_norm_fwd" -> "fuselet_rms_norm_fwd"), registered."""
    name = f"fuselet_{op}"
    if name in _registered:
        return name
    with _lock:
        if name not in _registered:
            import jax

            jax.devices()  # initialize the backends before the first registration
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(_lib, f"fuselet_jax_{op}_cpu")),
                                        platform="cpu")
            if cuda_targets(cuda_kernels):
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(_lib, f"fuselet_jax_{op}_cuda")),
                                            platform="CUDA")
            _registered.add(name)
    return name
