"""fuselet.jax's vocab-parallel losses on 8 CPU devices (tests/jax/vocab_parallel_child.py runs in a
subprocess: XLA_FLAGS must be set before jax is imported).

fused_linear_cross_entropy with the head sharded on V over "model" and the tokens over "data"
(meshes data x model 1x2, 1x4, 2x4, 8x1), cross_entropy with logits sharded on V, the axis_name=
form inside shard_map (fused_linear_cross_entropy, cross_entropy, fused_linear_jsd), uneven V (1001
over 2 and 4 devices), 2-D meshes of Auto and Explicit axes and the post-training losses over a
sharded head, fused_linear_jsd over sharded student and teacher heads: the loss and every gradient
equal to the one-device call (float32, 1e-5 relative), the head never gathered (no all-gather in
the compiled HLO), the statistics combined by all-reduces of [chunk]-sized float32 values, dweight
left sharded; and an out-of-range target refused in eager calls over sharded classes as over whole
ones."""

from __future__ import annotations

import pytest

from tests.jax.multi_device import CHUNK_COPIES, others, run_on_8_cpu_devices, size

pytestmark = pytest.mark.processes  # the make test tier (tests/conftest.py)

pytest.importorskip("jax", reason="jax is not installed in this environment")

CHUNK, N, H, V = 5, 32, 16, 64  # the child's chunk_size and problem
TOL = 1e-5


@pytest.fixture(scope="module")
def results() -> dict:
    return run_on_8_cpu_devices("tests.jax.vocab_parallel_child")


def _cases(results, prefix):
    cases = {k: v for k, v in results.items() if k.startswith(prefix)}
    assert cases, prefix
    return cases


def test_all_equal_to_one_device(results):
    """Every case: loss and gradients within 1e-5 relative of the one-device call."""
    worst = {k: v["rel_diff"] for k, v in results.items() if not v["rel_diff"] <= TOL}
    assert worst == {}, worst
    assert len(results) >= 84, sorted(results)


@pytest.mark.parametrize("mesh", ["1x2", "1x4", "2x4"])
def test_fused_linear_head_never_gathered(results, mesh):
    """The head sharded over "model": no all-gather at all, per chunk a pmax of [chunk] and a psum
    of [k, chunk] float32 (k = 3 with label smoothing, else 2), no all-reduce as large as the
    head, and dweight left sharded on "model"."""
    for name, r in _cases(results, f"flce/{mesh}/").items():
        if name.endswith("v1001"):
            continue
        assert r["collectives"]["all-gather"] == 0, (name, r["collectives"])
        k = 3 if ("label_smoothing" in name or "/all" in name) else 2
        assert [CHUNK] in r["all_reduces"] and [k, CHUNK] in r["all_reduces"], (name, r["all_reduces"])
        assert all(size(s) < V * H for s in r["all_reduces"]), (name, r["all_reduces"])
        assert r["dweight_spec"].startswith("P('model'"), (name, r["dweight_spec"])


def test_data_parallel_only_mesh(results):
    """8 x 1: tokens over "data", the classes whole: no gather, the gradients' sums over the
    data axis (the loss's, dweight's, dbias': one all-reduce)."""
    for name, r in _cases(results, "flce/8x1/").items():
        assert r["collectives"]["all-gather"] == 0 and r["collectives"]["all-reduce"] == 1, (name, r["collectives"])


def test_uneven_vocab(results):
    """V = 1001 over 4 devices (XLA pads the last blocks; the padding classes masked): the
    vocab-parallel combine runs (its [chunk] statistics) and the one-device result."""
    cases = _cases(results, "flce/") | _cases(results, "ce/")
    uneven = {k: v for k, v in cases.items() if k.endswith("v1001")}
    assert len(uneven) == 9, sorted(uneven)
    for name, r in uneven.items():
        assert r["rel_diff"] <= TOL, (name, r)
        if name.startswith("flce/"):
            assert [CHUNK] in r["all_reduces"] and [3, CHUNK] in r["all_reduces"], (name, r["all_reduces"])


