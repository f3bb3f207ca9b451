"""fuselet.jax SwiGLU / GeGLU / clamped SwiGLU against the float64 reference (tests/reference.py): forward,
grad, jit, vmap."""

from __future__ import annotations

import pytest

from tests import reference as ref
from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import jax.numpy as jnp  # noqa: E402

fj = import_layer("jax")

# name -> (call, (reference activation, the reference's options))
CLAMPED = {"alpha": 1.702, "limit": 1.5}  # a limit inside the inputs' spread: both sides of each clamp
GLUS = {
    "swiglu": (lambda x: fj.swiglu(x), ("silu", {})),
    "geglu": (lambda x: fj.geglu(x), ("gelu", {})),
    "geglu_tanh": (lambda x: fj.geglu(x, approximate="tanh"), ("gelu_tanh", {})),
    "clamped_swiglu": (lambda x: fj.clamped_swiglu(x, **CLAMPED), ("silu_clamped", CLAMPED)),
    "clamped_swiglu_interleaved": (
        lambda x: fj.clamped_swiglu(x, **CLAMPED, interleaved=True),
        ("silu_clamped", {**CLAMPED, "interleaved": True}),
    ),
}


@pytest.fixture(params=GLUS)
def glu(request):
    return GLUS[request.param]


def arrays(shape, dtype, device=None, seed=0):
    """x [..., 2F] (F = shape[-1]) and dy [..., F]."""
    a = ref.make_inputs((*shape[:-1], 2 * shape[-1]), dtype, seed)
    b = ref.make_inputs(shape, dtype, seed + 1)
    return jax.device_put(jnp.asarray(a["x"]), device), jax.device_put(jnp.asarray(b["dy"]), device)


f64 = ref.to_float64


def vjp(call):
    return jax.grad(lambda x, dy: jnp.sum(call(x).astype(jnp.float32) * dy.astype(jnp.float32)))


def check(kind, x, dy, y, dx, dtype):
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], x.shape[-1] // 2)
    kind, options = kind
    ref.assert_close(f64(y), ref.glu_fwd(x, kind, **options), dtype, "out", name="y")
    assert dx.dtype == x.dtype and dx.shape == x.shape
    ref.assert_close(f64(dx), ref.glu_bwd(dy, x, kind, **options), dtype, "out", name="dx")


def test_forward_grad(glu, dtype, shape, jax_device):
    call, kind = glu
    x, dy = arrays(shape, dtype, jax_device)
    check(kind, x, dy, call(x), vjp(call)(x, dy), dtype)


def test_jit(glu, dtype):
    call, kind = glu
    x, dy = arrays((2, 3, 127), dtype)
    check(kind, x, dy, jax.jit(call)(x), jax.jit(vjp(call))(x, dy), dtype)


def test_vmap_and_vmap_of_grad(glu):
    call, kind = glu
    parts = [arrays((8, 33), "float32", seed=s) for s in range(3)]
    xs, dys = jnp.stack([p[0] for p in parts]), jnp.stack([p[1] for p in parts])
    ys, dxs = jax.vmap(call)(xs), jax.vmap(vjp(call))(xs, dys)
    for i in range(3):
        check(kind, xs[i], dys[i], ys[i], dxs[i], "float32")


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 127)], ids=["0x8", "2x0x127"])
def test_empty_batch(glu, shape):
    call, _ = glu
    x, dy = arrays(shape, "float32")
    assert call(x).shape == shape
    assert vjp(call)(x, dy).shape == x.shape
