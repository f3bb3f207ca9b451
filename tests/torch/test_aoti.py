"""AOTInductor: a module of fuselet ops compiled and packaged here, loaded and run in a fresh
process (tests/torch/aoti_child.py) against eager, at a batch size other than the traced one.

The package calls fuselet's ops through AOTInductor's proxy executor, which finds them by name
in torch's operator registry: the loading process must have imported fuselet.torch (the C++ ops'
schemas and kernels, csrc/torch/registration.cpp; the python op fused_linear_cross_entropy_*
with its python kernel, so a python process). A C++ process without Python (tests/torch/
aoti_loader.cpp) gets the C++ ops by loading libfuselet_torch.so, but not the python op.
Needs a C++ compiler (the package is compiled)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")

pytestmark = [
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "c++")) is None, reason="AOTInductor compiles C++: no C++ compiler on PATH"
    ),
    pytest.mark.processes,  # the make test tier (tests/conftest.py)
]

ROOT = Path(__file__).resolve().parents[2]
S, H, HEADS, V = 4, 16, 2, 24


class Block(torch.nn.Module):
    """add_rms_norm -> rope -> causal softmax attention -> layer_norm -> swiglu / geglu, and
    the losses: cross_entropy and fused_linear_cross_entropy."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.norm = ft.RMSNorm(H)
        self.ln = ft.LayerNorm(H, bias=False)
        self.up = torch.nn.Parameter(torch.randn(2 * H, H, generator=g) / H**0.5)
        self.head = torch.nn.Parameter(torch.randn(V, H, generator=g) / H**0.5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5, generator=g)

    def forward(self, x, residual, cos, sin, target):
        h, residual = ft.add_rms_norm(x, residual, self.norm.weight)
        q = ft.rope(h.unflatten(-1, (HEADS, H // HEADS)), cos, sin).flatten(-2)
        a = ft.softmax(q @ q.transpose(-1, -2), scale=H**-0.5, causal=True) @ q
        h = ft.layer_norm(a + residual, self.ln.weight) + ft.rms_norm(a, None)
        u = h @ self.up.t()
        h = ft.swiglu(u) + ft.geglu(u, approximate="tanh")
        loss = ft.cross_entropy(h @ self.head.t(), target, label_smoothing=0.1, reduction="none")
        # The default chunk_size is decided inside the op: the exported batch dim stays dynamic.
        return h, loss, ft.fused_linear_cross_entropy(h, self.head, target, z_loss=1e-3)


def inputs(batch: int, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(S, H // HEADS, generator=g) * 6.0
    return (
        torch.randn(batch, S, H, generator=g),
        torch.randn(batch, S, H, generator=g),
        angles.cos(),
        angles.sin(),
        torch.randint(0, V, (batch, S), generator=g),
    )


def run_child(*args) -> subprocess.CompletedProcess:
    # the tree for tests.torch.aoti_child, after whatever PYTHONPATH brought fuselet from
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-m", "tests.torch.aoti_child", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """The Block, exported with a dynamic batch dim, compiled and packaged (one compile for the file)."""
    path = tmp_path_factory.mktemp("aoti") / "block.pt2"
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(Block().eval(), inputs(2), dynamic_shapes=({0: batch}, {0: batch}, None, None, {0: batch}))
    # The graph holds the fuselet ops themselves (extern kernels in the package), not a decomposition.
    called = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {
        "fuselet.add_rms_norm_fwd.default",
        "fuselet.rope_fwd.default",
        "fuselet.softmax_fwd.default",
        "fuselet.fused_linear_cross_entropy_reduced.default",
    } <= called, called
    return Path(torch._inductor.aoti_compile_and_package(ep, package_path=str(path)))


def test_package_runs_in_a_fresh_process(package, tmp_path):
    args = inputs(5, seed=1)  # traced with batch 2
    torch.save(args, tmp_path / "in.pt")
    done = run_child(package, tmp_path / "in.pt", tmp_path / "out.pt")
    assert done.returncode == 0, done.stderr[-4000:]
    got = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        expected = Block().eval()(*args)
    assert len(got) == len(expected) == 3
    for name, g, e in zip(("h", "loss", "fused_linear_loss"), got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def cpp_loader(tmp_path_factory) -> Path:
    """tests/torch/aoti_loader.cpp built against this torch (a few seconds: one header)."""
    from torch.utils import cpp_extension

    exe = tmp_path_factory.mktemp("loader") / "aoti_loader"
    cmd = [
        os.environ.get("CXX", "c++"),
        "-std=c++20",  # torch >= 2.14's headers need it
        "-O0",
        "-w",
        str(ROOT / "tests/torch/aoti_loader.cpp"),
        "-o",
        str(exe),
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        *(f"-L{p}" for p in cpp_extension.library_paths()),
        f"-Wl,-rpath,{cpp_extension.library_paths()[0]}",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-ldl",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return exe


def test_cpp_loader_without_python(package, cpp_loader):
    """A C++ process (no Python): the C++ ops resolve once libfuselet_torch.so is loaded; the
    python op fused_linear_cross_entropy_* cannot, and torch says so."""

    def load(*libraries):
        return subprocess.run(
            [str(cpp_loader), str(package), *map(str, libraries)],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )

    bare = load()
    assert bare.returncode == 1 and "Could not find schema for fuselet::add_rms_norm_fwd" in bare.stderr, bare.stderr
    with_ops = load(Path(ft.__file__).parent / "libfuselet_torch.so")
    assert with_ops.returncode == 1, with_ops.stdout
    first_line = with_ops.stderr.splitlines()[0]
    assert "fuselet::fused_linear_cross_entropy_reduced" in first_line, with_ops.stderr
    assert "cannot be run via AOTI without Python environment" in first_line, with_ops.stderr


def test_loading_without_fuselet_names_the_missing_op(package, tmp_path):
    """Without `import fuselet.torch` the loader cannot find the ops: torch's error names one."""
    torch.save(inputs(2), tmp_path / "in.pt")
    done = run_child(package, tmp_path / "in.pt", tmp_path / "out.pt", "--without-fuselet")
    assert done.returncode != 0
    assert "Could not find schema for fuselet::" in done.stderr, done.stderr[-4000:]
