"""fuselet.torch's log-probabilities of a chunk of logits (cross_entropy.logprobs_chunk and
logprobs_chunk_grad_, the raw ops logprobs_fwd and logprobs_bwd_) against the float64 reference
(tests/reference.py) and torch's float64 autograd: every output, softcap, ignored tokens, ties
for is_top1, the gradient of log_probs and entropy (in place), opcheck."""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
ft = import_layer("torch")
from fuselet.torch.cross_entropy import logprobs_chunk, logprobs_chunk_grad_  # noqa: E402

ops = torch.ops.fuselet
ALL = frozenset({"entropy", "log_sum_sq_probs", "mean_logits", "is_top1"})
TIE = 16.0  # exact in every dtype, above every random logit


def make(n, vocab, dtype, device="cpu", seed=0, ignore_index=-100, target_dtype=torch.int64):
    """logits [n, vocab] rounded to dtype; every 4th token ignored; tokens 2 mod 4 tie their
    target's logit with another class's at the row's max, before the target (is_top1 False) or
    after it (True)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, vocab)) * 3.0
    target = rng.integers(0, vocab, n)
    for r in range(2, n, 4):
        other = (target[r] - 1) % vocab if r % 8 == 2 else (target[r] + 1) % vocab
        logits[r, target[r]] = logits[r, other] = TIE
    target[1::4] = ignore_index
    logits = torch.from_numpy(logits).to(getattr(torch, dtype)).to(device)
    return logits, torch.from_numpy(target).to(device=device, dtype=target_dtype)


def f64(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


@pytest.mark.parametrize("softcap", [None, 5.0], ids=["plain", "softcap"])
@pytest.mark.parametrize("vocab", [1, 3, 4097])
def test_forward_backward(dtype, vocab, softcap, torch_device):
    logits, target = make(11, vocab, dtype, torch_device)
    out = logprobs_chunk(logits, target, ignore_index=-100, softcap=softcap, outputs=ALL)
    assert set(out) == {"log_probs", "lse", *ALL}
    want = ref.logprobs_fwd(f64(logits), target.cpu().numpy(), -100, softcap)
    for name, value in out.items():
        assert value.shape == target.shape and value.device == logits.device
        if name == "is_top1":
            assert value.dtype == torch.bool
            np.testing.assert_array_equal(value.cpu().numpy(), want[name].astype(bool), err_msg=name)
        else:
            assert value.dtype == torch.float32
            ref.assert_close(f64(value), want[name], "float32", name=name)
    ties = target[2::4].cpu().numpy()
    if vocab > 1:
        expect = [(t + (vocab - 1 if r % 8 == 2 else 1)) % vocab > t for r, t in zip(range(2, 11, 4), ties)]
        assert out["is_top1"][2::4].tolist() == expect, "ties go to the lowest index"
    rng = np.random.default_rng(1)
    dlogp, dentropy = (torch.from_numpy(rng.standard_normal(11)).float().to(torch_device) for _ in range(2))
    dx = logits.clone()
    assert logprobs_chunk_grad_(dx, target, out["lse"], out["entropy"], dlogp, dentropy, ignore_index=-100, softcap=softcap) is dx
    want_dx = ref.logprobs_bwd(f64(dlogp), f64(dentropy), f64(logits), target.cpu().numpy(), -100, softcap)
    assert dx.dtype == logits.dtype
    ref.assert_close(f64(dx), want_dx, dtype, name="dlogits")


def autograd_reference(logits, target, dlogp, dentropy, ignore_index, softcap):
    """The gradient of sum(dlogp log_probs + dentropy entropy) by torch's float64 autograd."""
    x = logits.detach().double().cpu().requires_grad_(True)
    s = x if softcap is None else softcap * torch.tanh(x / softcap)
    logp_all = torch.log_softmax(s, dim=-1)
    t = target.cpu().clamp(min=0)
    valid = (target.cpu() != ignore_index).double()
    logp = logp_all.gather(-1, t[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    total = (valid * (dlogp.double().cpu() * logp + dentropy.double().cpu() * entropy)).sum()
    (grad,) = torch.autograd.grad(total, x)
    return grad.numpy()


@pytest.mark.parametrize("which", ["both", "dlogp", "dentropy"])
@pytest.mark.parametrize("softcap", [None, 10.0], ids=["plain", "softcap"])
def test_gradient_against_autograd(which, softcap, torch_device):
    logits, target = make(9, 257, "float32", torch_device, seed=3, ignore_index=2)
    out = logprobs_chunk(logits, target, ignore_index=2, softcap=softcap, outputs={"entropy"})
    assert set(out) == {"log_probs", "lse", "entropy"}
    rng = np.random.default_rng(4)
    dlogp, dentropy = (torch.from_numpy(rng.standard_normal(9)).float().to(torch_device) for _ in range(2))
    want = autograd_reference(
        logits,
        target,
        dlogp if which != "dentropy" else torch.zeros(9),
        dentropy if which != "dlogp" else torch.zeros(9),
        2,
        softcap,
    )
    dx = logits.clone()
    logprobs_chunk_grad_(
        dx,
        target,
        out["lse"],
        out["entropy"] if which != "dlogp" else None,
        dlogp if which != "dentropy" else None,
        dentropy if which != "dlogp" else None,
        ignore_index=2,
        softcap=softcap,
    )
    ref.assert_close(f64(dx), want, "float32", name=f"dlogits of {which}")


def test_outputs_asked_for(torch_device):
    logits, target = make(5, 33, "bfloat16", torch_device)
    assert set(logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs=set())) == {"log_probs", "lse"}
    out = logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs={"is_top1"})
    assert set(out) == {"log_probs", "lse", "is_top1"}
    raw = ops.logprobs_fwd(logits, target, -100, 0.0, False, False)
    assert [tuple(t.shape) for t in raw] == [(5,), (5,), (0,), (0,), (0,), (0,)]


