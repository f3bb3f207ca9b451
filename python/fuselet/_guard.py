"""Import-time ABI guard: compare what a framework layer was compiled against with the
framework it is being loaded into, and refuse with one clear ImportError on a mismatch.

A torch extension built for one minor release can load into another and run with silently
wrong struct layouts, so the check is done BEFORE the extension library is loaded.
Set FUSELET_SKIP_ABI_CHECK=1 to load anyway (a warning is still emitted).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

SKIP_ENV = "FUSELET_SKIP_ABI_CHECK"


class FuseletABIError(ImportError):
    """A fuselet framework layer does not match the framework it is imported into."""


def running_torch() -> dict:
    """The running torch's ABI facts (imports torch)."""
    import torch

    return {"version": torch.__version__, "cuda": torch.version.cuda, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI)}


def running_jaxlib() -> dict:
    """The running jaxlib's version and XLA FFI API version, read from its own headers."""
    import jax.ffi
    import jaxlib

    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
    text = header.read_text()
    api = [int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", text).group(1)) for part in ("MAJOR", "MINOR")]
    return {"jaxlib_version": jaxlib.__version__, "ffi_api": api}


def read_build_info(package_dir: Path) -> dict | None:
    """The provenance the build wrote next to a framework extension, or None if not built."""
    path = Path(package_dir) / "_build_info.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _flavor(cuda: str | None) -> str:
    return f"CUDA {cuda}" if cuda else "CPU"


def torch_mismatches(built: dict, running: dict) -> list[str]:
    """Differences that make a torch extension unsafe to load (empty list: compatible).

    built/running: {"version": "2.13.0+cpu", "cuda": None | "13.0", "cxx11_abi": bool}; built
    also has "abi": "exact" (the default) or "stable" with "torch_target": "2.12".
    An exact-ABI build: torch major.minor, CPU vs CUDA flavor, CUDA major and the C++11 ABI flag
    must match. A stable-ABI build: torch >= its target; with CUDA kernels, a CUDA torch of the
    same CUDA major (the library links libtorch_cuda); without, any flavor (CPU tensors only).
    """
    if is_stable(built):
        return _stable_torch_mismatches(built, running)
    problems = []
    if _minor(built["version"]) != _minor(running["version"]):
        problems.append(
            f"torch {'.'.join(map(str, _minor(built['version'])))} != {'.'.join(map(str, _minor(running['version'])))}"
        )
    if bool(built["cuda"]) != bool(running["cuda"]):
        problems.append(f"{_flavor(built['cuda'])} build != {_flavor(running['cuda'])} torch")
    elif built["cuda"] and built["cuda"].split(".")[0] != running["cuda"].split(".")[0]:
        problems.append(f"CUDA major {built['cuda'].split('.')[0]} != {running['cuda'].split('.')[0]}")
    if bool(built["cxx11_abi"]) != bool(running["cxx11_abi"]):
        problems.append(f"_GLIBCXX_USE_CXX11_ABI {int(built['cxx11_abi'])} != {int(running['cxx11_abi'])}")
    return problems


def is_stable(built: dict) -> bool:
    """A torch layer built on LibTorch's stable ABI (runs on every torch >= its target)."""
    return built.get("abi") == "stable"


def _stable_torch_mismatches(built: dict, running: dict) -> list[str]:
    problems = []
    target = built["torch_target"]
    if _minor(running["version"]) < _minor(target):
        problems.append(
            f"torch {'.'.join(map(str, _minor(running['version'])))} < {target}, the oldest torch this stable-ABI build runs on"
        )
    if built.get("cuda_kernels"):
        if not running["cuda"]:
            problems.append("a build with CUDA kernels (it links libtorch_cuda) != CPU torch")
        elif built["cuda"].split(".")[0] != running["cuda"].split(".")[0]:
            problems.append(f"CUDA major {built['cuda'].split('.')[0]} != {running['cuda'].split('.')[0]}")
    return problems


def jax_mismatches(built: dict, running: dict) -> list[str]:
    """built: {"ffi_api": [0, 2], "jaxlib_version": ...}; running: {"ffi_api": [0, 3], ...}.

    XLA accepts handlers of its own FFI API version or older within the same major.
    """
    b, r = tuple(built["ffi_api"]), tuple(running["ffi_api"])
    if b[0] != r[0] or b > r:
        return [
            f"XLA FFI API {b[0]}.{b[1]} (jaxlib {built['jaxlib_version']}) is newer than or "
            f"incompatible with {r[0]}.{r[1]} (jaxlib {running['jaxlib_version']})"
        ]
    return []


def enforce(layer: str, built: dict, running: dict, problems: list[str], fix: str) -> None:
    """Raise FuseletABIError for `problems` unless FUSELET_SKIP_ABI_CHECK=1 (then warn)."""
    if not problems:
        return
    message = (
        f"fuselet.{layer} was built against {describe(layer, built)} but found {describe(layer, running)} "
        f"({'; '.join(problems)}). Loading it could crash or compute garbage. Fix: {fix} "
        f"(to load it anyway, at your own risk: {SKIP_ENV}=1)."
    )
    if os.environ.get(SKIP_ENV) == "1":
        warnings.warn(message.replace("Loading it could", "Loading anyway; it could"), RuntimeWarning, stacklevel=3)
        return
    raise FuseletABIError(message)


def describe(layer: str, info: dict) -> str:
    if layer == "torch" and is_stable(info):
        return f"the stable ABI of torch >= {info['torch_target']} (built with torch {info['version']})"
    if layer == "torch":
        return f"torch {info['version']} ({_flavor(info['cuda'])}, cxx11_abi={int(bool(info['cxx11_abi']))})"
    api = ".".join(map(str, info["ffi_api"]))
    return f"jaxlib {info['jaxlib_version']} (XLA FFI API {api})"
