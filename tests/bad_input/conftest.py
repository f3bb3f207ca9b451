"""What the bad-input tests of every op family share (tests/bad_input/test_<stem>.py): the public
API of one layer and how to make its arrays (the `api` fixture), `raises`, and in torch the
`torch` fixture and the exception a raw op call raises for a wrong dtype."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.conftest import import_layer


class Api:
    """The public API of one layer, and how to make its arrays."""

    def __init__(self, framework, module):
        self.framework, self.module = framework, module

    def array(self, shape, dtype="float32"):
        values = np.asarray(np.arange(1, 1 + int(np.prod(shape)), dtype=np.float64).reshape(shape) / 7)
        if self.framework == "torch":
            import torch

            return torch.from_numpy(values).to(getattr(torch, dtype))
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(dtype == "float64"):  # a real float64 jax.Array
            return jnp.asarray(values, dtype=dtype)

    def rms_norm(self, x, weight, *args, **kwargs):
        return self.module.rms_norm(x, weight, *args, **kwargs)

    def layer_norm(self, x, weight, bias, *args, **kwargs):
        return self.module.layer_norm(x, weight, bias, *args, **kwargs)


@pytest.fixture
def api(layer):
    return Api(*layer)


def raises(exc, message):
    """pytest.raises for `exc` whose message contains `message` (taken literally)."""
    return pytest.raises(exc, match=re.escape(message))


@pytest.fixture
def torch():
    import_layer("torch")
    import torch

    return torch
