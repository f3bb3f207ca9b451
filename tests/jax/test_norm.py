"""fuselet.jax RMSNorm / LayerNorm against the float64 reference (tests/reference.py):
forward, grad, jit, vmap and vmap-of-grad."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")

EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}
PARAMS = {"rms_norm": ("weight",), "layer_norm": ("weight", "bias")}


def arrays(shape, dtype, device, seed=0) -> dict:
    """x, weight, bias, dy of `shape` in `dtype` (the values of ref.make_inputs), on `device`."""
    return {k: jax.device_put(jnp.asarray(v), device) for k, v in ref.make_inputs(shape, dtype, seed).items()}


def f64(a) -> np.ndarray:
    return ref.to_float64(a)


def apply(norm, x, weight, bias=None):
    if norm == "rms_norm":
        return fj.rms_norm(x, weight, EPS[norm])
    return fj.layer_norm(x, weight, bias, EPS[norm])


def reference_forward(norm, x, weight, bias=None):
    if norm == "rms_norm":
        return ref.rms_norm_fwd(f64(x), f64(weight), EPS[norm])[0]
    return ref.layer_norm_fwd(f64(x), f64(weight), f64(bias), EPS[norm])[0]


def reference_backward(norm, dy, x, weight) -> dict:
    fn = ref.rms_norm_bwd if norm == "rms_norm" else ref.layer_norm_bwd
    return dict(zip(("x", "weight", "bias"), fn(f64(dy), f64(x), f64(weight), EPS[norm])))


def loss(norm):
    """loss(dy, x, weight[, bias]) = sum(y * dy): its gradients are the VJP with cotangent dy."""

    def fn(dy, *args):
        return jnp.sum(apply(norm, *args).astype(jnp.float32) * dy.astype(jnp.float32))

    return fn


def grad_fn(norm):
    argnums = tuple(range(1, 2 + len(PARAMS[norm])))  # x, weight[, bias]
    return jax.grad(loss(norm), argnums=argnums)


def args_of(norm, a):
    return [a["x"], *(a[p] for p in PARAMS[norm])]


def check_grads(norm, grads, a, dtype, rows):
    expected = reference_backward(norm, a["dy"], a["x"], a["weight"])
    for name, grad in zip(("x", *PARAMS[norm]), grads):
        assert grad.dtype == a[name].dtype and grad.shape == a[name].shape, name
        ref.assert_close(f64(grad), expected[name], dtype, "out" if name == "x" else "reduce", rows=rows, name=f"d{name}")


# --- forward, grad, jit -----------------------------------------------------------------------


def test_forward(norm, dtype, shape, jax_device):
    a = arrays(shape, dtype, jax_device)
    y = apply(norm, *args_of(norm, a))
    assert (y.shape, y.dtype, y.devices()) == (a["x"].shape, a["x"].dtype, {jax_device})
    ref.assert_close(f64(y), reference_forward(norm, *args_of(norm, a)), dtype, "out", name="y")


def test_grad(norm, dtype, shape, jax_device):
    a = arrays(shape, dtype, jax_device)
    grads = grad_fn(norm)(a["dy"], *args_of(norm, a))
    check_grads(norm, grads, a, dtype, ref.rows_of(shape))


def test_jit(norm, dtype, shape, jax_device):
    a = arrays(shape, dtype, jax_device)
    y = jax.jit(lambda *args: apply(norm, *args))(*args_of(norm, a))
    ref.assert_close(f64(y), reference_forward(norm, *args_of(norm, a)), dtype, "out", name="y")
    grads = jax.jit(grad_fn(norm))(a["dy"], *args_of(norm, a))
    check_grads(norm, grads, a, dtype, ref.rows_of(shape))


@settings(max_examples=25, deadline=None, database=None)
@given(
    hidden=st.integers(1, 5000),
    rows=st.integers(0, 40),
    eps=st.floats(1e-8, 1.0),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**31),
)
def test_rms_norm_float32_random(hidden, rows, eps, scale, seed):
    x = np.random.default_rng(seed).standard_normal((rows, hidden)).astype(np.float32) * np.float32(scale)
    w = np.random.default_rng(seed + 1).standard_normal(hidden).astype(np.float32)
    y = fj.rms_norm(jnp.asarray(x), jnp.asarray(w), eps)
    ref.assert_close(f64(y), ref.rms_norm_fwd(x, w, eps)[0], "float32", "out")


# --- vmap ---------------------------------------------------------------------------------------

BATCH = 3
VMAP_SHAPES = [(4, 1), (8, 127), (3, 4097), (2, 3, 127)]


@pytest.fixture(params=VMAP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def vmap_shape(request):
    return request.param


def batched(shape, dtype, device):
    """arrays() with a leading batch dim of BATCH on every array (each example different)."""
    parts = [arrays(shape, dtype, device, seed=s) for s in range(BATCH)]
    return {k: jnp.stack([p[k] for p in parts]) for k in parts[0]}


def test_vmap_unbatched_params(norm, dtype, vmap_shape, jax_device):
    a, b = batched(vmap_shape, dtype, jax_device), arrays(vmap_shape, dtype, jax_device)
    params = [b[p] for p in PARAMS[norm]]
    in_axes = (0, *(None for _ in params))
    y = jax.jit(jax.vmap(lambda *args: apply(norm, *args), in_axes=in_axes))(a["x"], *params)
    ref.assert_close(f64(y), reference_forward(norm, a["x"], *params), dtype, "out", name="y")


def test_vmap_batched_weight(norm, dtype, vmap_shape, jax_device):
    a = batched(vmap_shape, dtype, jax_device)
    y = jax.vmap(lambda *args: apply(norm, *args))(*args_of(norm, a))
    for i in range(BATCH):
        expected = reference_forward(norm, *(v[i] for v in args_of(norm, a)))
        ref.assert_close(f64(y[i]), expected, dtype, "out", name=f"y[{i}]")


def test_vmap_of_grad(norm, dtype, vmap_shape, jax_device):
    """Per-example gradients: batched x and dy, shared parameters."""
    a, b = batched(vmap_shape, dtype, jax_device), arrays(vmap_shape, dtype, jax_device)
    params = [b[p] for p in PARAMS[norm]]
    in_axes = (0, 0, *(None for _ in params))
    grads = jax.vmap(grad_fn(norm), in_axes=in_axes)(a["dy"], a["x"], *params)
    for i in range(BATCH):
        example = {"dy": a["dy"][i], "x": a["x"][i], **dict(zip(PARAMS[norm], params))}
        check_grads(norm, [g[i] for g in grads], example, dtype, ref.rows_of(vmap_shape))


def test_vmap_of_grad_batched_weight(norm, jax_device):
    a = batched((8, 127), "float32", jax_device)
    grads = jax.vmap(grad_fn(norm))(a["dy"], *args_of(norm, a))
    for i in range(BATCH):
        check_grads(norm, [g[i] for g in grads], {k: v[i] for k, v in a.items()}, "float32", 8)


# --- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(norm, dtype, shape, jax_device):
    a = arrays(shape, dtype, jax_device)
    y = apply(norm, *args_of(norm, a))
    assert y.shape == shape and y.dtype == a["x"].dtype
    grads = grad_fn(norm)(a["dy"], *args_of(norm, a))
    assert grads[0].shape == shape
    for name, grad in zip(PARAMS[norm], grads[1:]):
        assert grad.dtype == a[name].dtype
        np.testing.assert_array_equal(f64(grad), np.zeros(shape[-1]), err_msg=name)


# --- parameter variants: float32 parameters, no bias, no affine, zero-centered gamma ----------

VARIANT_SHAPES = [(5, 127), (2, 3, 1030)]


def variant_arrays(norm, shape, dtype, variant, device=None) -> dict:
    """ref.variant_inputs as jax arrays: absent parameters are None (and RMSNorm has no bias)."""
    a = {
        k: None if v is None else jax.device_put(jnp.asarray(v), device)
        for k, v in ref.variant_inputs(shape, dtype, variant).items()
    }
    if norm == "rms_norm":
        a["bias"] = None
    return a


def variant_apply(norm, zc):
    def fn(x, weight, bias):
        if norm == "rms_norm":
            return fj.rms_norm(x, weight, EPS[norm], zero_centered_gamma=zc)
        return fj.layer_norm(x, weight, bias, EPS[norm], zero_centered_gamma=zc)

    return fn


def variant_reference(norm, a, zc):
    """(y, {name: gradient or None}) of the float64 reference."""
    x, dy = f64(a["x"]), f64(a["dy"])
    w, b = (None if a[n] is None else f64(a[n]) for n in ("weight", "bias"))
    if norm == "rms_norm":
        return ref.rms_norm_fwd(x, w, EPS[norm], zc)[0], dict(zip(("x", "weight"), ref.rms_norm_bwd(dy, x, w, EPS[norm], zc)))
    y = ref.layer_norm_fwd(x, w, b, EPS[norm], zc)[0]
    return y, dict(zip(("x", "weight", "bias"), ref.layer_norm_bwd(dy, x, w, EPS[norm], zc, b is not None)))


def check_variant(norm, a, dtype, zc, y, grads):
    """grads: (dx, dweight, dbias) as jax.grad returns them for (x, weight, bias)."""
    expected_y, expected = variant_reference(norm, a, zc)
    assert y.dtype == a["x"].dtype
    ref.assert_close(f64(y), expected_y, dtype, "out", name="y")
    for name, got in zip(("x", "weight", "bias"), grads):
        if a[name] is None:
            assert got is None, name
            continue
        assert got.dtype == a[name].dtype and got.shape == a[name].shape, name
        kind, dt = ("out", dtype) if name == "x" else ("reduce", jnp.dtype(a[name].dtype).name)
        ref.assert_close(f64(got), expected[name], dt, kind, rows=ref.rows_of(a["x"].shape), name=f"d{name}")


def variant_grad(norm, zc):
    fn = variant_apply(norm, zc)
    return jax.grad(lambda dy, *args: jnp.sum(fn(*args).astype(jnp.float32) * dy.astype(jnp.float32)), argnums=(1, 2, 3))


@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", ref.VARIANTS)
def test_variant(norm, dtype, variant, shape, jax_device):
    a = variant_arrays(norm, shape, dtype, variant, jax_device)
    zc = ref.VARIANTS[variant][3]
    args = (a["x"], a["weight"], a["bias"])
    y = variant_apply(norm, zc)(*args)
    check_variant(norm, a, dtype, zc, y, variant_grad(norm, zc)(a["dy"], *args))


@pytest.mark.parametrize("variant", ref.VARIANTS)
def test_variant_jit_vmap(norm, variant):
    """jit of forward and grad, and vmap of grad over examples with shared parameters."""
    zc = ref.VARIANTS[variant][3]
    a = variant_arrays(norm, (8, 127), "bfloat16", variant)
    args = (a["x"], a["weight"], a["bias"])
    y = jax.jit(variant_apply(norm, zc))(*args)
    check_variant(norm, a, "bfloat16", zc, y, jax.jit(variant_grad(norm, zc))(a["dy"], *args))
    parts = [variant_arrays(norm, (8, 127), "bfloat16", variant) for _ in range(BATCH)]
    xs = jnp.stack([p["x"] + i for i, p in enumerate(parts)])
    dys = jnp.stack([p["dy"] for p in parts])
    ys = jax.vmap(variant_apply(norm, zc), in_axes=(0, None, None))(xs, a["weight"], a["bias"])
    grads = jax.vmap(variant_grad(norm, zc), in_axes=(0, 0, None, None))(dys, xs, a["weight"], a["bias"])
    for i in range(BATCH):
        example = {"x": xs[i], "dy": dys[i], "weight": a["weight"], "bias": a["bias"]}
        check_variant(norm, example, "bfloat16", zc, ys[i], [None if g is None else g[i] for g in grads])


# --- XLA command buffers (CUDA graphs) ---------------------------------------------------------

COMMAND_BUFFER_CHILD = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
import fuselet.jax as fj
norm, hidden = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((64, hidden)), jnp.bfloat16)
w, b = jnp.asarray(1 + rng.standard_normal(hidden) / 2, jnp.float32), jnp.zeros(hidden, jnp.float32)
f = (lambda x, w, b: fj.rms_norm(x, w)) if norm == "rms_norm" else fj.layer_norm
g = jax.jit(jax.grad(lambda x, w, b: jnp.sum(f(x, w, b).astype(jnp.float32) ** 2), argnums=(0, 1, 2)))
runs = [[np.asarray(a, np.float32).tolist() for a in g(x, w, b)] for _ in range(3)]
print(json.dumps({"hlo_has_command_buffer": "command_buffer" in g.lower(x, w, b).compile().as_text(),
                  "grads": runs}))
"""


@pytest.mark.parametrize("jax_device", ["cuda"], indirect=True)
@pytest.mark.parametrize("hidden", [127, 8192])
def test_command_buffer(norm, hidden, jax_device):
    """With XLA command buffers on for custom calls, jit(grad) runs the fuselet calls inside a
    command buffer (the CUDA handlers declare it; the workspace is an output) and every replay
    gives the results of a run without command buffers."""
    import json
    import os
    import subprocess
    import sys

    def run(flags):
        env = dict(os.environ, XLA_FLAGS=flags)
        proc = subprocess.run(
            [sys.executable, "-c", COMMAND_BUFFER_CHILD, norm, str(hidden)], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    on = run("--xla_gpu_enable_command_buffer=+CUSTOM_CALL --xla_gpu_graph_min_graph_size=1")
    off = run("--xla_gpu_enable_command_buffer=")
    assert on["hlo_has_command_buffer"] and not off["hlo_has_command_buffer"]
    for replay in on["grads"]:
        assert replay == off["grads"][0]
