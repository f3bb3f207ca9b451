"""fuselet.torch kl_div, jsd and tvd against the float64 reference (tests/reference.py) and against
torch.nn.functional.kl_div itself."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
ops = torch.ops.fuselet
F = torch.nn.functional

KINDS = {"kl_div": 0, "jsd": 1, "tvd": 2}
# (op, options): every kind, beta at its special values and between
CASES = [
    ("kl_div", {"log_target": True}),
    ("kl_div", {"log_target": False}),
    ("jsd", {"beta": 0.0}),
    ("jsd", {"beta": 0.3}),
    ("jsd", {"beta": 0.5}),
    ("jsd", {"beta": 1.0}),
    ("tvd", {}),
]
IDS = [f"{op}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for op, o in CASES]


def pair(shape, dtype, device="cpu", seed=0, log_target=True):
    """(input, target) log-softmax rows in `dtype` (target as probabilities without log_target)."""
    rng = np.random.default_rng(seed)
    x = ref.log_softmax(rng.standard_normal(shape) * 2.0)
    t = ref.log_softmax(rng.standard_normal(shape) * 2.0)
    if not log_target:
        t = np.exp(t)

    def to(v):
        return torch.from_numpy(v.astype(np.float32)).to(device=device, dtype=getattr(torch, dtype)).requires_grad_(True)

    return to(x), to(t)


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def expected(op, x, t, labels=None, **o):
    """The reduced reference loss and its gradients (float64)."""
    log_target = o.get("log_target", True)
    rows = ref.divergence_fwd(op, f64(x), f64(t), log_target, o.get("beta", 0.0))
    if op == "kl_div":
        scale = 1.0 / x.shape[0]  # batchmean
        keep = np.ones(rows.shape, bool)
    else:
        keep = np.ones(rows.shape, bool) if labels is None else labels.cpu().numpy() != -100
        scale = 1.0 / max(keep.sum(), 1)
    loss = float(np.sum(np.where(keep, rows, 0.0)) * scale)
    dx, dt = ref.divergence_bwd(op, np.where(keep, scale, 0.0), f64(x), f64(t), log_target, o.get("beta", 0.0))
    return loss, dx, dt


def call(op, x, t, labels=None, **o):
    if op == "kl_div":
        return ft.kl_div(x, t, **o)
    return getattr(ft, op)(x, t, labels=labels, **o)


@pytest.mark.parametrize("op,options", CASES, ids=IDS)
def test_forward_backward(op, options, dtype, torch_device):
    x, t = pair((3, 5, 127), dtype, torch_device, log_target=options.get("log_target", True))
    labels = None
    if op != "kl_div":
        labels = torch.tensor([[1, -100, 2, 3, 4]] * 3, device=torch_device)
    loss = call(op, x, t, labels, **options)
    assert loss.dtype == torch.float32 and loss.shape == ()
    want, dx, dt = expected(op, x, t, labels, **options)
    ref.assert_close(float(loss.detach()), want, dtype, "reduce", rows=15, name="loss")
    loss.backward()
    assert x.grad.dtype == x.dtype and t.grad.dtype == t.dtype
    ref.assert_close(f64(x.grad), dx, dtype, "out", name="dinput")
    ref.assert_close(f64(t.grad), dt, dtype, "out", name="dtarget")


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize("log_target", [True, False])
def test_kl_div_is_torchs(reduction, log_target):
    """Every reduction of torch.nn.functional.kl_div, values and both gradients, 3-d input
    (batchmean divides by input.shape[0], as torch does)."""
    x, t = pair((4, 6, 50), "float32", log_target=log_target)
    got = ft.kl_div(x, t, reduction=reduction, log_target=log_target)
    with pytest.warns(UserWarning) if reduction == "mean" else _nothing():
        want = F.kl_div(x, t, reduction=reduction, log_target=log_target)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    g = torch.autograd.grad(got.sum(), (x, t))
    w = torch.autograd.grad(want.sum(), (x, t))
    for a, b in zip(g, w):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_jsd_is_trls_generalized_jsd():
    """The GKD trainer's generalized JSD (its math written out here: a logsumexp mixture, beta on the
    teacher), batchmean over the kept tokens."""
    x, t = pair((2, 9, 64), "float32", seed=3)
    labels = torch.randint(0, 64, (2, 9))
    labels[1, :4] = -100
    for beta in (0.0, 0.1, 0.5, 0.9, 1.0):
        got = ft.jsd(x, t, beta=beta, labels=labels)
        if beta == 0.0:
            per = F.kl_div(x, t, reduction="none", log_target=True)
        elif beta == 1.0:
            per = F.kl_div(t, x, reduction="none", log_target=True)
        else:
            b = torch.tensor(beta)
            mix = torch.logsumexp(torch.stack([x + torch.log(1 - b), t + torch.log(b)]), dim=0)
            per = beta * F.kl_div(mix, t, reduction="none", log_target=True) + (1 - beta) * F.kl_div(
                mix, x, reduction="none", log_target=True
            )
        keep = labels != -100
        want = per.sum(-1)[keep].sum() / keep.sum()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0], rtol=1e-4, atol=1e-7)


def test_zero_probabilities_add_nothing():
    """0 log 0 = 0: a target of probability 0 adds 0 and gives finite gradients, as in torch's
    kl_div; so does a log-probability of -inf (where torch's log_target=True gives NaN)."""
    x = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    want = torch.tensor(0.5 * (np.log(0.5) + 2.0) + 0.5 * (np.log(0.5) + 0.5), dtype=torch.float32)
    torch.testing.assert_close(F.kl_div(x, p, reduction="sum"), want)
    for log_target, t in ((False, p), (True, p.log())):
        got = ft.kl_div(x, t, log_target=log_target, reduction="sum")
        torch.testing.assert_close(got, want)
        (g,) = torch.autograd.grad(got, x)
        assert torch.isfinite(g).all()
    for op in ("jsd", "tvd"):
        loss = getattr(ft, op)(x, p.log())
        (g,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(loss) and torch.isfinite(g).all(), op


def test_ignored_rows_and_no_rows():
    x, t = pair((4, 8), "float32")
    labels = torch.tensor([-100, -100, -100, -100])
    loss = ft.jsd(x, t, labels=labels)
    assert float(loss) == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    empty_x, empty_t = pair((0, 8), "float32")
    assert float(ft.tvd(empty_x, empty_t)) == 0.0


def test_teacher_without_grad_gets_none():
    x, t = pair((3, 16), "float32")
    loss = ft.jsd(x, t.detach())
    loss.backward()
    assert x.grad is not None


@pytest.mark.parametrize("view", ["transposed", "every_other_row"])
def test_non_contiguous(view):
    x, t = pair((12, 16), "float32")
    make = {
        "every_other_row": lambda a: torch.cat([a, a], 1).reshape(24, 16)[::2],
        "transposed": lambda a: a.t().contiguous().t(),
    }[view]
    xs, ts = make(x.detach()).requires_grad_(True), make(t.detach())
    assert not xs.is_contiguous()
    got = ft.jsd(xs, ts, beta=0.3)
    torch.testing.assert_close(got, ft.jsd(x.detach(), t.detach(), beta=0.3))


@pytest.mark.parametrize("op,options", [c for c in CASES if c[1].get("log_target", True)], ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_one_pass_against_float64(op, options, dtype):
    """divergence_logits_ (fused_linear_jsd's one pass over a chunk): from logits, times a scale,
    the loss per row and, written over the logits, their gradient through log_softmax, against
    log_softmax, the divergence and its gradient in float64."""
    rng = np.random.default_rng(5)
    z64, t64 = (rng.standard_normal((6, 300)) * 3.0 for _ in range(2))
    z, t = (torch.from_numpy(v.astype(np.float32)).to(getattr(torch, dtype)) for v in (z64, t64))
    g = torch.from_numpy(rng.standard_normal(6).astype(np.float32))
    g[1] = 0.0  # a row no gradient reaches (an ignored token): zeros
    scale, beta = 0.5, options.get("beta", 0.0)
    x, tt = (ref.log_softmax(f64(a) * scale) for a in (z, t))
    rows = ref.divergence_fwd(op, x, tt, True, beta)
    dx, _ = ref.divergence_bwd(op, f64(g), x, tt, True, beta)
    dz = scale * (dx - np.exp(x) * dx.sum(-1, keepdims=True))
    logits = z.clone()
    got = ops.divergence_logits_(logits, t, g, KINDS[op], True, beta, scale)
    assert got.dtype == torch.float32 and logits.dtype == z.dtype
    np.testing.assert_allclose(f64(got), rows, rtol=1e-5, atol=1e-6)
    tol = {"float32": (1e-5, 1e-7), "bfloat16": (8e-3, 1e-6)}[dtype]
    np.testing.assert_allclose(f64(logits), dz, rtol=tol[0], atol=tol[1])
    assert torch.all(logits[1] == 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_opcheck(dtype):
    x, t = pair((2, 3, 40), dtype)
    x, t = x.detach(), t.detach()
    dloss = torch.randn(2, 3)
    for op, args in [
        (ops.divergence_fwd, (x.clone().requires_grad_(True), t.clone().requires_grad_(True), 1, True, 0.5)),
        (ops.divergence_fwd, (x.clone().requires_grad_(True), t.exp(), 0, False, 0.0)),
        (ops.divergence_fwd, (x, t, 2, True, 0.0)),
        (ops.divergence_bwd, (dloss, x, t, 1, True, 0.25, False)),
        (ops.divergence_bwd, (dloss, x, t, 0, True, 0.0, True)),
        (ops.divergence_logits_, (x.clone(), t, dloss, 1, True, 0.5, 0.5)),
    ]:
        torch.library.opcheck(op.default, args)


def test_torch_compile_fullgraph():
    """Distillation from logits: log_softmax of student and teacher, the JSD, compiled with
    fullgraph=True, matches eager."""
    torch.manual_seed(0)
    student0, teacher = torch.randn(6, 32), torch.randn(6, 32)
    labels = torch.tensor([1, 2, -100, 3, 4, 5])

    def loss_fn(s):
        return ft.jsd(s.log_softmax(-1), teacher.log_softmax(-1), beta=0.5, labels=labels) + ft.kl_div(
            s.log_softmax(-1), teacher.log_softmax(-1), log_target=True
        )

    def step(fn):
        s = student0.clone().requires_grad_(True)
        loss = fn(s)
        loss.backward()
        return loss.detach(), s.grad

    eager = step(loss_fn)
    torch._dynamo.reset()
    compiled = step(torch.compile(loss_fn, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_export_round_trip():
    class Distill(torch.nn.Module):
        def forward(self, s, t):
            return ft.tvd(s.log_softmax(-1), t.log_softmax(-1))

    s, t = torch.randn(4, 10), torch.randn(4, 10)
    program = torch.export.export(Distill(), (s, t))
    torch.testing.assert_close(program.module()(s, t), Distill()(s, t))
