"""fused_linear_cross_entropy: hidden [..., H] of a float dtype, H > 0; weight [V, H] (V > 0) and
bias [V] or None in hidden's dtype; target hidden.shape[:-1] of class ids; chunk_size None or an
int >= 1; the options of cross_entropy (spec/cross_entropy.py). And its default chunk size, which
both layers take."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuselet.spec import _rules as r
from fuselet.spec import cross_entropy
from fuselet.spec._rules import Array, Refusal
from fuselet.spec.cross_entropy import CrossEntropyOptions

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


# The classes per block of a backward that recomputes the logits over blocks of classes
# (vocab_block_for). Measured on 2 CPU cores, bf16, H 1024, V 32768, the backward of
# reduction="none" over 4096 tokens: 1024 classes 0.53-0.57 s, 512 0.61-0.74 s, 2048 0.71-0.76 s,
# 256 0.70-0.73 s, chunks of 256 tokens 0.79-0.85 s.
VOCAB_BLOCK = 1024


def vocab_block_for(tokens: int, vocab: int, chunk: int) -> int:
    """How a backward that recomputes the logits (reduction="none", the log-probabilities: their
    per-token gradients are known only after the forward) walks them: 0 for chunks of `chunk`
    tokens, each chunk's [V, H] share of dweight added into a float32 accumulator; else the classes
    per block, each block [tokens, block] of all the tokens giving its rows of dweight in one matmul
    (no accumulator, one rounding) while dhidden's [tokens, H] shares are added in float32.

    Blocks where there is more than one chunk and the tokens are at most a quarter of the classes
    (the float32 [tokens, H] sum then at most a quarter of the float32 [V, H] one; at 8192 tokens of
    V 32768 the two ways took the same time, 1.53 s). A block is VOCAB_BLOCK classes, or fewer, so
    that [tokens, block] is no larger than a chunk's [chunk, V]."""
    if tokens <= chunk or 4 * tokens > vocab:
        return 0
    return max(1, min(VOCAB_BLOCK, chunk * vocab // tokens))


def one_pass_for(tokens: int, vocab: int, chunk: int) -> bool:
    """Whether a loss whose per-token gradients are known as soon as each chunk's logits are (the
    mean / sum cross-entropy, GRPO's token-separable losses) takes one pass over chunks of tokens
    (three matmuls of the head, each chunk's [V, H] share of dweight added in float32), or else
    two: the forward's log-sum-exp over chunks, then the backward by blocks of classes
    (vocab_block_for: four matmuls, nothing of [V, H] added, no float32 [V, H] buffer).

    Two where the tokens are at most an eighth of the classes (and more than one chunk). Measured
    on 2 CPU cores, bf16, H 1024, V 32768, the mean cross-entropy's forward + backward, one pass ->
    two: 2048 tokens 0.47 -> 0.39 s, 4096 tokens 0.89 -> 0.75 s, 8192 tokens 1.77 -> 1.97 s."""
    return tokens <= chunk or 8 * tokens > vocab


@dataclass(frozen=True)
class FusedLinearCrossEntropyOptions:
    cross_entropy: CrossEntropyOptions
    chunk_size: int | None = None

    def op_args(self, mean: bool | None = None) -> tuple:
        """The raw ops' scalar arguments: fused_linear_cross_entropy_none's (ignore_index,
        label_smoothing, z_loss, softcap, chunk_size), chunk_size None as 0 (the op decides it:
        chunk_size_for); with `mean`, fused_linear_cross_entropy_reduced's (..., softcap, mean,
        chunk_size)."""
        chunk = self.chunk_size or 0
        return (*self.cross_entropy.op_args(), *(() if mean is None else (mean,)), chunk)


def _arrays(hidden: tuple, weight: tuple, bias: tuple | None, target_shape: tuple) -> None:
    (h_shape, h_dtype), (w_shape, w_dtype) = hidden, weight
    r.float_dtype("hidden", h_dtype)
    r.rows("hidden", h_shape, "[..., H]")
    r.last_positive("hidden", h_shape, "the hidden size (last dimension)")
    r.float_dtype("weight", w_dtype, ("hidden", h_dtype))
    if len(w_shape) != 2 or w_shape[1] != h_shape[-1] or w_shape[0] == 0:
        raise ValueError(
            f"weight: expected shape [V, {h_shape[-1]}] (V > 0; H: the last dimension of hidden "
            f"{tuple(h_shape)}), got {tuple(w_shape)}"
        )
    if bias is not None:
        r.float_dtype("bias", bias[1], ("hidden", h_dtype))
        r.same_shape("bias", bias[0], (w_shape[0],), "V, the rows of weight")
    r.same_shape("target", target_shape, h_shape[:-1], f"the leading dimensions of hidden {tuple(h_shape)}")


def fused_linear_cross_entropy(
    hidden: tuple, weight: tuple, bias: tuple | None, target: tuple, chunk_size=None, **opts
) -> FusedLinearCrossEntropyOptions:
    """The arrays (shape, dtype), bias None or one; opts: those of cross_entropy.options()."""
    _arrays(hidden, weight, bias, target[0])
    r.count("chunk_size", chunk_size, "tokens per chunk")
    r.index_dtype("target", target[1])
    return FusedLinearCrossEntropyOptions(cross_entropy.options(**opts), chunk_size)


# --- the raw ops (torch.ops.fuselet.fused_linear_cross_entropy_*: their impls and fake impls) ---


def op(hidden: tuple, weight: tuple, bias: tuple | None, target: tuple, op_args: tuple, chunk_size, tokens=None):
    """hidden [N, H], weight, bias, target [N]; op_args (ignore_index, label_smoothing, z_loss,
    softcap: 0.0 none) and chunk_size (0: the default) as FusedLinearCrossEntropyOptions.op_args()
    gives them; per-token `tokens` [N] {"dloss": (shape, dtype): any float dtype, "lse": float32}."""
    if len(hidden[0]) != 2:
        raise ValueError(f"hidden: expected shape [N, H], got {r.shape_str(hidden[0])}")
    _arrays(hidden, weight, bias, target[0])
    r.count("chunk_size", None if chunk_size == 0 else chunk_size, "tokens per chunk")
    r.index_dtype("target", target[1])
    options = FusedLinearCrossEntropyOptions(cross_entropy.op_options(op_args), chunk_size or None)
    for name, (shape, dtype) in (tokens or {}).items():
        if not dtype.startswith(("float", "bfloat")) or (name == "lse" and dtype != "float32"):
            raise TypeError(f"{name}: expected {'float32' if name == 'lse' else 'a float dtype'}, got {dtype}")
        if tuple(shape) != (hidden[0][0],):
            raise ValueError(f"{name}: expected shape [{hidden[0][0]}] (the rows of hidden), got {r.shape_str(shape)}")
    return options


# --- the table of bad values (tests/test_spec.py; the options': spec/cross_entropy.py) ---------

HIDDEN, WEIGHT, TARGET = Array((2, 4)), Array((5, 4)), Array((2,), "int32")
EXAMPLES = {"fused_linear_cross_entropy": {"hidden": HIDDEN, "weight": WEIGHT, "target": TARGET, "bias": Array((5,))}}
FLCE = tuple(EXAMPLES)
REFUSALS = [
    Refusal(
        FLCE, {"hidden": Array((2, 4), "int32")}, TypeError, "hidden: expected dtype float32, float16 or bfloat16, got int32"
    ),
    Refusal(
        FLCE,
        {"hidden": Array(()), "target": Array((), "int32")},
        ValueError,
        "hidden: expected shape [..., H] with at least 1 dimension, got a 0-d array",
        raw="hidden: expected shape [N, H], got []",
    ),
    Refusal(
        FLCE,
        {"hidden": Array((2, 0)), "weight": Array((5, 0))},
        ValueError,
        "hidden: the hidden size (last dimension) must be > 0",
    ),
    Refusal(FLCE, {"weight": Array((5, 4), "bfloat16")}, TypeError, "weight: expected dtype float32 (the dtype of hidden), got"),
    Refusal(FLCE, {"weight": Array((5, 3))}, ValueError, "weight: expected shape [V, 4] (V > 0; H: the last dimension of hidden"),
    Refusal(FLCE, {"bias": Array((5,), "float16")}, TypeError, "bias: expected dtype float32 (the dtype of hidden), got float16"),
    Refusal(FLCE, {"bias": Array((4,))}, ValueError, "bias: expected shape (5,) (V, the rows of weight), got (4,)"),
    Refusal(FLCE, {"target": Array((3,), "int32")}, ValueError, "target: expected shape (2,) (the leading dimensions of hidden"),
    Refusal(FLCE, {"target": Array((2,))}, TypeError, "target: expected dtype int32 or int64 (class ids), got float32"),
    Refusal(FLCE, {"chunk_size": 1.5}, TypeError, "chunk_size: expected None or an int (tokens per chunk), got float"),
    # 0 is the raw ops' default
    Refusal(FLCE, {"chunk_size": 0}, ValueError, "chunk_size: expected None or an int >= 1 (tokens per chunk), got 0", raw=False),
    Refusal(FLCE, {"chunk_size": -1}, ValueError, "chunk_size: expected None or an int >= 1 (tokens per chunk), got -1"),
]
N2, OP_ARGS = Array((2,)), {**cross_entropy.OP_ARGS, "chunk_size": 0}
OP_REFUSALS = [
    Refusal(
        ("fused_linear_cross_entropy_none_bwd",),
        {"dloss": Array((2,), "int32"), "hidden": HIDDEN, "weight": WEIGHT, "bias": None, "target": TARGET, "lse": N2, **OP_ARGS},
        TypeError,
        "dloss: expected a float dtype, got int32",
    ),
    Refusal(
        ("fused_linear_cross_entropy_none_bwd",),
        {"dloss": N2, "hidden": HIDDEN, "weight": WEIGHT, "bias": None, "target": TARGET, "lse": Array((3,)), **OP_ARGS},
        ValueError,
        "lse: expected shape [2] (the rows of hidden), got [3]",
    ),
]
