"""fuselet.torch cross_entropy against the float64 reference (tests/reference.py) and
torch.nn.functional.cross_entropy: options, reductions, ignored tokens, in-place backward,
the fused fwd_bwd helper, opcheck and torch.compile."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
from fuselet.torch.cross_entropy import fwd_bwd  # noqa: E402  (the module; fuselet.torch.cross_entropy is the function)

F = torch.nn.functional
ops = torch.ops.fuselet

VOCABS = [1, 3, 32000, 32001]
# name -> keyword options of cross_entropy
OPTIONS = {
    "plain": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 5.0},
    "ignore_inside": {"ignore_index": 2},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 10.0, "ignore_index": 1},
}


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def make(shape, vocab, dtype, device="cpu", seed=0, target_dtype=torch.int64, ignore_index=-100, ignore_every=3):
    """logits [*shape, vocab] rounded to dtype, targets with every `ignore_every`-th token ignored."""
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.standard_normal((*shape, vocab)) * 3.0).to(getattr(torch, dtype))
    target = torch.from_numpy(rng.integers(0, vocab, shape))
    flat = target.view(-1)
    if ignore_every:
        flat[1::ignore_every] = ignore_index
    return logits.to(device).requires_grad_(True), target.to(device=device, dtype=target_dtype)


def expected(logits, target, opts):
    o = {"ignore_index": -100, "label_smoothing": 0.0, "z_loss": 0.0, "softcap": None, **opts}
    return o, ref.cross_entropy_fwd(f64(logits), target.cpu().numpy(), **o)


def check_none(logits, target, dtype, opts, seed=1):
    """reduction='none' with a per-token weight: losses and the weighted gradient."""
    loss = ft.cross_entropy(logits, target, reduction="none", **opts)
    assert loss.dtype == torch.float32 and loss.shape == target.shape
    o, (want, _, _) = expected(logits, target, opts)
    ref.assert_close(f64(loss), want, "float32", "out", name="loss")
    w = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(target.shape))).float().to(logits.device)
    (loss * w).sum().backward()
    assert logits.grad.dtype == logits.dtype and not torch.isnan(logits.grad).any()
    ref.assert_close(
        f64(logits.grad), ref.cross_entropy_bwd(f64(w), f64(logits), target.cpu().numpy(), **o), dtype, "out", name="dlogits"
    )


@pytest.mark.parametrize("target_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("vocab", VOCABS)
def test_forward_backward(dtype, vocab, target_dtype, torch_device):
    logits, target = make((3 if vocab > 100 else 9,), vocab, dtype, torch_device, target_dtype=target_dtype)
    check_none(logits, target, dtype, {})


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("vocab", [3, 4097])
def test_options(dtype, name, vocab, torch_device):
    opts = OPTIONS[name]
    logits, target = make((2, 5), vocab, dtype, torch_device, ignore_index=opts.get("ignore_index", -100))
    check_none(logits, target, dtype, opts)


def test_weighted_none_with_ignored_tokens():
    """(loss_none * w).sum(): each token's gradient is scaled by its own weight, ignored ones 0."""
    logits, target = make((16,), 37, "float32")
    w = torch.arange(16, dtype=torch.float32) / 4 - 1.5
    (ft.cross_entropy(logits, target, reduction="none", label_smoothing=0.1) * w).sum().backward()
    x = logits.detach().clone().requires_grad_(True)
    (F.cross_entropy(x, target, reduction="none", label_smoothing=0.1) * w).sum().backward()
    torch.testing.assert_close(logits.grad, x.grad, rtol=1e-5, atol=1e-6)
    assert torch.equal(logits.grad[1::3], torch.zeros_like(logits.grad[1::3]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "opts",
    [{}, {"label_smoothing": 0.1}, {"ignore_index": 4}, {"label_smoothing": 0.3, "ignore_index": -100}],
    ids=["plain", "label_smoothing", "ignore_inside", "label_smoothing_ignore"],
)
def test_matches_torch_functional(reduction, opts):
    logits, target = make((4, 6), 50, "float32", ignore_index=opts.get("ignore_index", -100))
    loss = ft.cross_entropy(logits, target, reduction=reduction, **opts)
    x = logits.detach().clone().requires_grad_(True)
    want = F.cross_entropy(x.view(-1, 50), target.view(-1), reduction=reduction, **opts)
    torch.testing.assert_close(loss, want.view(loss.shape), rtol=1e-5, atol=1e-6)
    g = torch.randn(loss.shape)
    loss.backward(g)
    want.backward(g.view(want.shape))
    torch.testing.assert_close(logits.grad, x.grad, rtol=1e-5, atol=1e-6)


def test_z_loss_and_return_z_loss():
    logits, target = make((8,), 100, "float32")
    loss, z = ft.cross_entropy(logits, target, z_loss=1e-2, return_z_loss=True)
    assert loss.shape == z.shape == () and z.dtype == torch.float32 and not z.requires_grad
    o, (l_ref, z_ref, lse) = expected(logits, target, {"z_loss": 1e-2})
    valid = (target != -100).numpy()
    np.testing.assert_allclose(float(z), z_ref[valid].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(z), 1e-2 * (lse[valid] ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(float(loss.detach()), l_ref[valid].mean(), rtol=1e-5)
    loss.backward()
    dloss = np.where(valid, 1.0 / valid.sum(), 0.0)
    ref.assert_close(f64(logits.grad), ref.cross_entropy_bwd(dloss, f64(logits), target.numpy(), **o), "float32")
    # z-loss is part of the gradient: without it the gradient differs.
    no_z = ref.cross_entropy_bwd(dloss, f64(logits), target.numpy())
    assert np.abs(f64(logits.grad) - no_z).max() > 1e-4
    none_loss, none_z = ft.cross_entropy(logits, target, z_loss=1e-2, return_z_loss=True, reduction="none")
    ref.assert_close(f64(none_z), z_ref, "float32", name="z none")


def test_softcap_bfloat16(torch_device):
    logits, target = make((4, 3), 2048, "bfloat16", torch_device)
    with torch.no_grad():
        logits.mul_(10)  # well past the cap: tanh saturates
    check_none(logits, target, "bfloat16", {"softcap": 30.0, "z_loss": 1e-4})


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_tokens_ignored(reduction, torch_device):
    logits, target = make((5,), 7, "float32", torch_device)
    target = torch.full_like(target, -100)
    loss, z = ft.cross_entropy(logits, target, reduction=reduction, z_loss=1e-3, return_z_loss=True)
    assert float(loss.detach()) == 0.0 and float(z) == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_ignore_index_inside_the_vocabulary():
    logits, target = make((12,), 5, "float32", ignore_index=0, ignore_every=0)
    loss = ft.cross_entropy(logits, target, ignore_index=0, reduction="none")
    assert torch.equal(loss[target == 0], torch.zeros(int((target == 0).sum())))
    torch.testing.assert_close(loss, F.cross_entropy(logits.detach(), target, ignore_index=0, reduction="none"))


@pytest.mark.parametrize("bad", [7, -1, -101])
def test_out_of_range_target(bad):
    logits, target = make((4,), 7, "float32", ignore_every=0)
    target[2] = bad
    with pytest.raises(ValueError, match=rf"target: element 2 is {bad}, outside \[0, 7\)"):
        ft.cross_entropy(logits, target)


def test_int32_and_int64_targets_agree():
    logits, target = make((3, 4), 33, "bfloat16")
    a = ft.cross_entropy(logits, target, reduction="none", label_smoothing=0.1)
    b = ft.cross_entropy(logits, target.int(), reduction="none", label_smoothing=0.1)
    assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(0,), (2, 0)], ids=["0", "2x0"])
def test_empty_batch(dtype, shape):
    logits, target = make(shape, 11, dtype)
    assert ft.cross_entropy(logits, target, reduction="none").shape == shape
    loss = ft.cross_entropy(logits, target)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert logits.grad.shape == (*shape, 11)


@pytest.mark.parametrize("view", ["transposed", "every_other_row", "strided_last", "3d"])
def test_non_contiguous_and_3d(view):
    base, target = make((12,), 16, "float32")
    base = base.detach()
    x = {
        "strided_last": lambda a: torch.stack([a, a], -1).reshape(12, 32)[:, ::2],
        "every_other_row": lambda a: torch.cat([a, a], 1).reshape(24, 16)[::2],
        "transposed": lambda a: a.t().contiguous().t(),
        "3d": lambda a: a.view(3, 4, 16),
    }[view](base)
    assert torch.equal(x.reshape(12, 16), base)
    t = target.view(x.shape[:-1])
    check_none(x.detach().requires_grad_(True), t, "float32", {"label_smoothing": 0.1})


def test_inplace_backward():
    """The gradient is written into the logits' own storage, with the out-of-place values."""
    torch.manual_seed(0)
    h, w = torch.randn(6, 8), torch.randn(8, 40, requires_grad=True)
    target = torch.randint(0, 40, (6,))
    target[3] = -100
    seen = {}

    def run(inplace):
        logits = h @ w
        seen["ptr"] = logits.data_ptr()
        logits.register_hook(lambda g: seen.update(grad_ptr=g.data_ptr(), grad=g.clone()))
        loss = ft.cross_entropy(logits, target, z_loss=1e-3, softcap=20.0, inplace_backward=inplace)
        (dw,) = torch.autograd.grad(loss, (w,))
        return loss.detach(), dw, seen["grad"], seen["grad_ptr"] == seen["ptr"]

    l1, dw1, g1, shared1 = run(False)
    l2, dw2, g2, shared2 = run(True)
    assert shared2 and not shared1
    assert torch.equal(l1, l2)
    torch.testing.assert_close(g2, g1, rtol=0, atol=0)
    torch.testing.assert_close(dw2, dw1)


def test_fwd_bwd_helper(dtype):
    assert ft.cross_entropy.fwd_bwd is fwd_bwd
    logits, target = make((3, 5), 301, dtype)
    opts = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 15.0}
    loss, z, dlogits = fwd_bwd(logits.detach(), target, grad_scale=0.25, **opts)
    o, (l_ref, z_ref, _) = expected(logits, target, opts)
    ref.assert_close(f64(loss), l_ref, "float32", name="loss")
    ref.assert_close(f64(z), z_ref, "float32", name="z")
    want = ref.cross_entropy_bwd(np.full(target.shape, 0.25), f64(logits), target.numpy(), **o)
    ref.assert_close(f64(dlogits), want, dtype, name="dlogits")
    x = logits.detach().clone()
    loss2, z2, d2 = fwd_bwd(x, target, grad_scale=0.25, inplace=True, **opts)
    assert d2 is x and torch.equal(x, dlogits) and torch.equal(loss2, loss) and torch.equal(z2, z)


