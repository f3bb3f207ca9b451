"""A short demo: fuselet's norms next to the frameworks' own, in PyTorch and in JAX."""

import fuselet
import numpy as np

fuselet.info()
rng = np.random.default_rng(0)
x_np = rng.standard_normal((4, 1024), dtype=np.float32)
w_np = rng.standard_normal(1024, dtype=np.float32)

try:
    import fuselet.torch as ft
    import torch
except ImportError as exc:
    print(f"\ntorch demo skipped: {exc}")
else:
    x = torch.from_numpy(x_np).requires_grad_()
    w = torch.from_numpy(w_np).requires_grad_()
    y = ft.rms_norm(x, w, eps=1e-6)
    y.square().sum().backward()
    ref = torch.nn.functional.rms_norm(x.detach(), (1024,), w.detach(), eps=1e-6)
    print(
        f"\ntorch: fuselet.torch.rms_norm vs torch.nn.functional.rms_norm: max |diff| = "
        f"{(y - ref).abs().max().item():.2e}; grad of weight computed, norm {w.grad.norm().item():.3f}"
    )

try:
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp
except ImportError as exc:
    print(f"\njax demo skipped: {exc}")
else:
    x, w, b = jnp.asarray(x_np), jnp.asarray(w_np), jnp.zeros(1024)
    y = jax.jit(fj.layer_norm)(x, w, b)
    ref = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    g = jax.grad(lambda w: fj.layer_norm(x, w, b).sum())(w)
    print(
        f"jax:   fuselet.jax.layer_norm (jit) vs jnp reference: max |diff| = {float(jnp.abs(y - ref).max()):.2e}; "
        f"grad of weight shape {g.shape}"
    )
