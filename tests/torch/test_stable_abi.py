"""The torch layer's two builds: exact ABI (ATen / c10, one torch minor) and LibTorch's stable ABI
(the C shim only, every torch >= its target). The rest of the torch tests run against whichever
build is imported; scripts/stable-abi-test.sh runs them against one stable build under two torch
releases, with FUSELET_EXPECT_TORCH_ABI=stable so that a silently imported exact build fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from fuselet import _core, _guard

from tests.conftest import import_layer

torch = pytest.importorskip("torch")
ft = import_layer("torch")
pytestmark = pytest.mark.smoke  # which build is loaded: part of every smoke run (tests/conftest.py)

STABLE = ft.BUILD_INFO["abi"] == "stable"
# A mangled C++ name of namespace c10, at or torch (c10::Error, at::Tensor, torch::Library, ...).
TORCH_CXX = re.compile(r"^_Z.*?(?:3c10|2at|5torch)\d")


def library():
    return _core.layer_dir("torch") / "libfuselet_torch.so"


def test_the_expected_build_is_loaded():
    assert ft.BUILD_INFO["abi"] in ("exact", "stable"), ft.BUILD_INFO
    expected = os.environ.get("FUSELET_EXPECT_TORCH_ABI")
    if expected:
        assert ft.BUILD_INFO["abi"] == expected, (library(), ft.BUILD_INFO)
    if STABLE:
        target = tuple(map(int, ft.BUILD_INFO["torch_target"].split(".")))
        assert tuple(map(int, torch.__version__.split(".")[:2])) >= target
    assert _guard.torch_mismatches(ft.BUILD_INFO, _guard.running_torch()) == []


def undefined_symbols() -> list[str]:
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the torch layer's symbols"
    out = subprocess.run([nm, "-D", "--undefined-only", str(library())], capture_output=True, text=True, check=True)
    return [line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()]


def needed_libraries() -> list[str]:
    out = subprocess.run(["readelf", "-d", str(library())], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout)


def test_only_the_stable_build_is_free_of_torch_cxx_symbols():
    """The stable build calls torch through the C shim alone (no C++ symbol of c10 / at / torch,
    no libc10 link), which is what lets it load into later torch releases; the exact build
    is full of them."""
    symbols = undefined_symbols()
    cxx = [s for s in symbols if TORCH_CXX.match(s)]
    shim = [s for s in symbols if s.startswith(("aoti_torch_", "torch_"))]
    if STABLE:
        assert cxx == [], cxx[:10]
        assert "aoti_torch_get_dim" in shim and any("library_impl" in s for s in shim), shim
        assert not any(n.startswith("libc10") for n in needed_libraries()), needed_libraries()
    else:
        assert len(cxx) > 10, symbols[:20]


def test_build_info_names_the_abi():
    out = subprocess.run([os.sys.executable, "-m", "fuselet"], capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("  torch: built against"))
    if STABLE:
        assert f"the stable ABI of torch >= {ft.BUILD_INFO['torch_target']}" in line, line
    else:
        assert "exact ABI" in line, line


def test_cpu_build_refuses_cuda_tensors_by_name():
    """A build without CUDA kernels in a CUDA torch (a stable CPU build loads there): the ops'
    CUDA kernels raise NotImplementedError naming the build. The CUDA dispatch key is reached
    by redispatching CPU tensors, as no GPU may be here."""
    if ft.BUILD_INFO["cuda_kernels"]:
        pytest.skip("this fuselet.torch has CUDA kernels: CUDA tensors run (tests/torch/*[cuda])")
    if not torch.version.cuda:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA tensor can reach the ops")
    cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    for op, args in [
        (torch.ops.fuselet.rms_norm_fwd.default, (torch.ones(2, 4), None, 1e-6)),
        (torch.ops.fuselet.softmax_bwd.default, (torch.ones(2, 4), torch.ones(2, 4), 1.0)),
    ]:
        with pytest.raises(NotImplementedError, match=r"this build has CPU kernels only \(.*\); CUDA tensors need"):
            op.redispatch(cuda, *args)


def test_stable_refusals_raise_the_exception_they_name():
    """The stable kernels head each refusal with its Python exception (csrc/torch/api.h), and the
    Python kernels over them raise that one with the rest of the message, whatever exception the
    running torch made of the C++ one; a failure without a head stays as it came."""
    from fuselet.torch import _errors

    class Kernel:  # a stable kernel as torch.library.get_kernel gives it
        def __init__(self, exc):
            self.exc = exc

        def call_boxed(self, keyset, *args, **kwargs):
            raise self.exc

    for head, kind in [("ValueError", ValueError), ("TypeError", TypeError), ("NotImplementedError", NotImplementedError)]:
        for came in (RuntimeError, ValueError):  # torch >= 2.15; pybind11's std::invalid_argument
            with pytest.raises(kind) as info:
                _errors._raising_as_tagged(Kernel(came(f"[fuselet {head}] x: expected one thing")))(None)
            assert type(info.value) is kind and str(info.value) == "x: expected one thing"
    failure = RuntimeError("fuselet (cuda error): out of memory")
    with pytest.raises(RuntimeError) as info:
        _errors._raising_as_tagged(Kernel(failure))(None)
    assert info.value is failure
    assert _errors.untag("[fuselet Warning] x") == (None, "[fuselet Warning] x")


def test_only_the_stable_build_has_python_kernels_over_its_own():
    """The CPU kernel a raw call runs: in the stable build, the Python one of
    python/fuselet/torch/_errors.py over the C++ one (still registered, inactive); in the exact
    build, the C++ one alone (c10's typed errors need no Python call)."""
    cpu = [line for line in torch._C._dispatch_dump("fuselet::rms_norm_fwd").splitlines() if line.startswith("CPU")]
    if STABLE:
        assert len(cpu) == 2 and "_errors.py" in cpu[0] and "norm.cpp" in cpu[1] and "inactive" in cpu[1], cpu
    else:
        assert len(cpu) == 1 and "norm.cpp" in cpu[0], cpu
