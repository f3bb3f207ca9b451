"""Load the fuselet torch op library, after checking it matches the running torch."""

from __future__ import annotations

import sys

from fuselet import _core, _guard
from fuselet.torch import _errors

LIBRARY_NAME = "libfuselet_torch.so"


def _install_hint(built: dict | None) -> str:
    if built is None:
        return _core.missing_layer_hint("torch", "pip install torch")
    if _guard.is_stable(built):
        flavor = f" (a CUDA {built['cuda'].split('.')[0]} build)" if built.get("cuda_kernels") else ""
        return f"pip install 'torch>={built['torch_target']}'{flavor}"
    version = built["version"].split("+")[0]
    flavor = f"cuda{built['cuda'].replace('.', '')}" if built["cuda"] else "cpu"
    return (
        f"pip install torch=={version} (the {flavor} build), or with conda: "
        f"conda install fuselet-torch, which brings the matching pytorch"
    )


def import_torch(built: dict | None):
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            f"fuselet.torch needs PyTorch, which cannot be imported in this environment "
            f"({sys.executable}): {exc}. Fix: {_install_hint(built)}."
        ) from exc
    return torch


def load() -> dict:
    """Check and load the op library; returns its build info."""
    where = _core.layer_dir("torch")
    built = _guard.read_build_info(where) if where else None
    torch = import_torch(built)
    if built is None or not (where / LIBRARY_NAME).exists():
        raise ImportError(
            "fuselet.torch: this fuselet was built without its PyTorch extension (looked in "
            + ", ".join(map(str, _core.layer_candidates("torch")))
            + "). Fix: "
            "FUSELET_FRAMEWORK=torch pip install --no-build-isolation --force-reinstall <fuselet source>, "
            "or conda install fuselet-torch."
        )
    fix = (
        f"install the fuselet-torch build for your torch (conda install fuselet-torch), or rebuild "
        f"against it: pip install --no-build-isolation --force-reinstall <fuselet source>; "
        f"or go back to the torch it was built for: {_install_hint(built)}"
    )
    running = _guard.running_torch()
    if _guard.is_stable(built):
        fix = f"install a torch this build runs on: {_install_hint(built)}, or conda install fuselet-torch"
    _guard.enforce("torch", built, running, _guard.torch_mismatches(built, running), fix)
    torch.ops.load_library(str(where / LIBRARY_NAME))
    if _guard.is_stable(built):  # its refusals as ValueError / TypeError under any torch
        _errors.install(torch, ("CPU", "CUDA") if built.get("cuda_kernels") else ("CPU",))
    if not built.get("cuda_kernels") and torch.version.cuda:
        _refuse_cuda_tensors(torch, built)
    return built


_NO_CUDA = None  # the torch.library.Library of the CUDA refusals (kept alive)


def _refuse_cuda_tensors(torch, built: dict) -> None:
    """A build without CUDA kernels under a CUDA torch (a stable-ABI CPU build loads there):
    every op refuses CUDA tensors with NotImplementedError naming the build, not the
    dispatcher's "Could not run ... 'CUDA' backend"."""
    global _NO_CUDA
    _NO_CUDA = torch.library.Library("fuselet", "IMPL")
    message = (
        f"fuselet.torch: this build has CPU kernels only ({_guard.describe('torch', built)}); "
        f"CUDA tensors need a fuselet-torch built with CUDA kernels (FUSELET_CUDA=ON, or the conda "
        f"package of your CUDA flavor)"
    )

    def refuse(*args, **kwargs):
        raise NotImplementedError(message)

    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("fuselet::"):
            _NO_CUDA.impl(name.removeprefix("fuselet::"), refuse, "CUDA")
