"""fuselet for PyTorch: fused kernels as torch.library custom ops (torch.ops.fuselet.*).

Works with autograd, torch.compile(fullgraph=True) and fake tensors; CUDA tensors run on
the current CUDA stream. torch.export and AOTInductor packages keep the ops as calls by name:
import fuselet.torch before torch._inductor.aoti_load_package. ONNX export: fuselet.torch.onnx.
"""

from fuselet.torch._load import load as _load_library

BUILD_INFO = _load_library()

from fuselet.torch import transformers  # noqa: E402  (imports transformers only when fuse() runs)
from fuselet.torch._dtensor import install as _install_sharding  # noqa: E402
from fuselet.torch.cross_entropy import cross_entropy  # noqa: E402
from fuselet.torch.divergence import jsd, kl_div, tvd  # noqa: E402
from fuselet.torch.fused_linear_cross_entropy import fused_linear_cross_entropy  # noqa: E402
from fuselet.torch.fused_linear_jsd import FusedLinearJSD, JSDPerToken, fused_linear_jsd, fused_linear_jsd_per_token  # noqa: E402
from fuselet.torch.fused_linear_logprobs import LogProbs, fused_linear_logprobs  # noqa: E402
from fuselet.torch.glu import clamped_swiglu, geglu, swiglu  # noqa: E402
from fuselet.torch.losses import (  # noqa: E402
    FusedLinearGRPOLoss,
    FusedLinearKTOLoss,
    FusedLinearPreferenceLoss,
    fused_linear_grpo_loss,
    fused_linear_kto_loss,
    fused_linear_preference_loss,
)
from fuselet.torch.norm import GatedRMSNorm, LayerNorm, RMSNorm, add_rms_norm, gated_rms_norm, layer_norm, rms_norm  # noqa: E402
from fuselet.torch.rope import rope  # noqa: E402
from fuselet.torch.softmax import softmax  # noqa: E402

_install_sharding()  # DTensor sharding rules of every op, once torch.distributed.tensor is imported

__all__ = [
    "BUILD_INFO",
    "FusedLinearGRPOLoss",
    "FusedLinearJSD",
    "FusedLinearKTOLoss",
    "FusedLinearPreferenceLoss",
    "LayerNorm",
    "RMSNorm",
    "GatedRMSNorm",
    "add_rms_norm",
    "clamped_swiglu",
    "cross_entropy",
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
    "layer_norm",
    "rms_norm",
    "gated_rms_norm",
    "rope",
    "softmax",
    "swiglu",
    "tvd",
    "transformers",
]