@pytest.mark.parametrize("mesh", ["1x2", "1x4", "2x4"])
def test_cross_entropy_vocab_sharded_logits(results, mesh):
    """logits [4, 8, V] sharded ("data", None, "model"): no gather, one pmax and one psum of the
    rows' float32 statistics; the logits' gradient keeps their sharding (no gather either)."""
    data = int(mesh[0])
    for name, r in _cases(results, f"ce/{mesh}/").items():
        if name.endswith("v1001"):
            continue
        assert r["collectives"]["all-gather"] == 0, (name, r["collectives"])
        rows = [4 // data, 8]
        assert rows in r["all_reduces"], (name, r["all_reduces"])
        assert all(size(s) <= 3 * 32 for s in r["all_reduces"]), (name, r["all_reduces"])


def test_axis_name_form(results):
    """Inside shard_map over (data 2, model 4), axis_name="model": fused_linear_cross_entropy
    (V 64; V 1001 in blocks padded with NaN, vocab_size=1001), cross_entropy, and
    fused_linear_jsd (tokens over data without labels; with labels the tokens whole, V 64 and
    the padded V 1001)."""
    names = ("flce/v64", "flce/v1001", "ce/v64", "jsd/v64/no_labels", "jsd/v64", "jsd/v1001")
    for name in names:
        assert results[f"axis_name/{name}"]["rel_diff"] <= TOL, (name, results[f"axis_name/{name}"])


@pytest.mark.parametrize("loss", ["grpo", "dpo", "kto"])
def test_post_training_losses_over_sharded_head(results, loss):
    """fused_linear_grpo_loss, DPO and KTO take their log-probabilities from
    fused_linear_cross_entropy: over a head (and DPO's and KTO's reference head) sharded on
    "model" they run vocab-parallel."""
    r = results[f"losses/{loss}"]
    assert r["rel_diff"] <= TOL and r["collectives"]["all-gather"] == 0, r


@pytest.mark.parametrize("kind", ["auto", "explicit"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_2d_mesh_token_layouts(results, kind, reduction):
    """hidden [4, 8, H] on a 2 x 4 mesh of Auto or Explicit axes, the head over model: tokens over
    data (no gather at all: the chunks run on each device's own tokens, never spanning devices),
    or over data and model (hidden gathered over model, the head's axis, as under sequence
    parallel); dweight stays sharded over model, and the one-device result."""
    for tokens in ("data", "dataxmodel"):
        r = results[f"mesh/{kind}/{tokens}/{reduction}"]
        assert r["rel_diff"] <= TOL and r["dweight_spec"].startswith("P('model'"), r
        assert [CHUNK] in r["all_reduces"] and [3, CHUNK] in r["all_reduces"], r["all_reduces"]
        if tokens == "data":
            assert r["collectives"]["all-gather"] == 0, r["collectives"]


def test_cross_entropy_on_explicit_mesh(results):
    r = results["mesh/explicit/ce"]
    assert r["rel_diff"] <= TOL and r["collectives"]["all-gather"] == 0, r


@pytest.mark.parametrize("case", ["2x4/beta0", "2x4/beta03", "2x4/beta1", "1x2/beta03", "1x4/beta03"])
def test_fused_linear_jsd_heads_never_gathered(results, case):
    """fused_linear_jsd, both heads sharded on "model" (beta 0, 0.3, 1; temperatures 1, 2, 0.7):
    the one-device loss and student gradients, no all-gather, per chunk three all-reduces of
    [2, chunk] float32 (the row maxima, the sums of exponentials, then the divergence's and its
    gradient's sums; CHUNK_COPIES times in the program), none as large as a head; dweight left sharded."""
    r = results[f"jsd/{case}"]
    assert r["rel_diff"] <= TOL and r["collectives"]["all-gather"] == 0, r
    assert r["all_reduces"].count([2, CHUNK]) == 3 * CHUNK_COPIES, r["all_reduces"]
    assert all(size(s) < V * 16 for s in r["all_reduces"]), r["all_reduces"]
    assert r["dweight_spec"].startswith("P('model'"), r["dweight_spec"]


@pytest.mark.parametrize("case", ["2x4/beta03/no_labels", "2x4/beta03/teacher_replicated", "explicit/beta03"])
def test_fused_linear_jsd_layouts(results, case):
    """No labels; the teacher's head replicated (sliced to the student's blocks, no gather); a
    mesh of Explicit axes (the loop under jax.shard_map)."""
    r = results[f"jsd/{case}"]
    assert r["rel_diff"] <= TOL and r["collectives"]["all-gather"] == 0, r
    assert r["all_reduces"].count([2, CHUNK]) == 3 * CHUNK_COPIES and r["dweight_spec"].startswith("P('model'"), r


def test_fused_linear_jsd_data_parallel_only(results):
    """8 x 1: the heads whole, each device runs the divergence kernel's loop over its own tokens;
    the loss's and dweight's sums over data (two all-reduces), no gather."""
    r = results["jsd/8x1/beta03"]
    assert r["rel_diff"] <= TOL and others(r["collectives"], "all-reduce") == {} and r["collectives"]["all-reduce"] == 2, r


@pytest.mark.parametrize("case", ["1x4/beta03/v1001", "2x4/beta03/v1001", "2x4/beta03/tokens_uneven"])
def test_fused_linear_jsd_uneven(results, case):
    """V = 1001 over 4 devices (XLA pads the last blocks; the padding classes masked), and
    30 tokens over 2 (a padded token): the vocab-parallel math runs, and the one-device result."""
    r = results[f"jsd/{case}"]
    assert r["rel_diff"] <= TOL and r["all_reduces"].count([2, CHUNK]) == 3 * CHUNK_COPIES, r


@pytest.mark.parametrize("bad", ["16", "-1"])
def test_out_of_range_target_over_sharded_classes(results, bad):
    """An eager call on the CPU with a target outside [0, V) (not ignore_index), the head's rows
    or the logits' classes sharded: the unsharded path's ValueError, word for word (the token's
    index in target), rather than a NaN loss."""
    errors = results[f"targets/{bad}"]["errors"]
    ignore_index = -100 if bad == "16" else 3
    expected = f"fuselet: target: element 7 is {bad}, outside [0, 16) and not ignore_index ({ignore_index})"
    assert errors == dict.fromkeys(errors, expected), errors
    assert results["targets/in_range"]["rel_diff"] == 0.0
