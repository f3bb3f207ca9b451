"""fuselet.torch.fused_linear_cross_entropy against the float64 reference (tests/reference.py) and
against fuselet's own cross_entropy of the materialized logits."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
from fuselet.spec.fused_linear_cross_entropy import chunk_size_for, vocab_block_for  # noqa: E402

OPTIONS = {
    "plain": {},
    "ignore": {"ignore_index": 2},
    "smooth_ignore": {"label_smoothing": 0.1, "ignore_index": 2},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 3.0},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 5.0, "ignore_index": 0},
}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def inputs(n=37, h=16, v=29, dtype="float32", bias=True, seed=0, device="cpu", lead=()):
    rng = np.random.default_rng(seed)
    dt = getattr(torch, dtype)

    def t(*shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape) * scale).to(device=device, dtype=dt).requires_grad_(True)

    hidden = t(*lead, n, h)
    weight = t(v, h, scale=h**-0.5 * 3)
    b = t(v) if bias else None
    target = torch.from_numpy(rng.integers(0, v, (*lead, n))).to(device)
    return hidden, weight, b, target


def reference(
    hidden, weight, bias, target, dloss=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean"
):
    """float64 (loss, z, dhidden, dweight, dbias) of cross_entropy(hidden @ weight.T + bias)."""
    h, w = f64(hidden).reshape(-1, hidden.shape[-1]), f64(weight)
    logits = h @ w.T + (0.0 if bias is None else f64(bias))
    t = target.reshape(-1).cpu().numpy()
    loss, z, _ = ref.cross_entropy_fwd(logits, t, ignore_index, label_smoothing, z_loss, softcap)
    valid = t != ignore_index
    if reduction == "none":
        g = np.ones_like(loss) if dloss is None else f64(dloss).reshape(-1)
        out_loss, out_z = loss.reshape(target.shape), z.reshape(target.shape)
    else:
        scale = 1.0 / max(1, valid.sum()) if reduction == "mean" else 1.0
        g = np.full_like(loss, scale)
        out_loss, out_z = loss.sum() * scale, z.sum() * scale
    dl = ref.cross_entropy_bwd(g, logits, t, ignore_index, label_smoothing, z_loss, softcap)
    return out_loss, out_z, (dl @ w).reshape(hidden.shape), dl.T @ h, None if bias is None else dl.sum(0)


def check_grads(hidden, weight, bias, expected, rtol, atol):
    for name, t, e in (("hidden", hidden, expected[2]), ("weight", weight, expected[3]), ("bias", bias, expected[4])):
        if t is None:
            continue
        assert t.grad is not None and t.grad.dtype == t.dtype, name
        np.testing.assert_allclose(f64(t.grad), e, rtol=rtol, atol=atol, err_msg=f"d{name}")


# (tokens, classes): more tokens than classes; and few beside the classes, where reduction="none"
# recomputes the logits by blocks of classes (spec.vocab_block_for) when chunk_size is below N
SHAPES = {"tall": (37, 29), "wide": (13, 211)}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("chunk", [None, 1, 5, 1000])
@pytest.mark.parametrize("shape", SHAPES)
def test_against_reference(reduction, options, chunk, shape, torch_device):
    n, v = SHAPES[shape]
    hidden, weight, bias, target = inputs(n=n, v=v, device=torch_device)
    kw = {**OPTIONS[options], "reduction": reduction}
    loss = ft.fused_linear_cross_entropy(hidden, weight, target, bias=bias, chunk_size=chunk, **kw)
    assert loss.dtype == torch.float32
    dloss = torch.linspace(0.5, 1.5, target.numel(), device=torch_device).reshape(target.shape)
    (loss * dloss).sum().backward() if reduction == "none" else loss.backward()
    expected = reference(hidden, weight, bias, target, dloss if reduction == "none" else None, **kw)
    np.testing.assert_allclose(f64(loss), expected[0], rtol=1e-5, atol=1e-5)
    check_grads(hidden, weight, bias, expected, 1e-4, 1e-5)


def test_masked_per_token_loss():
    """reduction="none" times a caller's per-token weight (0 on some tokens), next to ignore_index."""
    hidden, weight, bias, target = inputs(n=40)
    target[::7] = -100
    mask = (torch.arange(40) % 3 != 0).float()
    loss = ft.fused_linear_cross_entropy(hidden, weight, target, bias=bias, reduction="none")
    assert torch.all(loss[::7] == 0)
    ((loss * mask).sum() / mask.sum()).backward()
    expected = reference(hidden, weight, bias, target, mask / mask.sum(), reduction="none")
    check_grads(hidden, weight, bias, expected, 1e-4, 1e-6)


