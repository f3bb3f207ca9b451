"""fuselet.jax's vocab-parallel fused_linear_logprobs on 8 CPU devices
(tests/jax/vocab_parallel_logprobs_child.py runs in a subprocess: XLA_FLAGS must be set before jax
is imported).

The head (weight, bias) sharded on V over "model", the tokens over "data" (meshes 1x2, 1x4, 2x4,
8x1, and 2x4 of Explicit axes; the axis_name= form inside shard_map): every output (log_probs,
entropy, log_sum_sq_probs, mean_logits, is_top1) and every gradient (through log_probs and entropy)
equal to the one-device call (float32, 1e-5 relative; is_top1 exactly, ties of the largest logit
across devices included), the head never gathered (no all-gather in the compiled HLO), the
statistics combined by all-reduces of [chunk]-sized values, dweight left sharded; uneven V (1001
over 4) and tokens (30 over 2); and fused_linear_grpo_loss with entropy_coef, top_entropy_quantile
< 1 and its per-token outputs over the sharded head."""

from __future__ import annotations

import pytest

from tests.jax.multi_device import CHUNK_COPIES, others, run_on_8_cpu_devices, size

pytestmark = pytest.mark.processes  # the make test tier (tests/conftest.py)

pytest.importorskip("jax", reason="jax is not installed in this environment")

CHUNK, H, V = 5, 16, 64  # the child's chunk_size and problem
TOL = 1e-5


@pytest.fixture(scope="module")
def results() -> dict:
    return run_on_8_cpu_devices("tests.jax.vocab_parallel_logprobs_child")


def test_all_equal_to_one_device(results):
    """Every case: the outputs and the gradients within 1e-5 relative of the one-device call (a
    differing is_top1 would be 1)."""
    worst = {k: v["rel_diff"] for k, v in results.items() if not v["rel_diff"] <= TOL}
    assert worst == {}, worst
    assert len(results) == 16, sorted(results)


@pytest.mark.parametrize("case", ["1x2/scaled", "1x4/scaled", "2x4/plain", "2x4/scaled", "2x4/no_bias", "explicit/scaled"])
def test_head_never_gathered(results, case):
    """The head sharded over "model": no all-gather, per chunk a pmax and a pmin (is_top1's argmax)
    of [chunk] and a psum of [5, chunk] float32 (the sum of exponentials, the target's logit, the
    entropy's, log_sum_sq_probs' and mean_logits' sums), none as large as the head; dweight left
    sharded on "model"."""
    r = results[f"logprobs/{case}"]
    assert r["rel_diff"] <= TOL and r["collectives"]["all-gather"] == 0, r
    assert r["all_reduces"].count([CHUNK]) == 2 * CHUNK_COPIES and [5, CHUNK] in r["all_reduces"], r["all_reduces"]
    assert all(size(s) < V * H for s in r["all_reduces"]), r["all_reduces"]
    assert r["dweight_spec"].startswith("P('model'"), r["dweight_spec"]


def test_entropy_alone(results):
    """outputs=("entropy",): a pmax of [chunk] and a psum of [3, chunk], no pmin."""
    r = results["logprobs/2x4/entropy_only"]
    assert r["rel_diff"] <= TOL and r["collectives"]["all-gather"] == 0, r
    assert r["all_reduces"].count([CHUNK]) == CHUNK_COPIES and [3, CHUNK] in r["all_reduces"], r["all_reduces"]


def test_is_top1_ties_across_devices(results):
    """Classes 3, 9 (one device's block) and 61 (another's) share the largest logit: is_top1 True
    for class 3 alone (ties to the lowest class), as on one device (4 tokens)."""
    r = results["logprobs/2x4/top1_ties"]
    assert r["rel_diff"] <= TOL and r["top1_count"] == 4, r


@pytest.mark.parametrize("case", ["v1001", "tokens_uneven"])
def test_uneven(results, case):
    """V = 1001 over 4 devices (XLA pads the last blocks; the padding classes masked) and 30 tokens
    over 2 (a padded token): the vocab-parallel combine runs, and the one-device result."""
    r = results[f"logprobs/2x4/{case}"]
    assert r["rel_diff"] <= TOL and [5, CHUNK] in r["all_reduces"], r


def test_data_parallel_only_mesh(results):
    """8 x 1: the head whole, each device runs the logprobs kernel's loop over its own tokens; no
    gather, one all-reduce (the head's gradient over data)."""
    r = results["logprobs/8x1/scaled"]
    assert r["rel_diff"] <= TOL and others(r["collectives"], "all-reduce") == {} and r["collectives"]["all-reduce"] == 1, r


@pytest.mark.parametrize("v", [64, 1001])
def test_axis_name_form(results, v):
    """Inside shard_map over (data 2, model 4), axis_name="model", the tokens over data: every
    output and the gradients through log_probs and entropy (V 64; V 1001 in blocks padded with
    NaN, vocab_size=1001)."""
    r = results[f"axis_name/v{v}"]
    assert r["rel_diff"] <= TOL, r


@pytest.mark.parametrize("case", ["entropy_coef", "top_entropy_quantile", "both"])
def test_grpo_entropies_over_sharded_head(results, case):
    """fused_linear_grpo_loss with the entropies (and return_per_token) over a head and bias sharded
    on "model", sequences on "data": the one-device loss, gradients and per-token outputs; the
    entropies' statistics combined per chunk ([3, chunk]), no gather of the head (the high-entropy
    mask's quantile gathers the [B, T] entropies over data, nothing larger), dweight sharded."""
    r = results[f"grpo/{case}"]
    assert r["rel_diff"] <= TOL and [3, CHUNK] in r["all_reduces"], r
    assert all(size(s) <= 8 * 4 for s in r["all_gathers"]), r["all_gathers"]
    assert r["dweight_spec"].startswith("P('model'"), r["dweight_spec"]
