"""Locate and load libfuselet, the framework-free core, with ctypes (no framework needed)."""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _prefixes() -> list[str]:
    """The environment prefixes a conda install puts fuselet's libraries under."""
    return [p for p in dict.fromkeys([sys.prefix, os.environ.get("CONDA_PREFIX", "")]) if p]


def library_candidates() -> list[Path]:
    """Where libfuselet may live: inside this package (pip wheels), else the env's lib dir (conda)."""
    found = [_HERE / "lib" / "libfuselet.so"]
    for prefix in _prefixes():
        found += [Path(p) for p in sorted(glob.glob(os.path.join(prefix, "lib", "libfuselet.so*")))]
    return found


def layer_candidates(layer: str) -> list[Path]:
    """Where the library of a framework layer ("torch", "jax") and its _build_info.json may
    live: inside this package (a pip wheel: fuselet/<layer>/), else the environment's
    lib/fuselet/<layer>/ (the conda packages fuselet-torch and fuselet-jax, which hold no Python
    and so serve every Python of the environment)."""
    return [_HERE / layer] + [Path(prefix) / "lib" / "fuselet" / layer for prefix in _prefixes()]


def conda_environment() -> bool:
    """Whether this Python is a conda environment's (it has conda-meta/): there, a missing framework
    layer comes with its conda package (fuselet-torch, fuselet-jax), which brings the framework."""
    return (Path(sys.prefix) / "conda-meta").is_dir()


def missing_layer_hint(layer: str, pip_hint: str) -> str:
    """The fix for a framework layer with no built library here: its conda package in a conda
    environment, else `pip_hint`."""
    package = f"fuselet-{layer}"
    if conda_environment():
        return f"conda install {package} (the fuselet build for your {layer}: it brings {layer} with it)"
    return pip_hint


def layer_dir(layer: str) -> Path | None:
    """The first of layer_candidates() that holds a built layer (its _build_info.json), or None."""
    return next((d for d in layer_candidates(layer) if (d / "_build_info.json").is_file()), None)


@functools.cache
def load() -> ctypes.CDLL:
    """The loaded libfuselet; ImportError naming every place looked at if there is none."""
    tried = library_candidates()
    for path in tried:
        if path.exists():
            lib = ctypes.CDLL(str(path))
            lib.fuselet_version.restype = ctypes.c_char_p
            lib.fuselet_cuda_archs.restype = ctypes.c_char_p
            lib.fuselet_cpu_isa.restype = ctypes.c_char_p
            lib.fuselet_last_error.restype = ctypes.c_char_p
            lib._fuselet_path = str(path)
            return lib
    raise ImportError(
        "fuselet: libfuselet (the core library) was not found; looked at: "
        + ", ".join(str(p) for p in tried)
        + ". Reinstall fuselet (pip install --no-build-isolation --force-reinstall . in a source tree, "
        "or conda install libfuselet)."
    )


def core_info() -> dict:
    """Facts read from the loaded core itself (version, CUDA kernels, threads, CPU ISA)."""
    lib = load()
    isa = lib.fuselet_cpu_isa()
    return {
        "path": lib._fuselet_path,
        "version": lib.fuselet_version().decode(),
        "cuda_kernels": bool(lib.fuselet_has_cuda()),
        "cuda_archs": lib.fuselet_cuda_archs().decode() or None,
        "num_threads": int(lib.fuselet_get_num_threads()),
        "cpu_isa": isa.decode() if isa else "ERROR: " + lib.fuselet_last_error().decode(),
    }


def norm_bwd_workspace_bytes_cuda(rows: int, hidden: int) -> int:
    """fuselet_norm_bwd_workspace_bytes_cuda: device workspace of the CUDA norm backward."""
    fn = load().fuselet_norm_bwd_workspace_bytes_cuda
    fn.restype, fn.argtypes = ctypes.c_size_t, [ctypes.c_int64, ctypes.c_int64]
    return int(fn(rows, hidden))
