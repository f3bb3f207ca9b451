"""fuselet.jax inside a flax model trained with optax: benchmarks/bench_step.py's Llama-style
model written with fuselet's ops against the same model written with jax.numpy (same
parameters): the loss, every gradient, and a few jitted adamw steps with donated state."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
pytest.importorskip("flax", reason="flax is not installed in this environment")
optax = pytest.importorskip("optax", reason="optax is not installed in this environment")
fj = import_layer("jax")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_step import flax_llama  # noqa: E402

SIZE = dict(batch=2, seq=16, hidden=64, intermediate=96, layers=2, heads=4, kv_heads=2, vocab=256)
TOKENS = SIZE["batch"] * (SIZE["seq"] - 1)


def models(dtype: str):
    (params, fused, tokens), (params_np, plain, _) = (flax_llama(impl, SIZE, dtype) for impl in ("fuselet.jax", "jax.numpy"))
    # the same parameters (same seed); norms away from 1 so that their weights matter
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(params_np)
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: (
            p * (1 + 0.3 * jax.random.normal(jax.random.PRNGKey(len(str(path))), p.shape, p.dtype)) if "norm" in str(path) else p
        ),
        params,
    )
    return params, fused, plain, tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loss_and_gradients_match_jax_numpy(dtype):
    params, fused, plain, tokens = models(dtype)
    (loss_f, grads_f), (loss_p, grads_p) = (jax.jit(jax.value_and_grad(f))(params, tokens) for f in (fused, plain))
    ref.assert_close(ref.to_float64(loss_f), ref.to_float64(loss_p), dtype, "reduce", rows=TOKENS, name="loss")
    leaves_f = jax.tree_util.tree_leaves_with_path(grads_f)
    leaves_p = dict(jax.tree_util.tree_leaves_with_path(grads_p))
    assert len(leaves_f) == len(leaves_p) == 2 + 1 + SIZE["layers"] * 8  # embed, head, norm; 8 per block
    for path, g in leaves_f:
        expected = ref.to_float64(leaves_p[path])
        scale = max(1e-3, float(np.abs(expected).max()))
        assert float(np.abs(ref.to_float64(g)).max()) > 0, jax.tree_util.keystr(path)
        ref.assert_close(
            ref.to_float64(g) / scale, expected / scale, dtype, "reduce", rows=TOKENS, name=jax.tree_util.keystr(path)
        )


def test_adamw_steps_track_jax_numpy():
    params, fused, plain, tokens = models("float32")
    opt = optax.adamw(3e-3)

    def trainer(apply):
        @jax.jit
        def step(params, state):
            loss, grads = jax.value_and_grad(apply)(params, tokens)
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        return jax.jit(step, donate_argnums=(0, 1))

    losses = {}
    for name, apply in (("fuselet", fused), ("jax.numpy", plain)):
        p, s, out = jax.tree_util.tree_map(lambda a: a.copy(), params), opt.init(params), []
        step = trainer(apply)
        for _ in range(4):
            p, s, loss = step(p, s)
            out.append(float(loss))
        losses[name] = out
    np.testing.assert_allclose(losses["fuselet"], losses["jax.numpy"], rtol=2e-4)
    assert losses["fuselet"][-1] < losses["fuselet"][0] - 0.05, losses  # it learns
