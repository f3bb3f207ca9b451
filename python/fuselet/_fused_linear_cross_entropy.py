"""What fused linear cross-entropy decides the same way in both layers (no framework import)."""

from __future__ import annotations

import math

from fuselet._checks import check_cross_entropy_args

# Fewer tokens per chunk than this make the chunk's matmuls lose speed (measured on 2 CPU cores,
# bf16, H 1024, V 32768, the parts of a pass over 4096 tokens timed alone and added: the logits,
# dhidden and dweight matmuls plus the cross-entropy kernel took 1.40 s in chunks of 128 tokens,
# 1.27 s in chunks of 256, 1.15 s in one piece).
MIN_CHUNK = 256


def chunk_size_for(tokens: int, hidden: int, vocab: int) -> int:
    """The default chunk_size: the power of two at or above tokens / ceil(V / H), so that one
    chunk of logits [chunk, V] is about as large as hidden [tokens, H] (Liger-Kernel's rule), but
    at least MIN_CHUNK tokens, and at most all of them (at least 1). E.g. 4096 tokens, H 1024, V
    32768: 256 tokens (the rule alone: 128); 16384 tokens, H 4096, V 131072: 512."""
    if tokens <= 0:
        return 1
    per = max(1, math.ceil(tokens / max(1, math.ceil(vocab / max(hidden, 1)))))
    return min(tokens, max(MIN_CHUNK, 1 << (per - 1).bit_length()))


def options(
    target_shape: tuple,
    target_dtype: str,
    vocab: int,
    dtype: str,
    ignore_index,
    label_smoothing,
    z_loss,
    softcap,
    reduction,
    return_z_loss,
) -> tuple:
    """cross_entropy's checks of the options and target (as for logits [..., V] of hidden's dtype);
    the ops' scalar arguments (ignore_index, label_smoothing, z_loss, softcap; softcap None -> 0.0)."""
    check_cross_entropy_args(
        (*target_shape, vocab),
        dtype,
        tuple(target_shape),
        target_dtype,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        reduction,
        return_z_loss,
    )
    return int(ignore_index), float(label_smoothing), float(z_loss), 0.0 if softcap is None else float(softcap)
