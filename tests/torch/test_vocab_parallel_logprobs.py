"""Vocab-parallel fused_linear_logprobs and fused_linear_grpo_loss with its entropies: the head's
rows sharded over 2 and 4 CPU processes (gloo, loopback). tests/torch/vocab_parallel_logprobs_child.py
runs every check in every process; each compares every output (log_probs, entropy,
log_sum_sq_probs, mean_logits; is_top1 exactly) and every gradient (hidden, this rank's rows of
weight and bias; upstream gradients through log_probs and entropy) with the same call on one
process over the whole head.

The cases: temperature and logit_scale, softcap, an ignore_index inside [0, V), no bias, the
outputs alone or in part, ties of the largest logit across ranks, shards of unequal sizes (the
process_group door: sizes that differ per rank; DTensor: V not divisible by the ranks, down to a
rank with no rows), DTensor heads with the tokens replicated, sequence-sharded, or split over a
data-parallel dim of a 2-D mesh; GRPO with entropy_coef, top_entropy_quantile < 1 and
return_per_token through both doors."""

from __future__ import annotations

import pytest
import torch

from tests.torch.gloo import run_children

TOL = 1e-5  # float32, relative to each tensor's largest entry: sums over shards round differently
BF16_TOL = 3e-2  # a few bfloat16 ulps of each tensor's largest entry
# and above 0: bfloat16 is never float32 to the bit, so a 0 would be a comparison that sees nothing

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is unavailable"),
    pytest.mark.processes,
]

OPTIONS = ("plain", "scaled", "softcap", "ignore_index_in_range", "log_probs_only", "entropy_only", "stats_only")


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request) -> dict:
    run = run_children("tests.torch.vocab_parallel_logprobs_child", request.param, 300, ("-W", "ignore::FutureWarning"))
    return {"world": request.param, **run}


def _get(results, name) -> dict:
    r = results[name]
    assert "error" not in r, r["error"]
    assert r["max_rel"] < TOL, r
    if "top1_equal" in r:
        assert r["top1_equal"], r
    return r


@pytest.mark.parametrize("options", OPTIONS)
def test_process_group_uneven(results, options):
    """The process_group door, per-rank sizes that differ (V = 23): every output asked for (and
    only those) equal to one process's, the gradients too."""
    r = _get(results, f"plain_{options}")
    assert len(set(r["sizes"])) > 1 and sum(r["sizes"]) == 23, r
    asked = {"log_probs_only": [], "entropy_only": ["entropy"], "stats_only": ["is_top1"]}
    expected = asked.get(options, ["entropy", "log_sum_sq_probs", "mean_logits", "is_top1"])
    assert r["outputs"] == ["log_probs", *expected], r


@pytest.mark.parametrize("case", ["even", "no_bias", "log_probs_grad_only"])
def test_process_group(results, case):
    _get(results, f"plain_{case}")


def test_process_group_blocks_of_classes(results):
    """230 classes beside 13 tokens (chunks of 5): every rank's backward walks its classes by
    blocks (spec.vocab_block_for)."""
    r = _get(results, "plain_wide")
    assert min(r["sizes"]) >= 4 * 13 and sum(r["sizes"]) == 230, r


def test_is_top1_ties_across_ranks(results):
    """The largest logit shared by classes 3, 5 (one rank) and 20 (another): True for class 3
    alone, as on one process (3 of the tokens)."""
    r = _get(results, "plain_top1_ties")
    assert r["top1_equal"] and r["top1_count"] == 3, r


@pytest.mark.parametrize("vocab", [24, 23, 5])
def test_dtensor_head_sharded(results, vocab):
    """weight / bias Shard(0), hidden replicated: the head stays sharded (its gradient Shard(0),
    hidden's Replicate, the outputs Replicate); per chunk (13 tokens in chunks of 5: 3) one
    all-gather of [k, chunk] float32, and dhidden's one all-reduce in the backward."""
    r = _get(results, f"dtensor_v{vocab}")
    assert r["grads"] == ["R", "S(0)"] and r["out"] == ["R"], r
    assert r["fwd"] == {"_allgather_base_": 3} and r["bwd"] == {"allreduce_": 1}, r


