"""Vocab-parallel cross_entropy and fused_linear_cross_entropy: the head's rows (the logits'
classes) sharded over 2 and 4 CPU processes (gloo, loopback), as users run tensor parallel.
tests/torch/vocab_parallel_child.py runs every check in every process; each compares the loss and
the gradients (hidden, this rank's rows of weight / bias, this rank's columns of the logits) with
the same loss on one process over the whole head.

fused_linear_jsd with both heads (student's and teacher's) sharded the same way: beta 0, 0.3 and
1 (the forward KL, the mixture, the reverse KL), temperatures, labels or none, through both doors;
and the post-training losses through the process_group door, their modules too.

The cases: reduction mean / sum / none, label smoothing, z-loss, softcap, an ignore_index inside
[0, V), no bias, shards of unequal sizes (the process_group door: sizes that differ per rank;
DTensor: V not divisible by the ranks, down to a rank with no rows), DTensor logits / head with
the tokens replicated or sharded, and a 2-D (data x tensor) mesh at 4 processes."""

from __future__ import annotations

import pytest
import torch

from tests.torch.gloo import run_children

TOL = 1e-5  # float32, relative to each tensor's largest entry: sums over shards round differently

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is unavailable"),
    pytest.mark.processes,
]

REDUCTIONS = ("mean", "sum", "none")
OPTIONS = ("plain", "label_smoothing", "z_loss", "softcap", "ignore_index_in_range", "all")


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request) -> dict:
    run = run_children("tests.torch.vocab_parallel_child", request.param, 300, ("-W", "ignore::FutureWarning"))
    return {"world": request.param, **run}


def _get(results, name) -> dict:
    r = results[name]
    assert "error" not in r, r["error"]
    assert r["max_rel"] < TOL, r
    return r


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("loss", ["flce", "ce"])
def test_process_group_uneven(results, loss, reduction, options):
    """The process_group door, per-rank sizes that differ (V = 23)."""
    r = _get(results, f"{loss}_plain_{reduction}_{options}")
    assert len(set(r["sizes"])) > 1 and sum(r["sizes"]) == 23, r


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", ["flce_plain_{}_even", "flce_plain_{}_no_bias", "ce_plain_{}_even"])
def test_process_group(results, case, reduction):
    _get(results, case.format(reduction))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_process_group_blocks_of_classes(results, reduction):
    """230 classes beside 13 tokens (chunks of 5): every rank's backward recomputes its logits
    block of classes by block (spec.vocab_block_for); a reduced loss makes its gradients so in its
    forward, after the per-token pass (spec.one_pass_for)."""
    r = _get(results, f"flce_plain_{reduction}_wide")
    assert min(r["sizes"]) >= 4 * 13 and sum(r["sizes"]) == 230, r


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("vocab", [24, 23, 5])
def test_fused_linear_dtensor_head_sharded(results, reduction, vocab):
    """weight / bias Shard(0), hidden replicated: the head stays sharded (its gradient Shard(0),
    hidden's Replicate); per chunk (5 tokens of 13: 3 chunks) one all-gather of [k, chunk]
    float32, dhidden's one all-reduce (in the forward for a reduced loss, else the backward)."""
    r = _get(results, f"flce_dtensor_{reduction}_v{vocab}")
    assert r["grads"] == ["R", "S(0)"], r
    gathers = {"_allgather_base_": 3}
    if reduction == "none":
        assert r["fwd"] == gathers and r["bwd"] == {"allreduce_": 1}, r
    else:
        assert r["fwd"] == {**gathers, "allreduce_": 1} and r["bwd"] == {}, r


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_linear_dtensor_2d_mesh(results, reduction):
    """A (data 2 x tensor 2) mesh: tokens Shard(0) over data, the head Shard(0) over tensor."""
    if results["world"] != 4:
        pytest.skip("a 2 x 2 mesh needs 4 processes")
    r = _get(results, f"flce_dtensor_{reduction}_2d_mesh")
    assert r["grads"] == ["S(0)", "R", "P(sum)", "S(0)"], r


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", ["v24", "v23", "v5", "target_sharded"])
def test_cross_entropy_dtensor_vocab_sharded(results, reduction, case):
    """logits Shard(2) (classes): kept sharded, one all-gather of [k, tokens] float32; a target
    sharded on the tokens is gathered first (ints, not logits)."""
    r = _get(results, f"ce_dtensor_{reduction}_{case}")
    assert r["grads"] == ["S(2)"] and r["out"] == ["R"] and r["bwd"] == {}, r
    assert r["fwd"].get("_allgather_base_") == 1, r


