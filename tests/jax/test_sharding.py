"""fuselet.jax norms under SPMD sharding on 8 CPU devices (tests/jax/sharding_child.py runs in
a subprocess: XLA_FLAGS must be set before jax is imported).

Row-sharded x: no collective in the forward, and in jax.grad only the all-reduce that sums
dweight/dbias over the row shards. A sharded hidden dim: x (and dy) gathered along it, nothing
else. Outputs keep x's sharding and match the unsharded result; shard_map too."""

from __future__ import annotations

import pytest

from tests.jax.multi_device import others, run_on_8_cpu_devices

pytestmark = pytest.mark.processes  # the make test tier (tests/conftest.py)

pytest.importorskip("jax", reason="jax is not installed in this environment")

ROW_CASES = ("rows", "rows_2d_mesh", "rows_bf16_x_f32_params", "shard_map")
NORMS = ("rms_norm", "layer_norm")


@pytest.fixture(scope="module")
def results() -> dict:
    return run_on_8_cpu_devices("tests.jax.sharding_child")


@pytest.mark.parametrize("case", ROW_CASES)
@pytest.mark.parametrize("norm", NORMS)
def test_row_sharding_has_no_gather(results, norm, case):
    r = results[f"{norm}/{case}"]
    assert others(r["fwd"]) == {}, r["fwd"]
    # The gradients of weight/bias are sums over all rows: one all-reduce over the row shards.
    assert others(r["grad"], "all-reduce") == {}, r["grad"]
    assert 1 <= r["grad"]["all-reduce"] <= 2, r["grad"]


@pytest.mark.parametrize("case", ["hidden", "rows_and_hidden"])
@pytest.mark.parametrize("norm", NORMS)
def test_hidden_sharding_gathers_x_only(results, norm, case):
    """x sharded on H (P(None, "data")), or on rows and H (P("a", "b")): x, and dy in the
    gradient, are gathered along H only; row shards still sum dweight/dbias with an all-reduce."""
    r = results[f"{norm}/{case}"]
    reduces = 1 if case == "rows_and_hidden" else 0
    assert r["fwd"]["all-gather"] == 1 and others(r["fwd"], "all-gather") == {}, r["fwd"]
    assert r["grad"]["all-gather"] == 2 and r["grad"]["all-reduce"] == reduces, r["grad"]  # x and dy
    assert others(r["grad"], "all-gather", "all-reduce") == {}, r["grad"]


@pytest.mark.parametrize("case", (*ROW_CASES, "hidden", "rows_and_hidden"))
@pytest.mark.parametrize("norm", NORMS)
def test_sharded_values_and_layout(results, norm, case):
    r = results[f"{norm}/{case}"]
    assert r["y_sharding_is_x"] and r["dx_sharding_is_x"], r
    assert r["max_diff"] < 1e-4, r  # the same kernels on the same rows: float32 rounding at most


@pytest.mark.parametrize("norm", NORMS)
def test_eager_call_with_uncommitted_parameters(results, norm):
    """fj.rms_norm(x_sharded, jnp.ones(H)) outside jit: JAX places the weight, as for jnp ops."""
    r = results[f"{norm}/eager_uncommitted_params"]
    assert r["y_sharding_is_x"] and r["max_diff"] < 1e-4, r


@pytest.mark.parametrize("op", ["add_rms_norm", "gated_rms_norm"])
@pytest.mark.parametrize("case", ["rows", "rows_2d_mesh", "shard_map"])
def test_add_and_gated_rms_norm_row_sharding(results, op, case):
    """x and residual (the gate) row-sharded: no collective in the forward, one all-reduce
    (dweight) in the grad; the gated norm's per-group rstd sharded like the rows."""
    r = results[f"{op}/{case}"]
    assert others(r["fwd"]) == {}, r["fwd"]
    assert others(r["grad"], "all-reduce") == {} and 1 <= r["grad"]["all-reduce"] <= 2, r["grad"]
    assert r["y_sharding_is_x"] and r["dx_sharding_is_x"] and r["max_diff"] < 1e-4, r


@pytest.mark.parametrize("case", ["rows", "rows_2d_mesh", "shard_map"])
def test_glu_row_sharding(results, case):
    """x row-sharded: swiglu and its gradient run with no collective at all."""
    r = results[f"swiglu/{case}"]
    assert others(r["fwd"]) == {} and others(r["grad"]) == {}, r
    assert r["y_sharding_is_x"] and r["dx_sharding_is_x"] and r["max_diff"] < 1e-5, r


