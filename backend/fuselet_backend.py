"""PEP 517 backend of fuselet: scikit-build-core, plus build requirements that name the exact
framework versions to compile against.

With build isolation, pip builds in a fresh environment that has no torch or jax, and a
static `requires = ["torch"]` would put *some* torch there (not the user's: measured, a
2.14.1 CUDA build instead of the 2.13 CPU one in the target env), so the extension would be
compiled against the wrong ABI. Here the framework versions come from the environment:

    FUSELET_FRAMEWORK=torch FUSELET_TORCH_VERSION=2.13.0 pip install .
    FUSELET_FRAMEWORK=jax   FUSELET_JAX_VERSION=0.10.2  pip install .

A framework requested without a version in an isolated build fails at once and says both
fixes. Without isolation (`pip install --no-build-isolation .`) the installed frameworks are
used as they are and nothing is added.

FUSELET_TORCH_ABI=stable builds the torch layer on LibTorch's stable ABI, which runs on every torch
>= FUSELET_TORCH_TARGET (2.12): there any such torch will do, so an isolated build without a
version asks for `torch>=2.12`, and the wheel requires `torch>=2.12` with no upper bound.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from scikit_build_core import build as _skbuild
from scikit_build_core.build import (  # noqa: F401  (the PEP 517 hooks re-exported as they are)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

VERSION_ENV = {"torch": "FUSELET_TORCH_VERSION", "jax": "FUSELET_JAX_VERSION"}
PACKAGES = {"torch": ["torch=={v}"], "jax": ["jax=={v}", "jaxlib=={v}"]}


class FrameworkRequirementError(RuntimeError):
    pass


def stable_torch_target(environ=os.environ) -> str | None:
    """The oldest torch of a stable-ABI torch layer (FUSELET_TORCH_ABI=stable), else None."""
    abi = environ.get("FUSELET_TORCH_ABI", "exact")
    if abi not in ("exact", "stable"):
        raise FrameworkRequirementError(f"FUSELET_TORCH_ABI must be exact or stable; got {abi!r}")
    return environ.get("FUSELET_TORCH_TARGET", "2.12") if abi == "stable" else None


def requested_frameworks(framework: str) -> list[str]:
    if framework not in ("auto", "torch", "jax", "all", "none"):
        raise FrameworkRequirementError(f"FUSELET_FRAMEWORK must be one of auto, torch, jax, all, none; got {framework!r}")
    if framework == "all":
        return ["torch", "jax"]
    if framework == "auto":
        # auto: the frameworks given a version, plus those already importable here.
        return [f for f in ("torch", "jax") if os.environ.get(VERSION_ENV[f]) or importlib.util.find_spec(f)]
    return [] if framework == "none" else [framework]


def framework_requirements(environ=os.environ) -> list[str]:
    """Extra build requirements: the exact framework versions to compile against."""
    reqs = []
    for fw in requested_frameworks(environ.get("FUSELET_FRAMEWORK", "auto")):
        version = environ.get(VERSION_ENV[fw])
        if version:
            reqs += [p.format(v=version) for p in PACKAGES[fw]]
        elif fw == "torch" and stable_torch_target(environ) and importlib.util.find_spec(fw) is None:
            reqs.append(f"torch>={stable_torch_target(environ)}")  # any torch the stable ABI covers
        elif importlib.util.find_spec(fw) is None:
            raise FrameworkRequirementError(
                f"fuselet: FUSELET_FRAMEWORK asks for the {fw} extension, but the build environment "
                f"({sys.executable}) has no {fw} and no version was given, so the extension would be "
                f"compiled against whatever {fw} pip picks, not yours. Fix either way:\n"
                f"  1. build against the {fw} you have installed:  pip install --no-build-isolation .\n"
                f"  2. name the version to build against:         {VERSION_ENV[fw]}=<version> pip install ."
            )
    return reqs


def get_requires_for_build_wheel(config_settings=None):
    return _skbuild.get_requires_for_build_wheel(config_settings) + framework_requirements()


def get_requires_for_build_editable(config_settings=None):
    return _skbuild.get_requires_for_build_editable(config_settings) + framework_requirements()


# --- the wheel's Requires-Dist: the framework it was compiled against -------------------------
# scikit-build-core calls dynamic_metadata() ([tool.scikit-build.metadata.dependencies] in
# pyproject.toml) in the build environment, the one CMake compiles in: a torch 2.13 build
# requires torch>=2.13,<2.14 and a jax build jaxlib >= the oldest release of the XLA FFI level it
# was compiled against, so pip keeps them together and `pip check` names a mismatch.

# The first jaxlib release of each XLA FFI API level (read from xla/ffi/api/c_api.h of the PyPI
# wheels; variants/conda-forge-snapshot.yaml lists the releases). An unknown level falls back to
# the jaxlib release compiled against.
FFI_LEVEL_FIRST_JAXLIB = {(0, 2): "0.8.1", (0, 3): "0.9.1"}


def built_frameworks(environ=os.environ) -> list[str]:
    """The extensions CMake builds here (fuselet_select_frameworks): FUSELET_FRAMEWORK's, where
    "auto" means each framework the build environment can import."""
    framework = environ.get("FUSELET_FRAMEWORK", "auto")
    if framework == "auto":
        return [f for f in ("torch", "jax") if importlib.util.find_spec(f)]
    return requested_frameworks(framework)


def jaxlib_ffi_level(jaxlib_dir) -> tuple[int, int]:
    """(major, minor) of the XLA FFI API in the headers of the jaxlib installed at `jaxlib_dir`."""
    import re
    from pathlib import Path

    text = (Path(jaxlib_dir) / "include" / "xla" / "ffi" / "api" / "c_api.h").read_text()
    return tuple(int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", text).group(1)) for part in ("MAJOR", "MINOR"))


def framework_dependencies(environ=os.environ) -> list[str]:
    """Requires-Dist of the wheel built here: one requirement per framework extension."""
    import importlib.metadata
    import re

    deps = []
    for fw in built_frameworks(environ):
        if fw == "torch" and stable_torch_target(environ):
            deps.append(f"torch>={stable_torch_target(environ)}")
        elif fw == "torch":
            major, minor = map(int, re.match(r"(\d+)\.(\d+)", importlib.metadata.version("torch")).groups())
            deps.append(f"torch>={major}.{minor},<{major}.{minor + 1}")
        else:
            release = re.match(r"\d+\.\d+\.\d+", importlib.metadata.version("jaxlib")).group(0)
            level = jaxlib_ffi_level(importlib.util.find_spec("jaxlib").submodule_search_locations[0])
            deps.append(f"jaxlib>={FFI_LEVEL_FIRST_JAXLIB.get(level, release)}")
    return deps


def dynamic_metadata(field, settings=None, project=None):
    """scikit-build-core's metadata provider hook."""
    if field != "dependencies":
        raise ValueError(f"fuselet_backend provides the `dependencies` field only, not {field!r}")
    return framework_dependencies()