def test_refusals(results):
    errors = _get(results, "refusals")["errors"]
    expected = {
        "hidden_shape": "ValueError: hidden: expected the same on every rank of process_group (the tokens [N, H]",
        "label_smoothing": "ValueError: label_smoothing: expected the same on every rank of process_group, got 0.0 on rank 0",
        "ce_logits_rows": "ValueError: logits: expected the same on every rank of process_group (the tokens",
        "target_range": "ValueError: target: expected class ids in [0, ",
        "group_type": "TypeError: process_group: expected None or a torch.distributed ProcessGroup, got str",
        "dtensor_and_group": "ValueError: process_group: expected None for DTensor inputs",
        "mixed": "TypeError: hidden: expected a DTensor on the device mesh of weight",
    }
    for name, start in expected.items():
        assert errors[name].startswith(start), (name, errors[name])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_linear_dtensor_hidden_sequence_sharded(results, reduction):
    """hidden / target Shard(0) over the tensor-parallel dim itself (sequence parallel): gathered
    before the loss (one all-gather each), hidden's gradient reduce-scattered back to Shard(0)
    in the backward (each rank's share, no all-reduce)."""
    r = _get(results, f"flce_dtensor_{reduction}_hidden_sharded")
    assert r["grads"] == ["S(0)", "S(0)"], r
    assert r["fwd"] == {"all_gather_into_tensor": 2, "_allgather_base_": 3}, r
    assert r["bwd"] == {"reduce_scatter_tensor": 1}, r


@pytest.mark.parametrize("loss, chunks", [("dpo", 8), ("orpo", 4), ("simpo", 4), ("kto", 8), ("grpo", 4)])
def test_post_training_losses_head_sharded(results, loss, chunks):
    """The preference, KTO and GRPO losses over a head (and a reference head) Shard(0): their
    log-probabilities run vocab-parallel, one all-gather of statistics per chunk (16 tokens in
    chunks of 5: 4 per model) and no gathered head (no DTensor all-gather at all)."""
    r = _get(results, f"post_training_{loss}_head_sharded")
    assert r["fwd"] == {"_allgather_base_": chunks}, r
    assert r["grads"] == ["R", "S(0)", "S(0)"], r


def test_no_tokens(results):
    """0 tokens: no collective of 0 rows, the losses 0 (or empty), the gradients zero / empty."""
    r = _get(results, "no_tokens")["results"]
    for reduction in REDUCTIONS:
        assert r[reduction] == [0.0, 0.0, [0, 8], 0.0, [0, 4]], (reduction, r)


BF16_TOL = 1e-2  # 2.5 bfloat16 ulps (2^-8 relative) of each tensor's largest entry
# and above 0: bfloat16 is never float32 to the bit, so a 0 would be a comparison that sees nothing


def test_bfloat16(results):
    """bfloat16 through the process_group door against float32 on the same values: within a few
    bfloat16 ulps, as on one process (the one entry per row that the shard's backward writes
    itself is computed in float32: adding a correction to the kernel's bfloat16 entry cancelled,
    10 % off at 4 ranks). hidden's gradient, the sum of the ranks' bfloat16 shares, is rounded
    once per rank more than on one process."""
    r = _get(results, "bfloat16")
    assert 0 < r["bf16_rel"] < BF16_TOL and r["dtypes"] == ["torch.bfloat16"] * 3, r
    # rank 0's: the loss and its rows of the head's gradient as close as one process's
    one, ours = r["one_process"], r["vocab_parallel"]
    assert all(o <= 1.5 * p + 1e-6 for o, p in zip([ours[0], ours[2], ours[3]], [one[0], one[2], one[3]])), r


def test_refuses_a_head_split_over_two_mesh_dims(results):
    if results["world"] != 4:
        pytest.skip("a 2 x 2 mesh needs 4 processes")
    errors = _get(results, "refusals")["errors"]
    assert errors["weight_two_dims"].startswith("ValueError: weight: expected Shard(0) on at most one mesh dimension"), errors
    assert errors["logits_two_dims"].startswith("ValueError: logits: expected its last dim (the classes) sharded over at most"), (
        errors
    )


@pytest.mark.parametrize("reduction, out", [("mean", "P(sum)"), ("sum", "P(sum)"), ("none", "S(0)")])
def test_cross_entropy_dtensor_2d_mesh(results, reduction, out):
    """logits split over dp on the batch and over tp on the classes: the batch stays split (the
    loss Partial or Shard(0) over dp, replicated over tp), dlogits keeps both splits."""
    if results["world"] != 4:
        pytest.skip("a 2 x 2 mesh needs 4 processes")
    r = _get(results, f"ce_dtensor_{reduction}_2d_mesh")
    assert r["out"] == [out, "R"] and r["grads"] == ["S(0)", "S(2)"], r
    assert r["fwd"].get("_allgather_base_") == 1, r


