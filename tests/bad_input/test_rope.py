"""Bad input to rope: both layers' entry points and the registered torch ops."""

from __future__ import annotations

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


def rope_args(api, x=(2, 3, 4, 8), cos=(3, 8), sin=None, dtype="float32", cos_dtype="float32", sin_dtype=None):
    return (
        api.array(x, dtype),
        api.array(cos, cos_dtype),
        api.array(cos if sin is None else sin, cos_dtype if sin_dtype is None else sin_dtype),
    )


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_rope_x_dtype(api, dtype):
    with raises(TypeError, f"x: expected dtype float32, float16 or bfloat16, got {dtype}"):
        api.module.rope(*rope_args(api, dtype=dtype))


@pytest.mark.parametrize("argument", ["x", "cos", "sin"])
def test_rope_not_an_array(api, argument):
    args = dict(zip(("x", "cos", "sin"), rope_args(api)))
    args[argument] = [1.0, 2.0]
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"{argument}: expected a {kind}, got list"):
        api.module.rope(args["x"], args["cos"], args["sin"])


def test_rope_layout_and_interleaved(api):
    with raises(ValueError, "layout: expected 'bshd' or 'bhsd', got 'bsnd'"):
        api.module.rope(*rope_args(api), layout="bsnd")
    with raises(TypeError, "layout: expected 'bshd' or 'bhsd', got int"):
        api.module.rope(*rope_args(api), layout=0)
    with raises(TypeError, "interleaved: expected a bool, got int"):
        api.module.rope(*rope_args(api), interleaved=1)


def test_rope_x_shape(api):
    with raises(ValueError, "x: expected shape [B, S, N, D] or [S, N, D] (layout 'bshd'), got shape (3, 8)"):
        api.module.rope(*rope_args(api, x=(3, 8)))
    with raises(ValueError, "x: expected shape [B, N, S, D] or [N, S, D] (layout 'bhsd'), got shape (1, 2, 3, 4, 8)"):
        api.module.rope(*rope_args(api, x=(1, 2, 3, 4, 8)), layout="bhsd")
    with raises(ValueError, "x: the head dim D (last dimension) must be > 0, got shape (2, 3, 4, 0)"):
        api.module.rope(*rope_args(api, x=(2, 3, 4, 0)))


