"""fuselet ops on DTensors: tensor / sequence parallel over a 1-D mesh of 2 CPU processes (gloo,
loopback). tests/torch/dtensor_child.py runs every check once in both processes; each compares
with the same op on the unsharded tensors and counts the collectives (CommDebugMode).

Rows (every dim but the kernel's last) keep their sharding with no collective, forward and
backward; weight / bias gradients come out Partial and take one all-reduce each when reduced;
a sharded last dim (hidden, [gate, up], keys) is gathered, and still matches; cross-entropy's
sharded vocabulary is kept sharded (tests/torch/test_vocab_parallel.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.torch.gloo import run_children

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5  # float32, the same kernels on the same rows: rounding of sums over shards at most

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is unavailable"),
    pytest.mark.processes,
]


@pytest.fixture(scope="module")
def results() -> dict:
    return run_children("tests.torch.dtensor_child", 2, 240)


def _get(results, name) -> dict:
    r = results[name]
    assert "error" not in r, r["error"]
    assert r["max_diff"] < TOL, r
    return r


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_norm_sequence_parallel(results, norm):
    """SequenceParallel on ft.RMSNorm / ft.LayerNorm: no collective in forward or backward; the
    weight (and bias) gradients are Partial and reduce with one all-reduce each."""
    r = _get(results, f"{norm}_sequence_parallel")
    assert r["fwd"] == {} and r["bwd"] == {}, r
    assert r["out"] == ["S(1)"], r
    params = ["weight"] if norm == "rms_norm" else ["weight", "bias"]
    assert r["grads"] == {p: ["P(sum)"] for p in params}, r
    assert r["reduce"] == {"all_reduce": len(params)}, r


def test_add_rms_norm_sequence_sharded(results):
    r = _get(results, "add_rms_norm_sequence_sharded")
    assert r["fwd"] == {} and r["bwd"] == {}, r
    assert r["out"] == ["S(1)"] and r["grads"] == [["S(1)"], ["S(1)"], ["P(sum)"]], r


def test_gated_rms_norm_sequence_sharded(results):
    r = _get(results, "gated_rms_norm_sequence_sharded")
    assert r["fwd"] == {} and r["bwd"] == {}, r
    assert r["out"] == ["S(1)"] and r["grads"] == [["S(1)"], ["S(1)"], ["P(sum)"]], r


@pytest.mark.parametrize("name", ["rms_norm_hidden_sharded", "geglu_gated_dim_sharded"])
def test_sharded_last_dim_is_gathered(results, name):
    """x sharded on its last dim: gathered once in forward, dy once in backward; same values."""
    r = _get(results, name)
    assert r["fwd"] == {"all_gather_into_tensor": 1} and r["bwd"] == {"all_gather_into_tensor": 1}, r
    assert r["out"] == ["R"], r


def test_swiglu_mlp_tensor_parallel(results):
    """gate and up Linears colwise, ft.swiglu on this rank's [gate_r, up_r], down rowwise: only
    the rowwise all-reduce in forward; in backward the one of dx (input of both colwise
    Linears, one all-reduce each)."""
    r = _get(results, "swiglu_mlp_tensor_parallel")
    assert r["fwd"] == {"all_reduce": 1}, r
    assert r["bwd"] == {"all_reduce": 2}, r


def test_swiglu_sequence_sharded(results):
    r = _get(results, "swiglu_sequence_sharded")
    assert r["fwd"] == {} and r["bwd"] == {} and r["out"] == ["S(1)"], r


@pytest.mark.parametrize("name, dim", [("softmax_batch_sharded", 0), ("softmax_queries_sharded", 2)])
def test_softmax_leading_dim_sharded(results, name, dim):
    r = _get(results, name)
    assert r["fwd"] == {} and r["bwd"] == {} and r["out"] == [f"S({dim})"], r


@pytest.mark.parametrize("name", ["softmax_causal_queries_sharded", "softmax_keys_sharded"])
def test_softmax_gathers_keys_and_causal_queries(results, name):
    """Keys sharded, or queries with causal=True (the mask reads the query's position): gathered."""
    r = _get(results, name)
    assert r["fwd"] == {"all_gather_into_tensor": 1} and r["bwd"] == {} and r["out"] == ["R"], r


@pytest.mark.parametrize(
    "name, dim",
    [
        ("rope_sequence_sharded", 1),
        ("rope_sequence_sharded_replicated_tables", 1),
        ("rope_heads_sharded_bhsd", 1),
        ("rope_sequence_sharded_bhsd", 2),
        ("rope_pair_table_sequence_sharded", 1),
        ("rope_sections_sequence_sharded", 1),
    ],
)
def test_rope_sharded(results, name, dim):
    """Sequence or heads sharded, cos / sin sharded with the sequence or replicated: no collective."""
    r = _get(results, name)
    assert r["fwd"] == {} and r["bwd"] == {} and r["out"] == [f"S({dim})"] and r["grads"] == [[f"S({dim})"]], r


@pytest.mark.parametrize(
    "reduction, out, fwd", [("none", "S(1)", {}), ("sum", "P(sum)", {}), ("mean", "P(sum)", {"all_reduce": 1})]
)
def test_cross_entropy_sequence_sharded(results, reduction, out, fwd):
    """Tokens sharded: per-token losses stay sharded, a sum is Partial; the mean's token count is
    all-reduced once; dlogits keeps the sharding with no collective."""
    r = _get(results, f"cross_entropy_sequence_sharded_{reduction}")
    assert r["fwd"] == fwd and r["bwd"] == {} and r["out"] == [out] and r["grads"] == [["S(1)"]], r


def test_cross_entropy_vocab_sharded(results):
    """logits sharded on V stay sharded (vocab-parallel, tests/torch/test_vocab_parallel.py): the
    token-sharded target is gathered (ints), then one all-gather of [k, tokens] float32 per-row
    statistics; the per-token loss is replicated, dlogits keeps the logits' sharding."""
    r = _get(results, "cross_entropy_vocab_sharded")
    assert r["fwd"] == {"all_gather_into_tensor": 1, "_allgather_base_": 1} and r["bwd"] == {}, r
    assert r["out"] == ["R"] and r["grads"] == [["S(2)"]], r


def test_cross_entropy_inplace(results):
    """inplace_backward=True on DTensors matches; the in-place op keeps logits' placement, and
    refuses (clearly) when its dloss would need a redistribution."""
    r = _get(results, "cross_entropy_inplace_backward")
    assert r["fwd"] == {} and r["bwd"] == {} and r["op"] == {} and r["op_placements"] == ["S(1)"], r
    assert "in-place operations that require placement changes are not supported" in r["op_replicated_dloss"], r


def test_cross_entropy_fwd_bwd(results):
    r = _get(results, "cross_entropy_fwd_bwd")
    assert r["fwd"] == {} and r["out"] == ["S(1)"], r
    assert r["inplace_error"].startswith("inplace: expected False for DTensor"), r


@pytest.mark.parametrize(
    "reduction, out, fwd", [("none", "S(0)", {}), ("sum", "P(sum)", {}), ("mean", "P(sum)", {"all_reduce": 1})]
)
def test_fused_linear_cross_entropy_rows_sharded(results, reduction, out, fwd):
    """hidden / target rows sharded, weight / bias replicated: dhidden sharded, dweight / dbias Partial."""
    r = _get(results, f"fused_linear_cross_entropy_rows_sharded_{reduction}")
    assert r["fwd"] == fwd and r["bwd"] == {} and r["out"] == [out], r
    assert r["grads"] == [["S(0)"], ["P(sum)"], ["P(sum)"]], r


def test_fused_linear_logprobs_rows_sharded(results):
    """hidden / target rows sharded, weight / bias replicated: every output and dhidden sharded,
    dweight / dbias Partial, no collective."""
    r = _get(results, "fused_linear_logprobs_rows_sharded")
    assert r["fwd"] == {} and r["bwd"] == {} and r["out"] == ["S(0)"], r
    assert r["grads"] == [["S(0)"], ["P(sum)"], ["P(sum)"]], r


# The post-training losses: hidden / target (and the per-sequence tensors) sharded on their rows,
# the head weight and bias replicated. The per-token log-probabilities keep the rows' sharding
# (fused_linear_cross_entropy's rule); the losses' math over sequences runs on DTensors.


@pytest.mark.parametrize(
    "loss, gathers",
    [
        ("dpo", 2),
        ("hinge", 2),
        ("ipo", 2),
        ("simpo", 2),
        ("cpo", 4),
        ("orpo", 4),
        ("mpo", 10),
        ("ld_alpha", 4),
        ("f_divergence", 4),
    ],
)
def test_preference_loss_rows_sharded(results, loss, gathers):
    """[2B, T, H] sharded on its sequences: rank 0 holds the chosen, rank 1 the rejected ones. The
    pairs meet through all-gathers of the [2B] per-sequence log-ratios (dpo, hinge, ipo: policy
    less reference) or log-probabilities (and, for cpo and orpo, of the chosen tokens' [B, T]);
    hidden is never gathered (its gradient stays sharded). mpo, ld_alpha, f_divergence: DPO's other
    loss types summed (dtensor_child.DPO_MIXES)."""
    r = _get(results, f"preference_{loss}_rows_sharded")
    assert r["fwd"] == {"all_gather_into_tensor": gathers} and r["bwd"] == {}, r
    assert r["out"] == ["R"] and r["grads"] == [["S(0)"], ["P(sum)"], ["P(sum)"]], r


@pytest.mark.parametrize(
    "name, fwd, bwd",
    [
        ("kto_rows_sharded", {}, {"all_reduce": 1}),
        ("grpo_grpo_rows_sharded", {}, {"all_reduce": 1}),
        ("grpo_bnpo_rows_sharded", {"all_reduce": 1}, {}),
        ("grpo_dr_grpo_rows_sharded", {}, {}),
    ],
)
def test_kto_and_grpo_rows_sharded(results, name, fwd, bwd):
    """Per-sequence losses (kto, grpo) and per-token sums: a mean over rows is Partial, the token
    count of bnpo one all-reduce; dhidden sharded, dweight / dbias Partial."""
    r = _get(results, name)
    assert r["fwd"] == fwd and r["bwd"] == bwd, r
    assert r["grads"] == [["S(0)"], ["P(sum)"], ["P(sum)"]], r


@pytest.mark.parametrize("name, fwd", [("rows_sharded", {"all_reduce": 1}), ("rows_sharded_no_labels", {})])
def test_fused_linear_jsd_rows_sharded(results, name, fwd):
    """Both hiddens sharded on their tokens, both heads replicated: each rank its own tokens; the
    loss and dweight Partial, dhidden sharded; labels cost one all-reduce (the kept count)."""
    r = _get(results, f"fused_linear_jsd_{name}")
    assert r["fwd"] == fwd and r["bwd"] == {}, r
    assert r["out"] == ["P(sum)"] and r["grads"] == [["S(0)"], ["P(sum)"]], r


@pytest.mark.parametrize(
    "name, fwd, out",
    [
        ("kl_div_rows_sharded_batchmean", {}, "P(sum)"),
        ("kl_div_rows_sharded_mean", {}, "P(sum)"),
        ("kl_div_rows_sharded_none", {}, "S(0)"),
        ("jsd_rows_sharded", {"all_reduce": 1}, "P(sum)"),
        ("tvd_rows_sharded", {"all_reduce": 1}, "P(sum)"),
    ],
)
def test_divergence_rows_sharded(results, name, fwd, out):
    """input / target (and labels) sharded on rows: no collective but the kept-row count of the
    labelled mean; the gradients of input and target keep the rows' sharding."""
    r = _get(results, name)
    assert r["fwd"] == fwd and r["bwd"] == {} and r["out"] == [out], r
    assert r["grads"] == [["S(0)"], ["S(0)"]], r


def test_losses_refuse_mixed_tensors(results):
    """A torch.Tensor among DTensor arguments is refused by name, before any computation."""
    errors = _get(results, "losses_refuse_mixed_tensors")["errors"]
    names = {"preference": "target", "kto": "preference_labels", "grpo": "advantages", "jsd": "student_weight"}
    for loss, arg in names.items():
        assert errors[loss].startswith(f"{arg}: expected a DTensor on the device mesh of "), errors
    # the per-token form takes no DTensors at all
    assert errors["jsd_per_token"].startswith("student_hidden: expected a torch.Tensor (fused_linear_jsd_per_token takes"), errors


@pytest.mark.parametrize("first", ["fuselet.torch", "torch.distributed.tensor"])
def test_import_registers_every_op(first):
    """Either import order registers a rule for every fuselet op; import fuselet.torch alone
    leaves torch.distributed.tensor unimported."""
    second = "torch.distributed.tensor" if first == "fuselet.torch" else "fuselet.torch"
    code = (
        f"import sys, torch, {first}\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
        f"import {second}\n"
        "from torch.distributed.tensor import DTensor\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "ops = [getattr(torch.ops.fuselet, n.split('::')[1]).default\n"
        "       for n in torch._C._dispatch_get_all_op_names() if n.startswith('fuselet::')]\n"
        "print(len(ops), sorted(str(o) for o in ops if o not in funcs))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    imported, missing = out.stdout.split("\n")[:2]
    count, unruled = missing.split(" ", 1)
    # every op csrc/torch/registration.cpp defines, and the ops defined in Python beside them
    schemas = re.findall(r'm\.def\(\s*"([a-z_0-9]+)\(', (ROOT / "csrc/torch/registration.cpp").read_text())
    assert imported == str(first != "fuselet.torch") and unruled == "[]" and int(count) > len(schemas), out.stdout
