/*
 * fuselet cross-entropy loss over the last dimension (language-model heads): per-token loss,
 * with label smoothing, z-loss, logit soft-capping and an ignored class id.
 *
 * Shapes. logits is [..., V], read as N rows of V elements (N = product of the leading dims,
 * N may be 0; V > 0). Its last dim must have stride 1 and the leading dims must collapse into
 * a single row stride (any contiguous tensor, or a slice of rows of one). Supported dtypes:
 * FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16; the math runs in float32. target holds N
 * contiguous class ids, FUSELET_INT32 or FUSELET_INT64, in any shape with N elements (usually
 * logits' leading dims). loss, z, lse and dloss are N contiguous FUSELET_FLOAT32 values (any
 * shape with N elements). dlogits has logits' shape and dtype under the same row rule, and may
 * be the very memory of logits (the backward then overwrites the logits: in place).
 *
 * Math (per row, t = target, c = softcap, ls = label_smoothing, zl = z_loss):
 *   s_j   = c * tanh(x_j / c)  with a softcap c > 0, else s_j = x_j
 *   lse   = log(sum_j exp(s_j))
 *   ce    = (1 - ls) * (lse - s_t) + ls * (lse - mean_j(s_j))
 *   z     = zl * lse^2
 *   loss  = ce + z
 * Rows with t == ignore_index (any integer, [0, V) included) are ignored: loss = z = lse = 0
 * and their gradient is 0.
 * Backward (p = softmax(s) = exp(s - lse), g = the upstream gradient of the row's loss):
 *   ds_j      = g * (p_j * (1 + 2 zl lse) - (1 - ls) [j == t] - ls / V)
 *   dlogit_j  = ds_j * (1 - (s_j / c)^2)  with a softcap (d/dx c tanh(x / c)), else ds_j
 * (d/ds of lse is p, of mean(s) is 1/V, of zl lse^2 is 2 zl lse p.)
 *
 * A target outside [0, V) that is not ignore_index: the CPU entry points check every target
 * first and return FUSELET_ERR_INVALID_ARGUMENT naming `target`, its index and its value,
 * writing nothing. The CUDA kernels cannot report it: such a row gets loss = z = NaN (lse is
 * the row's true logsumexp) and an all-zero gradient row, and the other rows are unaffected.
 *
 * Host entry points take host pointers and run on the calling thread plus fuselet's own
 * worker threads; `_cuda` entry points take device pointers and enqueue on `stream`. No
 * workspace. Builds without CUDA return FUSELET_ERR_UNSUPPORTED from the `_cuda` ones.
 */
#ifndef FUSELET_CROSS_ENTROPY_H_
#define FUSELET_CROSS_ENTROPY_H_

#include "fuselet/fuselet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options shared by the forward and the backward (pass the same to both). */
typedef struct fuselet_cross_entropy_options {
  int64_t ignore_index;  /* rows with this target are ignored (e.g. -100) */
  float label_smoothing; /* ls, in [0, 1] */
  float z_loss;          /* zl, >= 0 and finite */
  float softcap;         /* c > 0 and finite, or 0 for no soft-capping */
} fuselet_cross_entropy_options;

/* Forward. In: logits [..., V], target [N]. Out: loss [N], z [N] (the zl lse^2 part; NULL: not
   written), lse [N] (the backward's input). 0 in every output where ignored. */
FUSELET_API fuselet_status fuselet_cross_entropy_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                     const fuselet_cross_entropy_options* opts, fuselet_tensor* loss,
                                                     fuselet_tensor* z, fuselet_tensor* lse);

/* Backward. In: dloss [N] (g per row), logits, target, lse (the forward's). Out: dlogits like
   logits (may alias logits: in place). */
FUSELET_API fuselet_status fuselet_cross_entropy_bwd(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                                     const fuselet_tensor* target, const fuselet_tensor* lse,
                                                     const fuselet_cross_entropy_options* opts,
                                                     fuselet_tensor* dlogits);

/* Forward and backward in one pass over the logits (fused linear cross-entropy, chunk by chunk):
   loss, z as in the forward (z may be NULL); dlogits = grad_scale * d loss_row / d logits, that is
   the backward with g = grad_scale for every row (0 rows where ignored); may alias logits.
   grad_scale must be finite. */
FUSELET_API fuselet_status fuselet_cross_entropy_fwd_bwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                         const fuselet_cross_entropy_options* opts, float grad_scale,
                                                         fuselet_tensor* loss, fuselet_tensor* z,
                                                         fuselet_tensor* dlogits);

/* The checks of the inputs and options of the entry points above, host and `_cuda` alike, on
 * views of any strides >= 0 with no data read (fuselet.h: the `_check` functions): the targets'
 * values (in [0, V) or ignore_index) are data, which the entry points check. */
FUSELET_API fuselet_status fuselet_cross_entropy_fwd_check(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                           const fuselet_cross_entropy_options* opts);
FUSELET_API fuselet_status fuselet_cross_entropy_bwd_check(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                                           const fuselet_tensor* target, const fuselet_tensor* lse,
                                                           const fuselet_cross_entropy_options* opts);
FUSELET_API fuselet_status fuselet_cross_entropy_fwd_bwd_check(const fuselet_tensor* logits,
                                                               const fuselet_tensor* target,
                                                               const fuselet_cross_entropy_options* opts,
                                                               float grad_scale);

FUSELET_API fuselet_status fuselet_cross_entropy_fwd_cuda(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                          const fuselet_cross_entropy_options* opts,
                                                          fuselet_tensor* loss, fuselet_tensor* z, fuselet_tensor* lse,
                                                          void* stream);
FUSELET_API fuselet_status fuselet_cross_entropy_bwd_cuda(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                                          const fuselet_tensor* target, const fuselet_tensor* lse,
                                                          const fuselet_cross_entropy_options* opts,
                                                          fuselet_tensor* dlogits, void* stream);
FUSELET_API fuselet_status fuselet_cross_entropy_fwd_bwd_cuda(
    const fuselet_tensor* logits, const fuselet_tensor* target, const fuselet_cross_entropy_options* opts,
    float grad_scale, fuselet_tensor* loss, fuselet_tensor* z, fuselet_tensor* dlogits, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_CROSS_ENTROPY_H_ */