def test_rope_table_dtypes(api):
    with raises(TypeError, "cos: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        api.module.rope(*rope_args(api, dtype="bfloat16", cos_dtype="float16"))
    with raises(TypeError, "cos: expected dtype float32, float16 or bfloat16, got int32"):
        api.module.rope(*rope_args(api, cos_dtype="int32"))
    with raises(TypeError, "sin: expected dtype float32 (the dtype of cos), got bfloat16"):
        api.module.rope(*rope_args(api, dtype="bfloat16", sin_dtype="bfloat16"))


@pytest.mark.parametrize("rotary", [7, 10, 0])
def test_rope_rotary_dim(api, rotary):
    with raises(ValueError, f"cos: the rotary dim R (last dimension) must be even and in [2, D=8], got shape (3, {rotary})"):
        api.module.rope(*rope_args(api, cos=(3, rotary)))


def test_rope_table_shapes(api):
    with raises(ValueError, "cos: expected shape [S, R] or [B, S, R], got shape (8,)"):
        api.module.rope(*rope_args(api, cos=(8,)))
    with raises(ValueError, "cos: expected shape [S, R] (x has no batch dim), got shape (1, 3, 8)"):
        api.module.rope(*rope_args(api, x=(3, 4, 8), cos=(1, 3, 8)))
    with raises(ValueError, "cos: expected 3 positions (S, dim 1 of x (2, 3, 4, 8)), got shape (4, 8)"):
        api.module.rope(*rope_args(api, cos=(4, 8)))
    with raises(ValueError, "cos: expected 4 positions (S, dim 2 of x (2, 3, 4, 8)), got shape (3, 8)"):
        api.module.rope(*rope_args(api), layout="bhsd")
    with raises(ValueError, "cos: expected a batch of 2 (B, dim 0 of x (2, 3, 4, 8)), got shape (3, 3, 8)"):
        api.module.rope(*rope_args(api, cos=(3, 3, 8)))
    with raises(ValueError, "sin: expected shape (3, 8) (the shape of cos), got (3, 6)"):
        api.module.rope(*rope_args(api, sin=(3, 6)))


def test_rope_pair_table(api):
    with raises(TypeError, "pair_table: expected a bool, got int"):
        api.module.rope(*rope_args(api, cos=(3, 4)), pair_table=1)
    for width in (5, 0):
        with raises(
            ValueError,
            f"cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D=8], got shape (3, {width})",
        ):
            api.module.rope(*rope_args(api, cos=(3, width)), pair_table=True)
    with raises(ValueError, "cos: expected shape [S, R/2] (x has no batch dim), got shape (2, 3, 4)"):
        api.module.rope(*rope_args(api, x=(3, 4, 8), cos=(2, 3, 4)), pair_table=True)


def test_rope_sections(api):
    with raises(TypeError, "sections: expected None or a tuple of ints, got tuple"):
        api.module.rope(*rope_args(api, cos=(2, 3, 8)), sections=(2, 2.0))
    with raises(TypeError, "interleaved_sections: expected a bool, got str"):
        api.module.rope(*rope_args(api, cos=(2, 3, 8)), sections=(2, 2), interleaved_sections="yes")
    with raises(ValueError, "interleaved_sections: needs sections (got sections=None)"):
        api.module.rope(*rope_args(api), interleaved_sections=True)
    with raises(ValueError, "sections: expected 1 to 4 sections (one per table), got 0"):
        api.module.rope(*rope_args(api, cos=(2, 3, 8)), sections=())
    with raises(ValueError, "cos: expected shape [K, S, R/2] or [K, B, S, R/2], got shape (3, 4)"):
        api.module.rope(*rope_args(api, cos=(3, 4)), sections=(1, 1), pair_table=True)
    with raises(ValueError, "cos: expected 3 tables (K, one per section), got shape (2, 3, 8)"):
        api.module.rope(*rope_args(api, cos=(2, 3, 8)), sections=(2, 1, 1))
    with raises(ValueError, "sections: expected a sum of 2 (R/2, the rotating pairs), got 4"):
        api.module.rope(*rope_args(api, cos=(2, 2, 3, 2)), sections=(2, 2), pair_table=True)
    with raises(ValueError, "sections: expected each >= 0, got -2 (section 0)"):
        api.module.rope(*rope_args(api, cos=(2, 3, 8)), sections=(-2, 6))
    with raises(ValueError, "sections: interleaved section 2 reads pairs 2, 5, ... up to 5, beyond the R/2 = 4 pairs"):
        api.module.rope(*rope_args(api, cos=(3, 3, 8)), sections=(1, 1, 2), interleaved_sections=True)


# --- torch only -----------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["cos", "sin"])
def test_torch_rope_mixed_devices(torch, argument):
    from fuselet.torch import rope

    args = {"x": torch.ones(2, 3, 4, 8), "cos": torch.ones(3, 8), "sin": torch.ones(3, 8)}
    args[argument] = args[argument].to("meta")
    with raises(ValueError, f"{argument}: expected a tensor on cpu (the device of x), got meta"):
        rope(args["x"], args["cos"], args["sin"])


def test_torch_op_direct_rope(torch):
    """The core's own checks, reached through the registered ops."""
    x = torch.ones(2, 3, 4, 8)
    with raises(ValueError, "cos: the rotary dim R (last dimension) must be even and in [2, D=8], got shape [3, 7]"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(3, 7), torch.ones(3, 7))
    with raises(ValueError, "cos: expected 3 positions (S, dim 1 of dy [2, 3, 4, 8]), got shape [4, 8]"):
        torch.ops.fuselet.rope_bwd(x, torch.ones(4, 8), torch.ones(4, 8))
    with raises(ValueError, "sin: expected shape [3, 8] (the shape of cos), got [2, 3, 8]"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(3, 8), torch.ones(2, 3, 8))
    with raises(TypeError, "cos: expected dtype bfloat16 (the dtype of x) or float32, got float16"):
        torch.ops.fuselet.rope_fwd(x.bfloat16(), torch.ones(3, 8, dtype=torch.float16), torch.ones(3, 8))
    with raises(ValueError, "x: expected shape [B, N, S, D] or [N, S, D] (flags with FUSELET_ROPE_BHSD), got shape [3, 8]"):
        torch.ops.fuselet.rope_fwd(torch.ones(3, 8), torch.ones(3, 8), torch.ones(3, 8), True)
    with raises(ValueError, "cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D=8], got shape [3, 5]"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(3, 5), torch.ones(3, 5), False, False, True)
    with raises(ValueError, "sections: expected 1 to 4 sections (one per table), got 5"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(2, 3, 8), torch.ones(2, 3, 8), False, False, False, [1, 1, 1, 1, 0])
    with raises(ValueError, "sections: expected a sum of 4 (R/2, the rotating pairs), got 5"):
        torch.ops.fuselet.rope_bwd(x, torch.ones(2, 3, 8), torch.ones(2, 3, 8), False, False, False, [2, 3])
    with raises(ValueError, "flags: FUSELET_ROPE_SECTIONS_INTERLEAVED needs sections (got sections=NULL)"):
        torch.ops.fuselet.rope_fwd(x, torch.ones(3, 8), torch.ones(3, 8), False, False, False, None, True)
