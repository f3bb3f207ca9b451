"""fuselet for JAX: fused kernels as XLA FFI custom calls, with custom_vjp gradients.

jit, grad, vmap and sharding (jit over a mesh, shard_map, several processes) work; on GPUs the
kernels run on XLA's stream. Importing registers every FFI target (no JAX backend is initialized,
so jax.distributed.initialize() may follow); fuselet.jax.export.disabled_checks() is what
jax.export needs.
"""

from fuselet.jax._load import load as _load_library

BUILD_INFO = _load_library()

from fuselet.jax import export  # noqa: E402
from fuselet.jax.cross_entropy import cross_entropy  # noqa: E402
from fuselet.jax.divergence import jsd, kl_div, tvd  # noqa: E402
from fuselet.jax.fused_linear_cross_entropy import fused_linear_cross_entropy  # noqa: E402
from fuselet.jax.fused_linear_jsd import JSDPerToken, fused_linear_jsd, fused_linear_jsd_per_token  # noqa: E402
from fuselet.jax.fused_linear_logprobs import LogProbs, fused_linear_logprobs  # noqa: E402
from fuselet.jax.glu import clamped_swiglu, geglu, swiglu  # noqa: E402
from fuselet.jax.losses import fused_linear_grpo_loss, fused_linear_kto_loss, fused_linear_preference_loss  # noqa: E402
from fuselet.jax.norm import add_rms_norm, gated_rms_norm, layer_norm, rms_norm  # noqa: E402
from fuselet.jax.rope import rope  # noqa: E402
from fuselet.jax.softmax import softmax  # noqa: E402

__all__ = [
    "BUILD_INFO",
    "add_rms_norm",
    "clamped_swiglu",
    "cross_entropy",
    "export",
    "fused_linear_cross_entropy",
    "fused_linear_grpo_loss",
    "fused_linear_jsd",
    "fused_linear_jsd_per_token",
    "JSDPerToken",
    "fused_linear_logprobs",
    "LogProbs",
    "fused_linear_kto_loss",
    "fused_linear_preference_loss",
    "geglu",
    "jsd",
    "kl_div",
    "gated_rms_norm",
    "layer_norm",
    "rms_norm",
    "rope",
    "softmax",
    "swiglu",
    "tvd",
]
