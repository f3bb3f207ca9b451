"""fuselet.torch rope against the float64 reference (tests/reference.py) and transformers."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
ops = torch.ops.fuselet

B, S, N, D = 2, 5, 3, 16


def x_shape(layout, b=B, s=S, n=N, d=D) -> tuple:
    inner = (s, n) if layout == "bshd" else (n, s)
    return ((b,) if b is not None else ()) + inner + (d,)


def tensors(shape, dtype, rotary, table_shape, table_dtype, device="cpu", seed=0) -> dict:
    """x (requiring grad), dy in `dtype`; cos, sin of `table_shape` + (rotary,): arbitrary values
    (not a real frequency table, not duplicated halves), in `table_dtype` ("x": x's)."""
    rng = np.random.default_rng(seed)
    tdt = getattr(torch, dtype if table_dtype == "x" else table_dtype)

    def t(a, dt):
        return torch.from_numpy(np.asarray(a, np.float32)).to(device=device, dtype=dt)

    return {
        "x": t(rng.standard_normal(shape) * 2 + 0.3, getattr(torch, dtype)).requires_grad_(True),
        "dy": t(rng.standard_normal(shape), getattr(torch, dtype)),
        "cos": t(rng.uniform(-1.5, 1.5, (*table_shape, rotary)), tdt),
        "sin": t(rng.uniform(-1.5, 1.5, (*table_shape, rotary)), tdt),
    }


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def check(t, dtype, layout, interleaved):
    x, dy, cos, sin = t["x"], t["dy"], t["cos"], t["sin"]
    y = ft.rope(x, cos, sin, layout=layout, interleaved=interleaved)
    assert y.dtype == x.dtype and y.shape == x.shape and y.device == x.device
    bhsd = layout == "bhsd"
    ref.assert_close(f64(y), ref.rope_fwd(f64(x), f64(cos), f64(sin), bhsd, interleaved), dtype, name="y")
    r = cos.shape[-1]
    assert torch.equal(y[..., r:], x[..., r:].detach()), "features R..D-1 pass through unchanged"
    (dx,) = torch.autograd.grad(y, (x,), dy)
    assert dx.dtype == x.dtype and dx.shape == x.shape
    ref.assert_close(f64(dx), ref.rope_bwd(f64(dy), f64(cos), f64(sin), bhsd, interleaved), dtype, name="dx")


@pytest.mark.parametrize("table_dtype", ["float32", "x"])
@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("rotary", [D, 10], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_forward_backward(dtype, layout, interleaved, rotary, tables, table_dtype, torch_device):
    table_shape = (S,) if tables == "shared" else (B, S)
    t = tensors(x_shape(layout), dtype, rotary, table_shape, table_dtype, torch_device)
    check(t, dtype, layout, interleaved)


@pytest.mark.parametrize("shape", [(1, 7, 2, 128), (3, 33, 4, 64), (2, 4, 1, 2)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_shapes(dtype, shape, layout, torch_device):
    """Head dims of the vectorised CUDA path (64, 128) and the smallest one (D = R = 2)."""
    b, s, n, d = shape
    t = tensors(x_shape(layout, b, s, n, d), dtype, d // 2 if d > 2 else 2, (b, s), "x", torch_device, seed=1)
    check(t, dtype, layout, True)
    check(tensors(x_shape(layout, b, s, n, d), dtype, d, (s,), "float32", torch_device, seed=2), dtype, layout, False)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_no_batch_dim(dtype, layout, interleaved, torch_device):
    t = tensors(x_shape(layout, None), dtype, 12, (S,), "float32", torch_device)
    check(t, dtype, layout, interleaved)


@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("empty", ["B=0", "S=0", "N=0"])
def test_empty(empty, tables, torch_device):
    b, s, n = (0 if empty == "B=0" else B), (0 if empty == "S=0" else S), (0 if empty == "N=0" else N)
    for layout in ("bshd", "bhsd"):
        t = tensors(x_shape(layout, b, s, n), "float32", 8, (s,) if tables == "shared" else (b, s), "x", torch_device)
        y = ft.rope(t["x"], t["cos"], t["sin"], layout=layout)
        assert y.shape == t["x"].shape
        (dx,) = torch.autograd.grad(y, (t["x"],), t["dy"])
        assert dx.shape == t["x"].shape


def test_transposed_bhsd_is_read_in_place(torch_device):
    """transformers' q: q_proj(h).view(B, S, N, D).transpose(1, 2), a non-contiguous [B, N, S, D]."""
    torch.manual_seed(0)
    h = torch.randn(B, S, 24, device=torch_device)
    proj = torch.nn.Linear(24, N * D, device=torch_device)
    q = proj(h).view(B, S, N, D).transpose(1, 2)
    assert not q.is_contiguous() and q.stride(-1) == 1
    cos, sin = torch.randn(S, D, device=torch_device), torch.randn(S, D, device=torch_device)
    y = ft.rope(q, cos, sin, layout="bhsd")
    ref.assert_close(f64(y), ref.rope_fwd(f64(q), f64(cos), f64(sin), True), "float32", name="y")
    # The same values, contiguous: the same bits.
    assert torch.equal(y, ft.rope(q.contiguous(), cos, sin, layout="bhsd"))
    dy = torch.randn(B, N, S, D, device=torch_device).transpose(2, 3).contiguous().transpose(2, 3)  # strided dy
    (dw,) = torch.autograd.grad(y, (proj.weight,), dy)
    q2 = proj(h).view(B, S, N, D).transpose(1, 2)
    (dw2,) = torch.autograd.grad(ft.rope(q2.contiguous(), cos, sin, layout="bhsd"), (proj.weight,), dy.contiguous())
    torch.testing.assert_close(dw, dw2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("view", ["every_other_head", "strided_last", "sliced_tables"])
def test_other_views(view):
    base = tensors((B, S, 2 * N, D), "float32", 8, (B, 2 * S), "float32")
    x, cos, sin = base["x"].detach(), base["cos"], base["sin"]
    if view == "every_other_head":
        x = x[:, :, ::2]
    elif view == "strided_last":
        x = torch.stack([x, x], -1).reshape(B, S, 2 * N, 2 * D)[..., ::2][:, :, :N]
    else:
        x = x[:, :, :N]
    cos, sin = cos[:, ::2], sin[:, ::2]  # [B, S, R] tables with a strided S
    assert not x.is_contiguous() and not cos.is_contiguous()
    y = ft.rope(x, cos, sin, interleaved=True)
    ref.assert_close(f64(y), ref.rope_fwd(f64(x), f64(cos), f64(sin), False, True), "float32", name="y")


def test_expanded_gradients():
    """y.sum().backward() hands rope_bwd a dy of stride 0 everywhere; an expanded row has stride 0
    but in its last dim: both are read as they are."""
    t = tensors((B, S, N, D), "float32", 10, (B, S), "float32")
    x, cos, sin = t["x"], t["cos"], t["sin"]
    ft.rope(x, cos, sin).sum().backward()
    ones = np.ones((B, S, N, D))
    ref.assert_close(f64(x.grad), ref.rope_bwd(ones, f64(cos), f64(sin)), "float32", name="dx of sum")
    row = torch.randn(D)
    dy = row.expand(B, S, N, D)
    assert dy.stride() == (0, 0, 0, 1)
    (dx,) = torch.autograd.grad(ft.rope(x, cos, sin), (x,), dy)
    ref.assert_close(f64(dx), ref.rope_bwd(f64(dy), f64(cos), f64(sin)), "float32", name="dx of an expanded dy")


def test_reference_backward_is_the_transpose():
    """<dy, rope(x)> == <rope_bwd(dy), x>: the backward in rope.h is the transposed rotation."""
    rng = np.random.default_rng(3)
    for bhsd in (False, True):
        for interleaved in (False, True):
            x, dy = rng.standard_normal((2, 4, 3, 10)), rng.standard_normal((2, 4, 3, 10))
            s = 3 if bhsd else 4
            cos, sin = rng.standard_normal((2, s, 6)), rng.standard_normal((2, s, 6))
            lhs = np.sum(dy * ref.rope_fwd(x, cos, sin, bhsd, interleaved))
            rhs = np.sum(ref.rope_bwd(dy, cos, sin, bhsd, interleaved) * x)
            assert abs(lhs - rhs) < 1e-9 * (1 + abs(lhs))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def test_matches_the_unfused_expressions():
    """transformers' rotate_half formula (partial rotary) and the GPT-J interleaved one, in float64."""
    torch.manual_seed(1)
    q, k = torch.randn(B, N, S, D, dtype=torch.float64), torch.randn(B, S, N, D, dtype=torch.float64)
    cos, sin = torch.randn(B, S, 12, dtype=torch.float64), torch.randn(B, S, 12, dtype=torch.float64)
    r = cos.shape[-1]
    want = torch.cat([q[..., :r] * cos[:, None] + rotate_half(q[..., :r]) * sin[:, None], q[..., r:]], -1)
    got = ft.rope(q.float(), cos.float(), sin.float(), layout="bhsd")
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    pairs = k[..., :r].unflatten(-1, (r // 2, 2))
    rot = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    want = torch.cat([k[..., :r] * cos[:, :, None] + rot * sin[:, :, None], k[..., r:]], -1)
    got = ft.rope(k.float(), cos.float(), sin.float(), interleaved=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_transformers_llama(dtype):
    """transformers' own apply_rotary_pos_emb (LLaMA) on q, k [B, N, S, D], cos / sin [B, S, D]
    from its rotary embedding, and its gradient."""
    pytest.importorskip(
        "transformers", reason="transformers is not installed: the comparison with its apply_rotary_pos_emb cannot run here"
    )
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    tdt = getattr(torch, dtype)
    config = LlamaConfig(hidden_size=N * 64, num_attention_heads=N, num_key_value_heads=N, max_position_embeddings=64)
    torch.manual_seed(2)
    q = torch.randn(B, N, S, 64, dtype=tdt, requires_grad=True)
    k = torch.randn(B, N, S, 64, dtype=tdt, requires_grad=True)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])  # a KV-cache offset in row 1
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)
    assert cos.shape == (B, S, 64) and cos.dtype == tdt
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = ft.rope(q, cos, sin, layout="bhsd"), ft.rope(k, cos, sin, layout="bhsd")
    tol = ref.tolerance(dtype, "out")
    torch.testing.assert_close(got_q, want_q, rtol=tol[0], atol=tol[1])
    torch.testing.assert_close(got_k, want_k, rtol=tol[0], atol=tol[1])
    dy = torch.randn_like(q)
    want = torch.autograd.grad(want_q, (q,), dy)[0]
    got = torch.autograd.grad(got_q, (q,), dy)[0]
    torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1])


# --- pair tables and sections (fuselet/rope.h): each against the plain op on the full-width
# tables they stand for (bit for bit: the same kernel math) and the float64 reference.

# K -> sections of R/2 = 6 pairs: contiguous, and interleaved (where K (s_k - 1) + k < 6)
SECTIONS = {1: (6,), 2: (2, 4), 3: (1, 3, 2), 4: (2, 0, 3, 1)}
INTERLEAVED_SECTIONS = {1: (6,), 2: (3, 3), 3: (2, 2, 2), 4: (3, 2, 0, 1)}


def check_tables(t, dtype, layout, interleaved, **table):
    """ft.rope with the table options `table` against the plain op on the tables they stand for."""
    x, dy, cos, sin = t["x"], t["dy"], t["cos"], t["sin"]
    full_cos, full_sin = ref.rope_full_tables(f64(cos), f64(sin), interleaved, **table)
    full = {k: torch.from_numpy(v).to(device=cos.device, dtype=cos.dtype) for k, v in (("cos", full_cos), ("sin", full_sin))}
    y = ft.rope(x, cos, sin, layout=layout, interleaved=interleaved, **table)
    want = ft.rope(x, full["cos"], full["sin"], layout=layout, interleaved=interleaved)
    assert torch.equal(y, want), (y - want).abs().max()
    bhsd = layout == "bhsd"
    ref.assert_close(f64(y), ref.rope_fwd(f64(x), full_cos, full_sin, bhsd, interleaved), dtype, name="y")
    (dx,) = torch.autograd.grad(y, (x,), dy)
    (want_dx,) = torch.autograd.grad(want, (x,), dy)
    assert torch.equal(dx, want_dx), (dx - want_dx).abs().max()
    ref.assert_close(f64(dx), ref.rope_bwd(f64(dy), full_cos, full_sin, bhsd, interleaved), dtype, name="dx")


@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("rotary", [D, 10], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_pair_table(dtype, layout, interleaved, rotary, tables, torch_device):
    table_shape = (S,) if tables == "shared" else (B, S)
    t = tensors(x_shape(layout), dtype, rotary // 2, table_shape, "float32", torch_device)
    check_tables(t, dtype, layout, interleaved, pair_table=True)


@pytest.mark.parametrize("k", sorted(SECTIONS))
@pytest.mark.parametrize("interleaved_sections", [False, True], ids=["contiguous", "interleaved_sections"])
@pytest.mark.parametrize("pair_table", [False, True], ids=["full", "pair"])
@pytest.mark.parametrize("tables", ["shared", "per_seq"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_sections(dtype, layout, interleaved, tables, pair_table, interleaved_sections, k, torch_device):
    """K tables [K, S, R'] / [K, B, S, R'], R = 12 < D (partial rotary), each section rule."""
    sections = (INTERLEAVED_SECTIONS if interleaved_sections else SECTIONS)[k]
    table_shape = (k, S) if tables == "shared" else (k, B, S)
    t = tensors(x_shape(layout), dtype, 6 if pair_table else 12, table_shape, "x", torch_device, seed=k)
    check_tables(
        t, dtype, layout, interleaved, pair_table=pair_table, sections=sections, interleaved_sections=interleaved_sections
    )


def test_the_section_rules_are_transformers():
    """fuselet.spec's k(j) and the reference's are transformers' own: Qwen2-VL's contiguous
    recomposition and Qwen3-VL's interleaved one, on tables whose every entry names its table."""
    pytest.importorskip("transformers", reason="transformers is not installed: its mrope functions cannot run here")
    from types import SimpleNamespace

    from fuselet.spec.rope import sections_table
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    for sections, module, interleaved in [
        ((16, 24, 24), Qwen2VLRotaryEmbedding, False),
        ((2, 1, 3), Qwen2VLRotaryEmbedding, False),
        ((24, 20, 20), Qwen3VLTextRotaryEmbedding, True),
        ((3, 2, 1), Qwen3VLTextRotaryEmbedding, True),
        ((2, 2, 2), Qwen3VLTextRotaryEmbedding, True),
    ]:
        pairs = sum(sections)
        which = torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, pairs).clone()  # entry = its table
        got = module.recomposition_frequencies(SimpleNamespace(mrope_section=list(sections)), which)[0, 0, :pairs]
        want = [sections_table(j, sections, interleaved) for j in range(pairs)]
        assert got.long().tolist() == want, (sections, module.__name__)
        assert [ref.rope_section_of(j, sections, interleaved) for j in range(pairs)] == want


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["qwen2_vl", "qwen3_vl"])
def test_matches_transformers_mrope(model, dtype):
    """Qwen2-VL's and Qwen3-VL's rope: transformers recomposes the three position tables of
    cos(freqs) [3, B, S, R/2] into one full-width table for apply_rotary_pos_emb; fuselet reads
    them as they are (pair_table, sections), forward and gradient."""
    pytest.importorskip("transformers", reason="transformers is not installed: its mrope functions cannot run here")
    from types import SimpleNamespace

    if model == "qwen2_vl":
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as Rotary
        from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

        sections, interleaved_sections = [4, 6, 6], False
    else:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

        sections, interleaved_sections = [6, 5, 5], True
    tdt = getattr(torch, dtype)
    torch.manual_seed(3)
    head_dim = 2 * sum(sections)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    positions = torch.randint(0, 40, (3, B, S)).float()  # temporal, height, width
    freqs = positions[..., None] * inv_freq
    cos, sin = freqs.cos(), freqs.sin()  # [3, B, S, R/2]
    this = SimpleNamespace(mrope_section=sections)
    full_cos = Rotary.recomposition_frequencies(this, cos.clone()).to(tdt)
    full_sin = Rotary.recomposition_frequencies(this, sin.clone()).to(tdt)
    q = torch.randn(B, N, S, head_dim, dtype=tdt, requires_grad=True)
    k = torch.randn(B, N, S, head_dim, dtype=tdt)
    want, _ = apply_rotary_pos_emb(q, k, full_cos, full_sin)
    options = {"pair_table": True, "sections": tuple(sections), "interleaved_sections": interleaved_sections}
    got = ft.rope(q, cos.to(tdt), sin.to(tdt), layout="bhsd", **options)
    tol = ref.tolerance(dtype, "out")
    torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1])
    dy = torch.randn_like(q)
    torch.testing.assert_close(
        torch.autograd.grad(got, (q,), dy)[0], torch.autograd.grad(want, (q,), dy)[0], rtol=tol[0], atol=tol[1]
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_transformers_llama4_complex(dtype):
    """Llama4's apply_rotary_emb multiplies the interleaved pairs of q, k [B, S, N, D] as complex
    numbers by freqs_cis [B, S, D/2]; fuselet reads its .real and .imag as a pair table."""
    pytest.importorskip("transformers", reason="transformers is not installed: its apply_rotary_emb cannot run here")
    from transformers.models.llama4.modeling_llama4 import apply_rotary_emb

    tdt = getattr(torch, dtype)
    torch.manual_seed(4)
    angles = torch.randn(B, S, D // 2) * 3
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    q = torch.randn(B, S, N, D, dtype=tdt, requires_grad=True)
    k = torch.randn(B, S, N, D, dtype=tdt)
    want, _ = apply_rotary_emb(q, k, freqs_cis)
    got = ft.rope(q, freqs_cis.real.contiguous(), freqs_cis.imag.contiguous(), interleaved=True, pair_table=True)
    tol = ref.tolerance(dtype, "out")
    torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1])
    dy = torch.randn_like(q)
    torch.testing.assert_close(
        torch.autograd.grad(got, (q,), dy)[0], torch.autograd.grad(want, (q,), dy)[0], rtol=tol[0], atol=tol[1]
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_opcheck(dtype):
    t = tensors((2, 3, 4, 8), dtype, 6, (2, 3), "float32")
    x = t["x"].detach()
    for op, args in [
        (ops.rope_fwd, (x.clone().requires_grad_(True), t["cos"], t["sin"], False, True)),
        (ops.rope_fwd, (x.clone().requires_grad_(True), t["cos"][0], t["sin"][0], False, False)),
        (ops.rope_fwd, (x.transpose(1, 2).requires_grad_(True), t["cos"], t["sin"], True, False)),
        (ops.rope_bwd, (t["dy"], t["cos"], t["sin"], False, True)),
        (ops.rope_bwd, (t["dy"].transpose(1, 2), t["cos"][0], t["sin"][0], True, False)),
        (ops.rope_fwd, (x.clone().requires_grad_(True), t["cos"][..., :3], t["sin"][..., :3], False, True, True)),
        (ops.rope_fwd, (x.clone().requires_grad_(True), t["cos"], t["sin"], False, False, False, [1, 2])),
        (
            ops.rope_fwd,
            (x.transpose(1, 2).requires_grad_(True), t["cos"][..., :3], t["sin"][..., :3], True, True, True, [2, 1], True),
        ),
        (ops.rope_bwd, (t["dy"], t["cos"], t["sin"], False, True, False, [2, 1], True)),
    ]:
        torch.library.opcheck(op.default, args)


def assert_compiles(fn, x0):
    """fn under torch.compile(fullgraph=True) equals it eager: its output and the gradient of
    sum(out^2) to its input (a copy of x0)."""

    def step(f):
        x = x0.clone().requires_grad_(True)
        out = f(x)
        (out * out).sum().backward()
        return out.detach(), x.grad

    eager = step(fn)
    torch._dynamo.reset()
    compiled = step(torch.compile(fn, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_torch_compile_fullgraph():
    """q / k projections, transpose, fuselet's rope and attention, compiled with fullgraph=True, match eager."""
    torch.manual_seed(0)
    h0 = torch.randn(B, S, 32)
    wq, wk = torch.randn(32, N * D) * 0.2, torch.randn(32, N * D) * 0.2
    cos, sin = torch.randn(S, D), torch.randn(S, D)

    def attention(h):
        q = (h @ wq).view(B, S, N, D).transpose(1, 2)
        k = (h @ wk).view(B, S, N, D)
        q = ft.rope(q, cos, sin, layout="bhsd")
        k = ft.rope(k, cos, sin, interleaved=True).transpose(1, 2)
        return torch.softmax(q @ k.transpose(-1, -2), -1)

    assert_compiles(attention, h0)


def test_torch_compile_fullgraph_tables():
    """A pair table and sectioned tables under torch.compile(fullgraph=True), forward and gradient."""
    torch.manual_seed(0)
    x0 = torch.randn(B, S, N, D)
    half, three = torch.randn(S, D // 2), torch.randn(3, B, S, D // 2)

    def fn(x):
        y = ft.rope(x, half, half.flip(0), pair_table=True, interleaved=True)
        return ft.rope(y, three, three.flip(0), pair_table=True, sections=(3, 3, 2), interleaved_sections=True)

    assert_compiles(fn, x0)