def test_all_tokens_ignored():
    hidden, weight, bias, target = inputs(n=8)
    target.fill_(-100)
    loss = ft.fused_linear_cross_entropy(hidden, weight, target, bias=bias)
    loss.backward()
    assert float(loss.detach()) == 0.0
    for t in (hidden, weight, bias):
        assert torch.count_nonzero(t.grad) == 0


def test_z_loss_returned_for_logging():
    hidden, weight, bias, target = inputs()
    loss, z = ft.fused_linear_cross_entropy(hidden, weight, target, bias=bias, z_loss=1e-2, return_z_loss=True)
    expected = reference(hidden, weight, bias, target, z_loss=1e-2)
    np.testing.assert_allclose(f64(z), expected[1], rtol=1e-5)
    assert float(z) > 0 and not z.requires_grad and loss.requires_grad


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("shape", [(64, 96, 16), (24, 200, 8)], ids=["chunks", "blocks"])
def test_low_precision_matches_unfused(dtype, reduction, shape, torch_device):
    """The same loss and gradients as fuselet's cross_entropy of the materialized logits in that dtype."""
    kw = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 10.0, "reduction": reduction}
    n, v, chunk = shape
    a = inputs(n=n, h=32, v=v, dtype=dtype, device=torch_device)
    b = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in a]
    loss = ft.fused_linear_cross_entropy(a[0], a[1], a[3], bias=a[2], chunk_size=chunk, **kw)
    unfused = ft.cross_entropy(torch.addmm(b[2], b[0], b[1].t()), b[3], **kw)
    torch.testing.assert_close(loss, unfused, rtol=1e-3, atol=1e-3)
    loss.sum().backward()
    unfused.sum().backward()
    for ours, theirs in zip((a[0], a[1], a[2]), (b[0], b[1], b[2])):
        assert ours.grad.dtype == ours.dtype
        torch.testing.assert_close(ours.grad.float(), theirs.grad.float(), rtol=2e-2, atol=2e-2)


