"""fuselet: fused transformer kernels with one C++/CUDA core and thin PyTorch and JAX layers.

``import fuselet`` needs neither framework. The framework layers are subpackages:

    import fuselet.torch   # fuselet.torch.rms_norm, layer_norm, RMSNorm, LayerNorm
    import fuselet.jax     # fuselet.jax.rms_norm, layer_norm

Each layer checks at import that it was compiled against the framework it is loaded into
(see :func:`info`), and raises one clear ImportError otherwise.
"""
from fuselet._info import info, report

__version__ = "0.1.0"
__all__ = ["__version__", "info", "report"]
