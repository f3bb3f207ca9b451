"""fuselet: fused transformer kernels with one C++/CUDA core and thin PyTorch and JAX layers.

``import fuselet`` needs neither framework. The framework layers are subpackages:

    import fuselet.torch   # fuselet.torch.rms_norm, layer_norm, RMSNorm, LayerNorm
    import fuselet.jax     # fuselet.jax.rms_norm, layer_norm

Each layer checks at import that it was compiled against the framework it is loaded into
(see :func:`info`), and raises one clear ImportError otherwise.
"""
from pathlib import Path

from fuselet._info import info, report

try:
    from fuselet._version import __version__  # written by the build from VERSION
except ModuleNotFoundError:  # a source checkout on sys.path, never built: VERSION itself
    __version__ = (Path(__file__).resolve().parents[2] / "VERSION").read_text().strip()
__all__ = ["__version__", "info", "report"]
