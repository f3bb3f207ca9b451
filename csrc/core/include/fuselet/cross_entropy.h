/*
 * fuselet cross-entropy loss over the last dimension (language-model heads): per-token loss,
 * with label smoothing, z-loss, logit soft-capping and an ignored class id; and the per-token
 * log-probabilities, entropy and statistics of the same rows (fuselet_logprobs_*, below).
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

/* ---------------------------------------------------------------------------------------------
 * Per-token log-probabilities of a chunk of logits (the policy log-probs of RL and preference
 * trainers, TRL's ChunkedLogProbFunction): the same rows, target, ignore_index and softcap as the
 * cross-entropy above; label_smoothing and z_loss must be 0 (the `_check` functions refuse
 * others, naming the option).
 *
 * Math (per row, t = target, s_j as above, lse = log(sum_j exp(s_j)), p_j = exp(s_j - lse)):
 *   logp             = s_t - lse
 *   entropy          = lse - sum_j p_j s_j
 *   log_sum_sq_probs = log(sum_j p_j^2)
 *                    = log(sum_j exp(2 (s_j - m))) - 2 log(sum_j exp(s_j - m)), m = max_j s_j
 *   mean_logits      = mean_j(s_j)
 *   is_top1          = 1 if t is the argmax of s (s_t >= s_j for every j, s_t > s_j for j < t:
 *                      ties go to the lowest index, as argmax), else 0
 * Ignored rows (t == ignore_index): 0 in every output, a zero gradient row.
 * Backward (g = dlogp, h = dentropy of the row, each 0 where not given):
 *   ds_j      = g ([j == t] - p_j) - h p_j ((s_j - lse) + entropy)
 *   dlogit_j  = ds_j (1 - (s_j / c)^2)  with a softcap, else ds_j
 * (d entropy / d s_j = -p_j ((s_j - lse) + entropy); a class of s_j = -inf has p_j = 0 and no
 * gradient.)
 * A target outside [0, V) that is not ignore_index: as the cross-entropy's (CPU: refused naming
 * `target`, its index and its value; CUDA: NaN in every forward output of the row but lse, and
 * a zero gradient row).
 *
 * Forward. In: logits [..., V], target [N]. Out, each N contiguous float32: logp, lse (the
 * backward's input), entropy, log_sum_sq_probs, mean_logits, is_top1 (1.0 or 0.0); entropy and
 * the three statistics may be NULL (not computed). */
FUSELET_API fuselet_status fuselet_logprobs_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                const fuselet_cross_entropy_options* opts, fuselet_tensor* logp,
                                                fuselet_tensor* lse, fuselet_tensor* entropy,
                                                fuselet_tensor* log_sum_sq_probs, fuselet_tensor* mean_logits,
                                                fuselet_tensor* is_top1);

/* Backward. In: dlogp [N] (NULL: 0), dentropy [N] (NULL: 0), logits, target, lse (the
   forward's), entropy [N] (the forward's; needed when dentropy is given, else may be NULL). Out:
   dlogits like logits (may alias logits: in place). */
FUSELET_API fuselet_status fuselet_logprobs_bwd(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                                const fuselet_tensor* logits, const fuselet_tensor* target,
                                                const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                                const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits);

/* Their checks of the inputs and options, as the cross-entropy's `_check` functions. */
FUSELET_API fuselet_status fuselet_logprobs_fwd_check(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                      const fuselet_cross_entropy_options* opts);
FUSELET_API fuselet_status fuselet_logprobs_bwd_check(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                                      const fuselet_tensor* logits, const fuselet_tensor* target,
                                                      const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                                      const fuselet_cross_entropy_options* opts);

FUSELET_API fuselet_status fuselet_logprobs_fwd_cuda(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                     const fuselet_cross_entropy_options* opts, fuselet_tensor* logp,
                                                     fuselet_tensor* lse, fuselet_tensor* entropy,
                                                     fuselet_tensor* log_sum_sq_probs, fuselet_tensor* mean_logits,
                                                     fuselet_tensor* is_top1, void* stream);
FUSELET_API fuselet_status fuselet_logprobs_bwd_cuda(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                                     const fuselet_tensor* logits, const fuselet_tensor* target,
                                                     const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                                     const fuselet_cross_entropy_options* opts,
                                                     fuselet_tensor* dlogits, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_CROSS_ENTROPY_H_ */
