"""fuselet: fused transformer kernels with one C++/CUDA core and thin PyTorch and JAX layers.

``import fuselet`` needs neither framework. The framework layers are subpackages:

    import fuselet.torch   # fuselet.torch.rms_norm, layer_norm, RMSNorm, LayerNorm
    import fuselet.jax     # fuselet.jax.rms_norm, layer_norm

Each layer checks at import that it was compiled against the framework it is loaded into
(see :func:`info`), and raises one clear ImportError otherwise.
"""

import re
from pathlib import Path

from fuselet._info import info, report

try:
    from fuselet._version import __version__  # written by the build from the recipe's version
except ModuleNotFoundError:  # a source checkout on sys.path, never built: the recipe's line itself
    __version__ = re.search(
        r'^  version: "(.+)"$', (Path(__file__).resolve().parents[2] / "recipe" / "recipe.yaml").read_text(), re.MULTILINE
    ).group(1)
__all__ = ["__version__", "info", "report"]