class _InputDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """The dtypes of the floating tensors each fuselet op is called with."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "fuselet":
            self.seen.append({t.dtype for t in args if isinstance(t, torch.Tensor) and t.is_floating_point()})
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("compiled", [False, True])
def test_autocast_casts_like_linear(compiled):
    """Under torch.autocast the logits' matmul runs in autocast's dtype, as torch.nn.Linear's would:
    the op sees bfloat16 inputs, the loss matches the unfused loss under the same autocast, and
    the float32 parameters get float32 gradients."""
    a = inputs(n=64, h=32, v=96)
    b = [t.detach().clone().requires_grad_(True) for t in a[:3]]

    def fused(h, w, bias, t):
        return ft.fused_linear_cross_entropy(h, w, t, bias=bias, chunk_size=16)

    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if compiled:  # the autocast state is traced: no graph break
            loss = torch.compile(fused, fullgraph=True)(*a[:3], a[3])
        else:
            with _InputDtypes() as mode:
                loss = fused(*a[:3], a[3])
            assert mode.seen and all(s == {torch.bfloat16} for s in mode.seen), mode.seen
        unfused = torch.nn.functional.cross_entropy(torch.nn.functional.linear(b[0], b[1], b[2]).float(), a[3])
    torch.testing.assert_close(loss, unfused, rtol=2e-3, atol=2e-3)
    loss.backward()
    unfused.backward()
    for ours, theirs in zip(a[:3], b):
        assert ours.grad.dtype == torch.float32
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=2e-2, atol=2e-2)


def test_leading_dims_and_no_bias():
    hidden, weight, _, target = inputs(n=9, lead=(2, 3), bias=False)
    loss = ft.fused_linear_cross_entropy(hidden, weight, target, reduction="none")
    assert loss.shape == (2, 3, 9)
    loss.sum().backward()
    expected = reference(hidden, weight, None, target, reduction="none")
    np.testing.assert_allclose(f64(loss), expected[0], rtol=1e-5, atol=1e-6)
    check_grads(hidden, weight, None, expected, 1e-4, 1e-5)


def test_empty_batch():
    hidden, weight, bias, target = inputs(n=0)
    loss = ft.fused_linear_cross_entropy(hidden, weight, target, bias=bias)
    loss.backward()
    assert float(loss.detach()) == 0.0 and hidden.grad.shape == (0, 16) and torch.count_nonzero(weight.grad) == 0


def test_chunk_size_rule():
    assert chunk_size_for(4096, 1024, 32768) == 256  # the rule alone: 128; at least MIN_CHUNK
    assert chunk_size_for(16384, 4096, 131072) == 512
    assert chunk_size_for(65536, 1024, 2048) == 32768
    assert chunk_size_for(3, 16, 29) == 3 and chunk_size_for(1, 8, 10**6) == 1 and chunk_size_for(0, 8, 8) == 1


def test_vocab_block_rule():
    assert vocab_block_for(4096, 32768, 256) == 1024  # VOCAB_BLOCK
    assert vocab_block_for(16384, 131072, 512) == 1024
    assert vocab_block_for(8192, 32768, 256) == 1024 and vocab_block_for(8193, 32768, 256) == 0  # N <= V / 4
    assert vocab_block_for(256, 32768, 256) == 0  # one chunk: nothing to add up
    assert vocab_block_for(13, 211, 5) == 81 and vocab_block_for(13, 211, 1) == 16  # [N, block] <= [chunk, V]
    assert vocab_block_for(37, 29, 5) == 0 and vocab_block_for(0, 8, 1) == 0


def test_torch_compile_fullgraph():
    a = inputs()
    b = [t.detach().clone().requires_grad_(True) for t in a[:3]]

    def loss_fn(h, w, bias, t):
        return ft.fused_linear_cross_entropy(h, w, t, bias=bias, label_smoothing=0.1, chunk_size=8)

    loss_fn(*a).backward()
    torch._dynamo.reset()
    torch.compile(loss_fn, fullgraph=True)(*b, a[3]).backward()
    for x, y in zip(a[:3], b):
        torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("op", ["reduced", "none"])
def test_opcheck(op):
    hidden, weight, bias, target = (t.detach() if t.dtype.is_floating_point else t for t in inputs(n=11, h=8, v=13))
    opts = (-100, 0.1, 1e-3, 0.0)
    if op == "reduced":
        args = (hidden.requires_grad_(True), weight.requires_grad_(True), bias, target, *opts, True, 4)
        torch.library.opcheck(torch.ops.fuselet.fused_linear_cross_entropy_reduced.default, args)
    else:
        args = (hidden.requires_grad_(True), weight.requires_grad_(True), bias, target, *opts, 4)
        torch.library.opcheck(torch.ops.fuselet.fused_linear_cross_entropy_none.default, args)


@pytest.mark.parametrize(
    "case, exc, message",
    [
        ("weight_dtype", TypeError, "weight: expected dtype float32 (the dtype of hidden), got bfloat16"),
        ("weight_shape", ValueError, "weight: expected shape [V, 16]"),
        ("bias_shape", ValueError, "bias: expected shape (29,) (V, the rows of weight), got (28,)"),
        ("target_shape", ValueError, "target: expected shape (37,)"),
        ("chunk", ValueError, "chunk_size: expected None or an int >= 1 (tokens per chunk), got 0"),
        ("hidden_type", TypeError, "hidden: expected a torch.Tensor, got list"),
    ],
)
def test_bad_input(case, exc, message):
    hidden, weight, bias, target = inputs()
    kw = {"bias": bias}
    if case == "weight_dtype":
        weight = weight.detach().bfloat16()
    elif case == "weight_shape":
        weight = weight.detach()[:, :8]
    elif case == "bias_shape":
        kw["bias"] = bias.detach()[:28]
    elif case == "target_shape":
        target = target[:5]
    elif case == "chunk":
        kw["chunk_size"] = 0
    else:
        hidden = [1.0]
    with pytest.raises(exc, match=__import__("re").escape(message)):
        ft.fused_linear_cross_entropy(hidden, weight, target, **kw)


def test_blocked_backward_checks_targets():
    """The backward by blocks of classes hands the kernel no target: the raw op checks them."""
    hidden, weight, _, target = inputs(n=13, v=211, bias=False)
    target[3] = 211
    bwd = torch.ops.fuselet.fused_linear_cross_entropy_none_bwd
    with pytest.raises(ValueError, match=r"target: expected class ids in \[0, 211\) .* got 211 at index 3"):
        bwd(torch.ones(13), hidden.detach(), weight.detach(), None, target, torch.zeros(13), -100, 0.0, 0.0, 0.0, 5)