JSD_OPTIONS = ("beta0", "beta03", "beta1")


@pytest.mark.parametrize("case", [*(f"jsd_plain_{o}" for o in JSD_OPTIONS), "jsd_plain_no_labels", "jsd_plain_even"])
def test_jsd_process_group(results, case):
    """fused_linear_jsd through the process_group door: each rank's rows of both heads (sizes
    that differ per rank, or even), the loss and the student's gradients (hidden: whole;
    weight: the rank's rows) equal to one process's."""
    r = _get(results, case)
    assert sum(r["sizes"]) == (24 if case.endswith("even") else 23), r


@pytest.mark.parametrize("case", ["v24", "v23", "v5", "teacher_replicated"])
def test_jsd_dtensor_heads_sharded(results, case):
    """Both heads Shard(0) (V 24, 23, and 5: an empty shard at 4 ranks; or the teacher's
    replicated, resharded without communication): kept sharded, per chunk (13 tokens in chunks
    of 5: 3) two all-gathers of [2, chunk] float32 (the log-sum-exps, then the divergence's and
    its gradient's sums), dhidden's one all-reduce; no gathered head."""
    r = _get(results, f"jsd_dtensor_{case}")
    assert r["grads"] == ["R", "S(0)"] and r["out"] == ["R"], r
    assert r["fwd"] == {"_allgather_base_": 6, "allreduce_": 1}, r


def test_jsd_dtensor_sequence_parallel(results):
    """The tokens Shard(0) over the tensor-parallel dim itself: gathered (both hiddens and the
    tokens' weights), student_hidden's gradient reduce-scattered back, no all-reduce of it."""
    r = _get(results, "jsd_dtensor_hidden_sharded")
    assert r["grads"] == ["S(0)", "S(0)"], r
    assert r["fwd"]["_allgather_base_"] == 6 and r["fwd"]["reduce_scatter_tensor"] == 1 and "allreduce_" not in r["fwd"], r


def test_jsd_dtensor_2d_mesh(results):
    """(data 2 x tensor 2): tokens Shard(0) over data, both heads Shard(0) over tensor."""
    if results["world"] != 4:
        pytest.skip("a 2 x 2 mesh needs 4 processes")
    r = _get(results, "jsd_dtensor_2d_mesh")
    assert r["grads"] == ["S(0)", "R", "P(sum)", "S(0)"] and r["out"] == ["P(sum)", "R"], r
    assert r["fwd"]["_allgather_base_"] == 4, r  # 6 tokens per data rank: 2 chunks


def test_jsd_bfloat16(results):
    """bfloat16 through the process_group door against float32 on the same values: as close as
    one process's bfloat16 (dhidden, summed from the ranks' bfloat16 shares, within 1.5x)."""
    r = _get(results, "jsd_bfloat16")
    assert 0 < r["bf16_rel"] < BF16_TOL and r["dtypes"] == ["torch.bfloat16"] * 2, r
    assert all(o <= 1.5 * p + 1e-6 for o, p in zip(r["vocab_parallel"], r["one_process"])), r


def test_process_group_refusals(results):
    errors = _get(results, "process_group_refusals")["errors"]
    expected = {
        "beta": "ValueError: beta: expected the same on every rank of process_group, got 0.0 on rank 0",
        "tokens": "ValueError: student_hidden: expected the same on every rank of process_group (the tokens [N, H]",
        "group_type": "TypeError: process_group: expected None or a torch.distributed ProcessGroup, got str",
        "dtensor_and_group": "ValueError: process_group: expected None for DTensor inputs",
    }
    for name, start in expected.items():
        assert errors[name].startswith(start), (name, errors[name])


@pytest.mark.parametrize("loss", ["dpo", "orpo", "simpo", "kto", "grpo"])
def test_post_training_losses_process_group(results, loss):
    """The preference, KTO and GRPO losses with plain tensors and process_group: each rank's
    rows of the head, its bias and the reference head (sizes that differ per rank); the loss and
    the gradients (hidden whole, the head's rows) equal to one process's."""
    r = _get(results, f"post_training_{loss}_process_group")
    assert len(set(r["sizes"])) > 1, r


@pytest.mark.parametrize("case", ["jsd", "post_training_dpo", "post_training_kto", "post_training_grpo"])
def test_modules_process_group(results, case):
    """FusedLinearJSD, FusedLinearPreferenceLoss, FusedLinearKTOLoss and FusedLinearGRPOLoss with
    process_group at construction: each rank's rows of the heads, the function's one-process
    result."""
    r = _get(results, f"{case}_module_process_group")
    assert len(set(r["sizes"])) > 1, r