def test_dtensor_sequence_parallel(results):
    """hidden / target Shard(0) over the tensor-parallel dim itself: gathered for the loss,
    hidden's gradient reduce-scattered back to Shard(0) (no all-reduce)."""
    r = _get(results, "dtensor_hidden_sharded")
    assert r["grads"] == ["S(0)", "S(0)"], r
    assert r["fwd"]["_allgather_base_"] == 3 and r["bwd"].get("reduce_scatter_tensor") == 1, r
    assert "allreduce_" not in r["bwd"], r


def test_dtensor_2d_mesh(results):
    """(data 2 x tensor 2): tokens Shard(0) over data (and so the outputs), the head over tensor."""
    if results["world"] != 4:
        pytest.skip("a 2 x 2 mesh needs 4 processes")
    r = _get(results, "dtensor_2d_mesh")
    assert r["grads"] == ["S(0)", "R", "P(sum)", "S(0)"] and r["out"] == ["S(0)", "R"], r
    assert r["fwd"] == {"_allgather_base_": 2}, r  # 6 tokens per data rank: 2 chunks


GRPO = ("entropy_coef", "top_entropy_quantile", "both", "return_per_token")


@pytest.mark.parametrize("options", GRPO)
def test_grpo_entropies_process_group(results, options):
    """fused_linear_grpo_loss with process_group and the entropies (the entropy bonus, the
    high-entropy mask, both with temperature and the KL term, the per-token outputs): the loss,
    the gradients and the per-token log_probs / entropy equal to one process's."""
    r = _get(results, f"grpo_plain_{options}")
    assert len(set(r["sizes"])) > 1, r


@pytest.mark.parametrize("options", GRPO)
def test_grpo_entropies_dtensor_head(results, options):
    """The same over a head Shard(0): no gathered head (16 tokens in chunks of 5: 4 all-gathers of
    statistics, then dhidden's one all-reduce in the backward)."""
    r = _get(results, f"grpo_dtensor_{options}")
    assert r["grads"] == ["R", "S(0)", "S(0)"], r
    assert r["fwd_bwd"] == {"_allgather_base_": 4, "allreduce_": 1}, r


def test_bfloat16(results):
    """bfloat16 through the process_group door against float32 on the same values: as close as one
    process's bfloat16 (hidden's gradient, summed from the ranks' bfloat16 shares, within 1.5x)."""
    r = _get(results, "bfloat16")
    assert 0 < r["bf16_rel"] < BF16_TOL and r["dtypes"] == ["torch.bfloat16"] * 3, r
    assert all(o <= 1.5 * p + 1e-6 for o, p in zip(r["vocab_parallel"], r["one_process"])), r


def test_refusals(results):
    errors = _get(results, "refusals")["errors"]
    expected = {
        "outputs": "ValueError: outputs: expected the same on every rank of process_group, got 0 on rank 0",
        "temperature": "ValueError: temperature: expected the same on every rank of process_group, got 1.0 on rank 0",
        "tokens": "ValueError: hidden: expected the same on every rank of process_group (the tokens [N, H]",
        "target_range": "ValueError: target: expected class ids in [0, ",
        "group_type": "TypeError: process_group: expected None or a torch.distributed ProcessGroup, got str",
        "dtensor_and_group": "ValueError: process_group: expected None for DTensor inputs",
    }
    for name, start in expected.items():
        assert errors[name].startswith(start), (name, errors[name])


def test_no_tokens(results):
    """0 tokens: empty outputs, no collective of 0 rows, the gradients empty / zero."""
    r = _get(results, "no_tokens")
    assert r["shapes"] == [[0]] * 5 and r["grads"] == [[0, 8], 0.0], r
