/*
 * fuselet per-row divergences between two distributions over the last dimension (distillation
 * losses): the Kullback-Leibler divergence, the generalized Jensen-Shannon divergence and the
 * total variation distance, each summed over a row into one float32 loss per row.
 *
 * Shapes. input and target are [..., V], read as N rows of V elements (N = product of the
 * leading dims, N may be 0; V > 0), of the same shape and dtype. Their last dim must have stride
 * 1 and the leading dims must collapse into a single row stride (any contiguous tensor, or a
 * slice of rows of one). Supported dtypes: FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16;
 * the math runs in float32. loss and dloss are N contiguous FUSELET_FLOAT32 values (any shape
 * with N elements). dinput has input's shape and dtype, dtarget target's, under the same rule.
 *
 * Math (per row, x = input, the log-probabilities log Q of the distribution being trained;
 * t = target: log-probabilities log P, or with KL and log_target = 0 the probabilities P):
 *   Q_j = exp(x_j), P_j = exp(t_j) (or t_j)
 *   KL:  loss = sum_j P_j (log P_j - x_j)                        (torch.nn.functional.kl_div)
 *   JSD: M_j = beta P_j + (1 - beta) Q_j,
 *        loss = beta sum_j P_j (log P_j - log M_j) + (1 - beta) sum_j Q_j (x_j - log M_j);
 *        beta = 0 is the forward KL(P || Q) = sum_j P_j (log P_j - x_j), beta = 1 the reverse
 *        KL(Q || P) = sum_j Q_j (x_j - log P_j) (the generalized JSD of on-policy distillation)
 *   TVD: loss = 0.5 sum_j |P_j - Q_j|
 * A term whose weight P_j (Q_j) is 0 is 0, whatever the logarithm beside it (0 log 0 = 0).
 * Backward (g = dloss of the row):
 *   KL:  dx_j = -g P_j;  dt_j = g P_j (t_j - x_j + 1) (log target), g (log t_j + 1 - x_j) (P_j > 0,
 *        else 0)
 *   JSD: dx_j = g (1 - beta) Q_j (x_j - log M_j),  dt_j = g beta P_j (t_j - log M_j);
 *        beta = 0: dx_j = -g P_j, dt_j = g P_j (t_j - x_j + 1); beta = 1: dx_j = g Q_j (x_j - t_j + 1),
 *        dt_j = -g Q_j
 *   TVD: dx_j = -0.5 g sign(P_j - Q_j) Q_j,  dt_j = 0.5 g sign(P_j - Q_j) P_j  (sign(0) = 0)
 *
 * Over logits, forward and backward in one pass (fuselet_divergence_logits: a chunk of a fused
 * linear distillation loss). input [..., V] holds the logits of the distribution being trained
 * (the student's), target [..., V] those of P (the teacher's), of one shape and dtype; scale > 0
 * (1 / temperature) multiplies both; log_target must be 1. Per row r, with g = dloss[r]:
 *   x = log_softmax(scale input_r), t = log_softmax(scale target_r), loss[r] = the row's divergence
 *   of x and t as above (g does not enter it), and input_r is overwritten with the gradient of
 *   g loss[r] with respect to input_r: g scale (dx_j - Q_j sum_k dx_k), dx of the backward above,
 *   in input's dtype (float32 math). A row with g = 0 gets zeros.
 *
 * Host entry points take host pointers and run on the calling thread plus fuselet's own
 * worker threads; `_cuda` entry points take device pointers and enqueue on `stream`. No
 * workspace. Builds without CUDA return FUSELET_ERR_UNSUPPORTED from the `_cuda` ones.
 */
#ifndef FUSELET_DIVERGENCE_H_
#define FUSELET_DIVERGENCE_H_

#include "fuselet/fuselet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which divergence (fuselet_divergence_options.kind). */
typedef enum fuselet_divergence_kind {
  FUSELET_DIVERGENCE_KL = 0,  /* Kullback-Leibler KL(P || Q) */
  FUSELET_DIVERGENCE_JSD = 1, /* generalized Jensen-Shannon, weight beta on P */
  FUSELET_DIVERGENCE_TVD = 2  /* total variation distance */
} fuselet_divergence_kind;

/* Options shared by the forward and the backward (pass the same to both). */
typedef struct fuselet_divergence_options {
  int32_t kind;       /* a fuselet_divergence_kind */
  int32_t log_target; /* 1: target holds log-probabilities; 0: probabilities (KL only) */
  float beta;         /* JSD: the weight of P in the mixture, in [0, 1]; the others: 0 */
} fuselet_divergence_options;

/* Forward. In: input, target [..., V]. Out: loss [N], float32. */
FUSELET_API fuselet_status fuselet_divergence_fwd(const fuselet_tensor* input, const fuselet_tensor* target,
                                                  const fuselet_divergence_options* opts, fuselet_tensor* loss);

/* Backward. In: dloss [N] (g per row), input, target. Out: dinput like input, dtarget like
   target; either may be NULL (not computed), not both. */
FUSELET_API fuselet_status fuselet_divergence_bwd(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                                  const fuselet_tensor* target, const fuselet_divergence_options* opts,
                                                  fuselet_tensor* dinput, fuselet_tensor* dtarget);

/* Forward and backward over logits. In: input (the logits, overwritten by their gradient), target
   [..., V], dloss [N] (g per row), scale. Out: loss [N], float32. */
FUSELET_API fuselet_status fuselet_divergence_logits(fuselet_tensor* input, const fuselet_tensor* target,
                                                     const fuselet_tensor* dloss,
                                                     const fuselet_divergence_options* opts, float scale,
                                                     fuselet_tensor* loss);

/* The checks of the inputs and options of the entry points above, host and `_cuda` alike, on
 * views of any strides >= 0 with no data read (fuselet.h: the `_check` functions). */
FUSELET_API fuselet_status fuselet_divergence_fwd_check(const fuselet_tensor* input, const fuselet_tensor* target,
                                                        const fuselet_divergence_options* opts);
FUSELET_API fuselet_status fuselet_divergence_bwd_check(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                                        const fuselet_tensor* target,
                                                        const fuselet_divergence_options* opts);
FUSELET_API fuselet_status fuselet_divergence_logits_check(const fuselet_tensor* input, const fuselet_tensor* target,
                                                           const fuselet_tensor* dloss,
                                                           const fuselet_divergence_options* opts, float scale);

FUSELET_API fuselet_status fuselet_divergence_fwd_cuda(const fuselet_tensor* input, const fuselet_tensor* target,
                                                       const fuselet_divergence_options* opts, fuselet_tensor* loss,
                                                       void* stream);
FUSELET_API fuselet_status fuselet_divergence_bwd_cuda(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                                       const fuselet_tensor* target,
                                                       const fuselet_divergence_options* opts, fuselet_tensor* dinput,
                                                       fuselet_tensor* dtarget, void* stream);
FUSELET_API fuselet_status fuselet_divergence_logits_cuda(fuselet_tensor* input, const fuselet_tensor* target,
                                                          const fuselet_tensor* dloss,
                                                          const fuselet_divergence_options* opts, float scale,
                                                          fuselet_tensor* loss, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_DIVERGENCE_H_ */
