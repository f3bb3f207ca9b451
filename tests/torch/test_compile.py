"""torch.compile with dynamic shapes and symbolic floats: no fuselet op or module breaks a graph
or recompiles once the shapes vary.

Each case is compiled with a frame-counting backend over aot_eager (the autograd graph is traced,
the kernels run as themselves); the batch and sequence sizes change from call to call.
dynamic=True: one frame for every shape; dynamic=None (torch's default): the second shape makes
the frame dynamic, and no shape after it compiles again. Forward and gradients match eager.
"""

from __future__ import annotations

import math

import pytest

from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")

from torch._dynamo.backends.registry import lookup_backend  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._guards import CompileContext  # noqa: E402

H, V = 16, 40
# (batch, seq) of the successive calls; none is 0 or 1, which torch specializes on, and no
# size of one call equals another dim of it by chance (torch's duck sizing would guard on that).
SIZES = [(2, 8), (3, 12), (2, 20), (4, 6)]


class Attention(torch.nn.Module):
    """nanoGPT's scores: the scale is 1/sqrt(head dim), a symbolic float under dynamic shapes."""

    def __init__(self, causal=True):
        super().__init__()
        self.causal = causal

    def forward(self, q, k):
        return ft.softmax(q @ k.transpose(-1, -2), scale=1 / math.sqrt(k.size(-1)), causal=self.causal)


class ScaledSoftmax(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ft.softmax(x, self.scale)


class Loss(torch.nn.Module):
    """Float options kept as module attributes, as training code keeps them."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, logits, target):
        return ft.cross_entropy(logits, target, **self.options)


class LinearLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, hidden, target):
        return ft.fused_linear_cross_entropy(hidden, self.head.weight, target, label_smoothing=0.1, z_loss=1e-4)


class Frames:
    """A backend that counts the frames compiled (a frame's restarted analysis is not a new one)."""

    def __init__(self, backend):
        self.backend, self.compiled = lookup_backend(backend), set()

    @property
    def frame_count(self):
        return len(self.compiled)

    def __call__(self, gm, example_inputs):
        compile_id = CompileContext.current_compile_id()
        self.compiled.add((compile_id.frame_id, compile_id.frame_compile_id))
        return self.backend(gm, example_inputs)


def rope_tables(seq, rotary=6):
    angle = torch.arange(seq, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, rotary)
    return angle.cos(), angle.sin()


def hidden(b, s, width=H):
    return torch.randn(b, s, width, requires_grad=True)


def target(b, s):
    t = torch.randint(0, V, (b, s))
    t[0, 0] = -100
    return t


# name -> (callable or module, inputs for (batch, seq)); outputs are tensors or tuples of them.
CASES = {
    "rms_norm": (lambda x: ft.rms_norm(x, None, 1e-5), lambda b, s: [hidden(b, s)]),
    "RMSNorm": (ft.RMSNorm(H), lambda b, s: [hidden(b, s)]),
    "RMSNorm zero_centered": (ft.RMSNorm(H, zero_centered_gamma=True), lambda b, s: [hidden(b, s)]),
    "LayerNorm": (ft.LayerNorm(H), lambda b, s: [hidden(b, s)]),
    "layer_norm no bias": (ft.LayerNorm(H, bias=False), lambda b, s: [hidden(b, s)]),
    "add_rms_norm": (
        lambda x, r, w: ft.add_rms_norm(x, r, w, 1e-6),
        lambda b, s: [hidden(b, s), hidden(b, s), torch.ones(H, requires_grad=True)],
    ),
    "swiglu": (ft.swiglu, lambda b, s: [hidden(b, s, 2 * H)]),
    "geglu tanh": (lambda x: ft.geglu(x, approximate="tanh"), lambda b, s: [hidden(b, s, 2 * H)]),
    "clamped_swiglu": (lambda x: ft.clamped_swiglu(x, limit=1.0, interleaved=True), lambda b, s: [hidden(b, s, 2 * H)]),
    "softmax attention": (Attention(), lambda b, s: [hidden(b, s), hidden(b, s)]),
    "softmax scale attribute": (ScaledSoftmax(0.125), lambda b, s: [hidden(b, s, s)]),
    "rope": (
        lambda x, cos, sin: ft.rope(x, cos, sin),
        lambda b, s: [torch.randn(b, s, 5, H, requires_grad=True), *rope_tables(s)],
    ),
    "rope bhsd interleaved": (
        lambda x, cos, sin: ft.rope(x, cos, sin, layout="bhsd", interleaved=True),
        lambda b, s: [torch.randn(b, 5, s, H, requires_grad=True), *rope_tables(s)],
    ),
    "cross_entropy": (Loss(label_smoothing=0.1, z_loss=1e-4, softcap=30.0), lambda b, s: [hidden(b, s, V), target(b, s)]),
    "cross_entropy sum inplace": (Loss(reduction="sum", inplace_backward=True), lambda b, s: [hidden(b, s, V), target(b, s)]),
    "cross_entropy none": (Loss(reduction="none"), lambda b, s: [hidden(b, s, V), target(b, s)]),
    "fused_linear_cross_entropy": (LinearLoss(), lambda b, s: [hidden(b, s), target(b, s)]),
}


def leaves(fn, inputs):
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    return [t for t in inputs if t.requires_grad] + params


def step(fn, inputs):
    """Outputs and the gradients of every input and parameter, from one backward of their sum."""
    for t in leaves(fn, inputs):
        t.grad = None
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.float().sum() for o in outs).backward()
    return [o.detach() for o in outs] + [t.grad for t in leaves(fn, inputs)]


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("name", list(CASES))
def test_no_graph_break_no_recompile(name, dynamic):
    fn, make = CASES[name]
    torch._dynamo.reset()
    counters.clear()
    backend = Frames("aot_eager")
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    frames = []
    for i, (b, s) in enumerate(SIZES):
        torch.manual_seed(i)
        inputs = make(b, s)
        # Inputs the in-place backward overwrites are cloned per run.
        got = step(compiled, [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs])
        want = step(fn, inputs)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        frames.append(backend.frame_count)
    assert dict(counters["graph_break"]) == {}, f"{name}: graph breaks {dict(counters['graph_break'])}"
    # dynamic=True: one frame for every size; automatic: a second one at the second size, no more.
    expected = [1] * len(SIZES) if dynamic else [1] + [2] * (len(SIZES) - 1)
    assert frames == expected, f"{name}: frames compiled after each size {frames}, expected {expected}"


def test_block_inductor_fullgraph_dynamic():
    """A pre-norm block (attention scores, RoPE, SwiGLU MLP, loss) through Inductor with
    fullgraph=True and dynamic=True: one graph for all sizes, equal to eager."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.attn = ft.RMSNorm(H), Attention()
            self.up, self.down = torch.nn.Linear(H, 4 * H), torch.nn.Linear(2 * H, H)
            self.head = torch.nn.Linear(H, V, bias=False)

        def forward(self, x, cos, sin, labels):
            h = self.norm(x)
            q = ft.rope(h.unflatten(-1, (2, H // 2)), cos, sin).flatten(-2)
            x = x + self.attn(q, h) @ h
            y, x = ft.add_rms_norm(self.down(ft.swiglu(self.up(x))), x, self.norm.weight)
            return ft.cross_entropy(self.head(y), labels)

    torch.manual_seed(0)
    block = Block()
    backend = Frames("inductor")
    compiled = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)
    for b, s in SIZES[:3]:
        cos, sin = rope_tables(s)
        inputs = [hidden(b, s), cos, sin, target(b, s)]
        got = step(compiled, [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs])
        want = step(block, inputs)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert backend.frame_count == 1
