"""The C ABI called directly through ctypes, as a C caller would: numpy views handed over by
their raw pointer, shape and strides. A reversed view (negative strides) is refused with a
message naming the argument, and nothing is read or written."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

MAX_DIMS = 8
FLOAT32 = 0
INVALID_ARGUMENT = 1


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


def tensor(a: np.ndarray) -> Tensor:
    """A fuselet_tensor viewing the float32 array `a` as is (strides in elements, any sign)."""
    assert a.dtype == np.float32
    t = Tensor()
    t.data = a.__array_interface__["data"][0]
    t.dtype = FLOAT32
    t.ndim = a.ndim
    for d in range(a.ndim):
        t.shape[d] = a.shape[d]
        t.strides[d] = a.strides[d] // a.itemsize
    return t


@pytest.fixture(scope="module")
def lib():
    from fuselet import _core

    lib = _core.load()
    lib.fuselet_softmax_fwd.argtypes = [ctypes.POINTER(Tensor), ctypes.c_float, ctypes.c_uint32, ctypes.POINTER(Tensor)]
    lib.fuselet_rms_norm_fwd.argtypes = (
        [ctypes.POINTER(Tensor)] * 2 + [ctypes.c_float, ctypes.c_uint32] + [ctypes.POINTER(Tensor)] * 2
    )
    return lib


def test_reversed_view_is_refused(lib):
    base = np.arange(32, dtype=np.float32).reshape(4, 8)
    x = base[::-1]  # starts at row 3, row stride -8
    assert x.strides[0] < 0
    y = np.full((4, 8), -1.0, dtype=np.float32)
    tx, ty = tensor(x), tensor(y)
    status = lib.fuselet_softmax_fwd(ctypes.byref(tx), 1.0, 0, ctypes.byref(ty))
    message = lib.fuselet_last_error().decode()
    assert status == INVALID_ARGUMENT, message
    assert message.startswith("x: negative strides are not supported (dimension 0 has stride -8)"), message
    assert (y == -1.0).all()  # nothing written


def test_reversed_output_is_refused(lib):
    x = np.ones((4, 8), dtype=np.float32)
    out = np.zeros((4, 8), dtype=np.float32)
    y = out[:, ::-1]
    w, rstd = np.ones(8, dtype=np.float32), np.zeros(4, dtype=np.float32)
    tx, tw, ty, tr = tensor(x), tensor(w), tensor(y), tensor(rstd)
    status = lib.fuselet_rms_norm_fwd(ctypes.byref(tx), ctypes.byref(tw), 1e-6, 0, ctypes.byref(ty), ctypes.byref(tr))
    message = lib.fuselet_last_error().decode()
    assert status == INVALID_ARGUMENT, message
    assert message.startswith("y: negative strides are not supported (dimension 1 has stride -1)"), message
    assert (out == 0).all() and (rstd == 0).all()


def test_contiguous_copy_is_accepted(lib):
    x = np.ascontiguousarray(np.arange(32, dtype=np.float32).reshape(4, 8)[::-1])
    y = np.zeros((4, 8), dtype=np.float32)
    tx, ty = tensor(x), tensor(y)
    assert lib.fuselet_softmax_fwd(ctypes.byref(tx), 1.0, 0, ctypes.byref(ty)) == 0, lib.fuselet_last_error()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