def test_opcheck():
    logits, target = make((2, 3), 9, "bfloat16")
    x = logits.detach()
    args = (-100, 0.1, 1e-3, 5.0)
    loss, z, lse = ops.cross_entropy_fwd(x, target, *args)
    dloss = torch.randn(2, 3)
    cases = [
        (ops.cross_entropy_fwd, (x.clone().requires_grad_(True), target, *args)),
        (ops.cross_entropy_fwd, (x.float().requires_grad_(True), target.int(), -100, 0.0, 0.0, 0.0)),
        (ops.cross_entropy_bwd, (dloss, x, target, lse, *args)),
        (ops.cross_entropy_bwd_, (dloss, x.clone(), target, lse, *args)),
        (ops.cross_entropy_fwd_bwd, (x, target, *args, 0.5)),
        (ops.cross_entropy_fwd_bwd_, (x.clone(), target, *args, 0.5)),
    ]
    for op, a in cases:
        torch.library.opcheck(op.default, a)


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "inplace_backward"])
def test_torch_compile_fullgraph(inplace):
    """An LM head + fuselet cross-entropy compiled with fullgraph=True matches eager."""
    torch.manual_seed(0)
    h0, w0 = torch.randn(10, 16), torch.randn(16, 64)
    target = torch.randint(0, 64, (10,))
    target[::4] = -100

    def head(h, w):
        loss, z = ft.cross_entropy(
            h @ w, target, label_smoothing=0.1, z_loss=1e-3, softcap=30.0, return_z_loss=True, inplace_backward=inplace
        )
        return loss, z

    def step(fn):
        w = w0.clone().requires_grad_(True)
        loss, z = fn(h0, w)
        loss.backward()
        return loss.detach(), z, w.grad

    eager = step(head)
    torch._dynamo.reset()
    compiled = step(torch.compile(head, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    want = F.cross_entropy(30.0 * torch.tanh(h0 @ w0 / 30.0), target, label_smoothing=0.1)
    assert abs(float(eager[0]) - float(eager[1]) - float(want)) < 1e-5


def test_ignore_index_outside_the_target_dtype():
    """An int32 target cannot hold ignore_index 2**32: every token counts (torch would wrap it to 0)."""
    logits, target = make((6,), 5, "float32", ignore_every=0)
    target[0] = 0
    loss = ft.cross_entropy(logits, target.int(), ignore_index=2**32)
    torch.testing.assert_close(loss, F.cross_entropy(logits.detach(), target))


def test_fwd_bwd_in_place_non_contiguous():
    logits, target = make((6,), 10, "bfloat16")
    base = torch.stack([logits.detach(), logits.detach()], -1).reshape(6, 20)
    view = base[:, ::2]
    assert not view.is_contiguous()
    want = fwd_bwd(logits.detach(), target, z_loss=1e-3)
    got = fwd_bwd(view, target, z_loss=1e-3, inplace=True)
    assert got[2] is view and torch.equal(view, want[2]) and torch.equal(base[:, 1::2], logits.detach())
    assert torch.equal(got[0], want[0])
