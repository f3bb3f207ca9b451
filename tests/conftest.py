"""Shared parameters and fixtures of the fuselet Python tests.

Parametrized fixtures (request them by name):
  dtype  - "float32", "float16", "bfloat16"
  shape  - x shapes [..., H]: H in (1, 3, 127, 4096, 4097), many rows, 3-D, 1-D
  norm   - "rms_norm", "layer_norm"
  torch_device / jax_device - "cpu" and "cuda"; the CUDA variants carry the `cuda` marker
           and SKIP (with the reason) where no CUDA GPU is visible to that framework.
  layer  - ("torch" | "jax", the imported fuselet.<framework>) for framework-agnostic tests.
  cpu_isa - "baseline", "avx2", "avx512": the CPU kernels run with that instruction set for
           the test (fuselet_set_cpu_isa); ISAs this CPU lacks SKIP, and so does every ISA but
           the default one in CUDA variants (torch_device / jax_device "cuda").

A framework's tests are skipped only when the framework itself is not installed; if it
is installed and fuselet.<framework> fails to import, the tests fail.
"""

from __future__ import annotations

import ctypes
import importlib

import pytest

from tests.reference import DTYPE_NAMES

DTYPES = DTYPE_NAMES
SHAPES = [(4, 1), (5, 3), (8, 127), (512, 127), (2, 4096), (3, 4097), (2, 3, 127), (127,)]
NORMS = ("rms_norm", "layer_norm")
CPU_ISAS = ("baseline", "avx2", "avx512")
FRAMEWORKS = ("torch", "jax")


# The test tiers (docs/development.md): `make check` runs every test but those marked processes or
# builds; `make test` runs them too. The smoke, one place for both of its users (the stable-ABI
# run under each torch release, scripts/stable-abi-test.sh, and the layers under the sanitizers,
# scripts/sanitize.sh): every op's schema (opcheck), numerics against the reference, bad input,
# torch.compile, in both layers: the tests named here, in every file, and tests/bad_input/ and
# tests/torch/test_stable_abi.py whole.
SMOKE_TESTS = (
    "test_opcheck",
    "test_forward",
    "test_forward_backward",
    "test_against_reference",
    "test_torch_compile_fullgraph",
    "test_bad_input",
    "test_jit",
    "test_vmap_and_vmap_of_grad",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU; skipped (with the reason) where there is none")
    config.addinivalue_line("markers", "slow: seeds or builds conda packages (minutes when cold)")
    config.addinivalue_line(
        "markers", "processes: starts processes that run fuselet (distributed, multi-process, across processes): make test"
    )
    config.addinivalue_line("markers", "builds: runs a pip or CMake build of fuselet: make test")
    config.addinivalue_line(
        "markers", "smoke: each op once: schema, numerics, bad input, compile (tests/conftest.py SMOKE_TESTS)"
    )
    # torch.library.opcheck still uses torch.jit internally.
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def import_layer(framework: str):
    """fuselet.<framework>; skips only if <framework> itself is not installed."""
    pytest.importorskip(
        framework, reason=f"{framework} is not installed in this environment; fuselet.{framework} cannot be tested here"
    )
    return importlib.import_module(f"fuselet.{framework}")  # installed framework: errors fail the test


@pytest.fixture(params=DTYPES)
def dtype(request) -> str:
    return request.param


@pytest.fixture(params=SHAPES, ids=lambda s: "x".join(map(str, s)))
def shape(request) -> tuple:
    return request.param


@pytest.fixture(params=NORMS)
def norm(request) -> str:
    return request.param


@pytest.fixture(params=FRAMEWORKS)
def layer(request):
    return request.param, import_layer(request.param)


CUDA_PARAMS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(params=CUDA_PARAMS)
def torch_device(request) -> str:
    """ "cpu", or "cuda" where torch sees a GPU and fuselet.torch has CUDA kernels."""
    if request.param == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU: torch.cuda.is_available() is False")
        if not import_layer("torch").BUILD_INFO.get("cuda_kernels"):
            pytest.skip("fuselet.torch was built without CUDA kernels (FUSELET_CUDA=OFF)")
    return request.param


@pytest.fixture(params=CUDA_PARAMS)
def jax_device(request):
    """A jax.Device: the CPU, or the first GPU where jax has one and fuselet.jax has CUDA kernels."""
    jax = pytest.importorskip("jax")
    if request.param == "cpu":
        return jax.devices("cpu")[0]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("no CUDA GPU: jax.devices('gpu') is empty")
    if not import_layer("jax").BUILD_INFO.get("cuda_kernels"):
        pytest.skip("fuselet.jax was built without CUDA kernels (FUSELET_CUDA=OFF)")
    return gpus[0]


@pytest.fixture(params=CPU_ISAS)
def cpu_isa(request):
    """Runs the test with the CPU kernels built for one ISA, then returns to the default."""
    from fuselet import _core

    lib = _core.load()
    lib.fuselet_set_cpu_isa.argtypes = [ctypes.c_char_p]
    default = lib.fuselet_cpu_isa().decode()
    params = getattr(request.node, "callspec", None)
    devices = {params.params.get(k) for k in ("torch_device", "jax_device")} if params else set()
    if "cuda" in devices and request.param != default:
        pytest.skip("the CPU instruction set does not apply to the CUDA kernels")
    if lib.fuselet_set_cpu_isa(request.param.encode()) != 0:
        pytest.skip(f"this CPU lacks {request.param}: {lib.fuselet_last_error().decode()}")
    try:
        yield request.param
    finally:
        lib.fuselet_set_cpu_isa(None)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.originalname in SMOKE_TESTS or item.name in SMOKE_TESTS:
            item.add_marker("smoke")
