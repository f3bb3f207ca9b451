/*
 * fuselet scaled, optionally causal softmax over the last dimension (attention scores).
 *
 * Shapes. x is [..., K] (with the causal flag [..., Q, K]), read as R rows of K elements
 * (R = product of the leading dims, R may be 0; K > 0). The last dim must have stride 1 and the
 * leading dims must collapse into a single row stride (any contiguous tensor, or a slice of
 * rows of one). y, dy and dx follow the same rule and have x's shape and dtype. Supported
 * dtypes: FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16; the math runs in float32.
 * scale must be finite. flags: a bitwise OR of fuselet_softmax_flags (0: none).
 *
 * Math (per row r, the query index i = r mod Q with FUSELET_SOFTMAX_CAUSAL):
 *   s_j = scale * x_j for the unmasked keys j; with FUSELET_SOFTMAX_CAUSAL key j is masked
 *         when j > i + (K - Q) (bottom-right aligned, as flash-attention does)
 *   y_j = exp(s_j - max(s)) / sum(exp(s - max(s)))  for unmasked j,  y_j = 0 for masked j;
 *         a row with every key masked (Q > K, i < Q - K) is all zeros, never NaN.
 * Backward (from y, the forward's output; masked keys have y = 0, hence dx = 0):
 *   dx_j = scale * y_j * (dy_j - sum_k dy_k * y_k)
 *
 * Host entry points take host pointers and run on the calling thread plus fuselet's own
 * worker threads; `_cuda` entry points take device pointers and enqueue on `stream`. No
 * workspace. Builds without CUDA return FUSELET_ERR_UNSUPPORTED from the `_cuda` ones.
 */
#ifndef FUSELET_SOFTMAX_H_
#define FUSELET_SOFTMAX_H_

#include "fuselet/fuselet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of the softmax entry points, combined with bitwise OR. */
typedef enum fuselet_softmax_flags {
  FUSELET_SOFTMAX_CAUSAL = 1 /* mask key j for query i when j > i + (K - Q); needs x [..., Q, K] */
} fuselet_softmax_flags;

/* Forward. In: x [..., K] ([..., Q, K] when causal), scale, flags. Out: y like x. */
FUSELET_API fuselet_status fuselet_softmax_fwd(const fuselet_tensor* x, float scale, uint32_t flags,
                                               fuselet_tensor* y);

/* Backward. In: dy, y (the forward's output) [..., K], scale. Out: dx like y. */
FUSELET_API fuselet_status fuselet_softmax_bwd(const fuselet_tensor* dy, const fuselet_tensor* y, float scale,
                                               fuselet_tensor* dx);

/* The checks of the inputs and options of the entry points above, host and `_cuda` alike, on
 * views of any strides >= 0 with no data read (fuselet.h: the `_check` functions). */
FUSELET_API fuselet_status fuselet_softmax_fwd_check(const fuselet_tensor* x, float scale, uint32_t flags);
FUSELET_API fuselet_status fuselet_softmax_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* y, float scale);

FUSELET_API fuselet_status fuselet_softmax_fwd_cuda(const fuselet_tensor* x, float scale, uint32_t flags,
                                                    fuselet_tensor* y, void* stream);
FUSELET_API fuselet_status fuselet_softmax_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* y, float scale,
                                                    fuselet_tensor* dx, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_SOFTMAX_H_ */
