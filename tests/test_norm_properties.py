"""Properties of RMSNorm and LayerNorm in both layers, over what hypothesis draws: shapes (no
rows, one, several leading dims), dtypes (float32, float16, bfloat16; float32 parameters with
half activations), eps, layouts (torch: transposed and sliced x, expanded rows, weights with a
zero stride) and extreme values (inf, NaN, |x| ~ 1e30, denormals, a large mean with a tiny
spread).

- A row of finite inputs equals the float64 reference on the inputs as stored (rounded to the
  dtype), within the dtype's tolerance plus what float32 math cannot avoid: x - mean loses
  |mean| float32 ulps whatever the algorithm (the same allowance as tests/core/test_norm.cc).
- A row holding inf or NaN is NaN / inf where the framework's own norm (torch.nn.functional,
  or a two-pass float32 jax.numpy one: JAX has no norm op) is, on the same stored inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests import reference as ref
from tests.conftest import FRAMEWORKS, import_layer

F32_EPS = float(np.finfo(np.float32).eps)
KINDS = ("normal", "large_mean", "huge", "denormal", "specials")


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(ref.DTYPE_NAMES))
    lead = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    hidden = draw(st.integers(1, 70))
    shape = (*lead, hidden)
    kind = draw(st.sampled_from(KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape)
    if kind == "large_mean":
        x = 1e4 + 1e-2 * x
    elif kind == "huge":
        x = 1e30 * x  # float16: inf once stored
    elif kind == "denormal":
        x = 1e-40 * x  # float32 / bfloat16 subnormals; float16: 0
    elif kind == "specials" and x.size:
        flat = x.reshape(-1)
        for _ in range(draw(st.integers(1, 3))):
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
    return {
        "norm": draw(st.sampled_from(["rms_norm", "layer_norm"])),
        "dtype": dtype,
        "param_dtype": draw(st.sampled_from([dtype, "float32"])),
        "x": x,
        "weight": 1.0 + 0.5 * rng.standard_normal(hidden),
        "bias": 0.5 * rng.standard_normal(hidden),
        "eps": draw(st.sampled_from([1e-6, 1e-5, 1e-3, 0.5])),
    }


def expected(case, x, w, b) -> tuple[np.ndarray, np.ndarray]:
    """float64 reference on the stored inputs, and the absolute slack of float32 math per row."""
    if case["norm"] == "rms_norm":
        y, rstd = ref.rms_norm_fwd(x, w, case["eps"])
        mean = np.zeros(rstd.shape)
    else:
        y, mean, rstd = ref.layer_norm_fwd(x, w, b, case["eps"])
    slack = 16 * F32_EPS * (1 + np.abs(mean) * rstd)[..., None] * np.abs(w)
    return y, slack


def check(case, got, x, w, b, own) -> None:
    """got: the layer's y; own: the framework's own norm on the same stored inputs (float64)."""
    finite = np.isfinite(x).all(axis=-1)
    with np.errstate(all="ignore"):
        want, slack = expected(case, x, w, b)
    rtol, atol = ref.tolerance(case["dtype"], "out")
    bad = finite[..., None] & ~(np.abs(got - want) <= atol + rtol * np.abs(want) + slack)
    assert not bad.any(), (
        f"{case['norm']} {case['dtype']} (params {case['param_dtype']}) eps={case['eps']}: "
        f"{int(bad.sum())} values off the float64 reference, e.g. got {got[bad][:3]}, "
        f"want {want[bad][:3]}"
    )
    rows = ~finite
    for name, mask in (("NaN", np.isnan), ("inf", np.isinf)):
        assert (mask(got)[rows] == mask(own)[rows]).all(), (
            f"{case['norm']} {case['dtype']}: {name} where the framework's own norm has none, or the reverse: "
            f"got {got[rows][:8]}, framework {own[rows][:8]}"
        )


SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("framework", FRAMEWORKS)
@SETTINGS
@given(case=cases())
def test_norms_match_float64_and_propagate_like_the_framework(framework, case):
    layer = import_layer(framework)
    (torch_run if framework == "torch" else jax_run)(layer, case)


def torch_run(ft, case, layout=None):
    import torch
    import torch.nn.functional as F

    dt, pdt = getattr(torch, case["dtype"]), getattr(torch, case["param_dtype"])
    x = torch.from_numpy(case["x"]).to(dt)
    w, b = torch.from_numpy(case["weight"]).to(pdt), torch.from_numpy(case["bias"]).to(pdt)
    if layout is not None:
        x, w = layout(x), layout_weight(w, layout)
    H = x.shape[-1]
    if case["norm"] == "rms_norm":
        got = ft.rms_norm(x, w, case["eps"])
        own = F.rms_norm(x.float(), (H,), w.float(), case["eps"])
    else:
        got = ft.layer_norm(x, w, b, case["eps"])
        own = F.layer_norm(x.float(), (H,), w.float(), b.float(), case["eps"])
    assert got.dtype == dt and got.shape == x.shape
    f64 = lambda t: t.detach().double().numpy()  # noqa: E731
    check(case, f64(got), f64(x), f64(w), f64(b), f64(own.to(dt)))


def jax_run(fj, case):
    import jax.numpy as jnp

    dt, pdt = jnp.dtype(case["dtype"]), jnp.dtype(case["param_dtype"])
    x = jnp.asarray(case["x"].astype(np.float32)).astype(dt)
    w, b = (jnp.asarray(case[k].astype(np.float32)).astype(pdt) for k in ("weight", "bias"))
    eps = np.float32(case["eps"])
    x32, w32, b32 = x.astype(jnp.float32), w.astype(jnp.float32), b.astype(jnp.float32)
    if case["norm"] == "rms_norm":
        got = fj.rms_norm(x, w, case["eps"])
        own = x32 / jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * w32
    else:
        got = fj.layer_norm(x, w, b, case["eps"])
        c = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        own = c / jnp.sqrt(jnp.mean(c * c, axis=-1, keepdims=True) + eps) * w32 + b32
    assert got.dtype == dt and got.shape == x.shape
    f64 = lambda a: ref.to_float64(a)  # noqa: E731
    check(case, f64(got), f64(x), f64(w), f64(b), f64(own.astype(dt)))


# --- torch layouts: what the layer makes contiguous before the core sees it -----------------

LAYOUTS = {
    "transposed": lambda t: t.reshape(-1, t.shape[-1]).t().contiguous().t(),  # last stride != 1
    "sliced": lambda t: t.repeat_interleave(2, dim=-1)[..., ::2],  # stride 2
    "expanded_rows": lambda t: t.reshape(-1, t.shape[-1])[:1].expand(3, t.shape[-1]),  # row stride 0
}


def layout_weight(w, layout):
    """A weight of stride 0 (expand of one value) for the expanded layout: a broadcast parameter."""
    return w[:1].expand(w.shape[0]) if layout is LAYOUTS["expanded_rows"] else w


@pytest.mark.parametrize("layout", LAYOUTS)
@SETTINGS
@given(case=cases())
def test_torch_layouts_match_float64(layout, case):
    assume(case["x"].size > 0 or layout != "expanded_rows")
    # the reference reads the tensors the layer got (the same layout, the values as stored)
    torch_run(import_layer("torch"), case, LAYOUTS[layout])