def test_glu_hidden_sharding(results):
    """x sharded on its last dim: gathered along it (the halves live at both ends), nothing else."""
    r = results["swiglu/hidden"]
    assert r["fwd"]["all-gather"] >= 1 and others(r["fwd"], "all-gather") == {}, r["fwd"]
    assert r["max_diff"] < 1e-5, r


@pytest.mark.parametrize("causal", ["plain", "causal"])
def test_softmax_batch_and_head_sharding(results, causal):
    """x [B, H, Q, K] sharded over B and H: no collective, forward or gradient."""
    r = results[f"softmax/{causal}/rows"]
    assert others(r["fwd"]) == {} and others(r["grad"]) == {}, r
    assert r["y_sharding_is_x"] and r["dx_sharding_is_x"] and r["max_diff"] < 1e-5, r


def test_softmax_query_sharding(results):
    """Q sharded: plain softmax keeps it sharded (no collective); causal softmax numbers queries
    from the whole Q dim, so it gathers Q (and gives the unsharded result)."""
    plain, causal = results["softmax/plain/queries"], results["softmax/causal/queries"]
    assert others(plain["fwd"]) == {} and plain["y_sharding_is_x"] and plain["max_diff"] < 1e-5, plain
    assert causal["fwd"]["all-gather"] >= 1 and causal["max_diff"] < 1e-5, causal


@pytest.mark.parametrize("case", ["rows", "rows_2d_mesh"])
def test_cross_entropy_row_sharding(results, case):
    """logits row-sharded (target like its rows): the per-token loss needs no collective, the
    mean loss (with its z-loss part and the token count: one stacked jnp.sum) exactly one
    all-reduce, which XLA's CPU SPMD splits into one per mesh axis of the rows (2 on the 2-D
    mesh; separate jnp.sums there give 4)."""
    r = results[f"cross_entropy/{case}"]
    axes = 2 if case == "rows_2d_mesh" else 1
    assert others(r["fwd"]) == {}, r["fwd"]
    assert r["reduced"]["all-reduce"] == axes and others(r["reduced"], "all-reduce") == {}, r["reduced"]
    assert r["grad"]["all-reduce"] <= axes and others(r["grad"], "all-reduce") == {}, r["grad"]
    assert r["loss_sharding_is_target"] and r["dx_sharding_is_x"] and r["max_diff"] < 1e-5, r


def test_cross_entropy_vocab_sharding_keeps_logits_sharded(results):
    """logits sharded on V: each device's block of the classes stays its own (vocab-parallel: no
    gather), the rows' statistics combined by a pmax and a psum (two all-reduces); the
    unsharded result (tests/jax/test_vocab_parallel.py covers the options and meshes)."""
    r = results["cross_entropy/vocab"]
    assert r["fwd"]["all-reduce"] == 2 and others(r["fwd"], "all-reduce") == {}, r["fwd"]
    for name in ("reduced", "grad"):
        assert others(r[name], "all-reduce") == {}, r[name]
    assert r["loss_sharding_is_target"] and r["dx_sharding_is_x"] and r["max_diff"] < 1e-5, r


# The post-training losses, fused_linear_jsd and the divergences under jax.jit: every array's
# rows (sequences or tokens, and the per-sequence arrays) sharded on "data", the heads
# replicated. Auto axes: GSPMD partitions the chunks, and the result is the unsharded one.
# Explicit axes (jax.make_mesh's default): JAX's sharding type checks refuse the chunked loops
# (a chunk that straddles the devices' rows), never a different result.
LOSSES = ("preference/dpo", "preference/mpo", "kto", "grpo", "fused_linear_jsd")
DIVERGENCES = ("kl_div/batchmean", "jsd", "tvd")


@pytest.mark.parametrize("name", LOSSES + DIVERGENCES)
def test_losses_row_sharding(results, name):
    """The unsharded loss and gradients (hidden, weight, bias; input, target); dhidden keeps the
    rows' sharding."""
    auto, explicit = results[f"{name}/auto"], results[f"{name}/explicit"]
    assert auto["max_diff"] < 1e-5, auto
    assert auto["resharded_grads"] == [], auto
    if name in DIVERGENCES:  # the kernels run on each device's rows: no gather, the mean's sums reduced
        for r in (auto, explicit):
            assert others(r["grad"], "all-reduce") == {} and r["max_diff"] < 1e-5, r
    else:
        assert "refused" in explicit or explicit["max_diff"] < 1e-5, explicit