def test_int32_targets_and_leading_dims(torch_device):
    logits, target = make(12, 50, "float16", torch_device, target_dtype=torch.int32)
    out = logprobs_chunk(logits.view(3, 4, 50), target.view(3, 4), ignore_index=-100, softcap=None, outputs=ALL)
    flat = logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs=ALL)
    for name in flat:
        assert out[name].shape == (3, 4)
        assert torch.equal(out[name].reshape(12), flat[name]), name


def test_noncontiguous_logits_in_place(torch_device):
    base, target = make(6, 40, "float32", torch_device)
    logits = base.t().contiguous().t()  # the same values, column-major
    assert not logits.is_contiguous()
    out = logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs={"entropy"})
    g = torch.ones(6, device=torch_device)
    logprobs_chunk_grad_(logits, target, out["lse"], out["entropy"], g, g, ignore_index=-100, softcap=None)
    want = ref.logprobs_bwd(np.ones(6), np.ones(6), f64(base), target.cpu().numpy())
    ref.assert_close(f64(logits), want, "float32", name="dlogits written back")


@pytest.mark.parametrize("bad", [40, -1])
def test_bad_target_value(bad):
    logits, target = make(4, 40, "float32")
    target[3] = bad
    with pytest.raises(ValueError, match=rf"target: element 3 is {bad}, outside \[0, 40\)"):
        logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs=set())
    out_lse = torch.zeros(4)
    with pytest.raises(ValueError, match="target: element 3"):
        logprobs_chunk_grad_(logits, target, out_lse, None, torch.ones(4), None, ignore_index=-100, softcap=None)


def test_dentropy_needs_entropy():
    logits, target = make(4, 8, "float32")
    out = logprobs_chunk(logits, target, ignore_index=-100, softcap=None, outputs=set())
    with pytest.raises(ValueError, match=r"entropy: expected a tensor \(the forward's entropy, needed with dentropy\)"):
        logprobs_chunk_grad_(logits, target, out["lse"], None, None, torch.ones(4), ignore_index=-100, softcap=None)


def test_opcheck(torch_device):
    logits, target = make(6, 17, "float32", torch_device)
    torch.library.opcheck(ops.logprobs_fwd, (logits, target, -100, 3.0, True, True))
    torch.library.opcheck(ops.logprobs_fwd, (logits, target, -100, 0.0, False, False))
    lse, entropy = ops.logprobs_fwd(logits, target, -100, 3.0, True, False)[1:3]
    g = torch.ones(6, device=torch_device)
    torch.library.opcheck(ops.logprobs_bwd_, (logits.clone(), target, lse, entropy, g, g, -100, 3.0))
    torch.library.opcheck(ops.logprobs_bwd_, (logits.clone(), target, lse, None, g, None, -100, 3.0))


def test_torch_compile_fullgraph():
    logits, target = make(6, 17, "float32")

    def step(x, t):
        out = logprobs_chunk(x, t, ignore_index=-100, softcap=None, outputs={"entropy"})
        dx = x.clone()
        logprobs_chunk_grad_(dx, t, out["lse"], out["entropy"], None, torch.ones(6), ignore_index=-100, softcap=None)
        return out["log_probs"], dx

    got = torch.compile(step, fullgraph=True, backend="aot_eager")(logits, target)
    want = step(logits, target)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
