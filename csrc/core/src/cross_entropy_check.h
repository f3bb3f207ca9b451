// Argument checking shared by the CPU and CUDA cross-entropy entry points.
#pragma once

#include "fuselet/cross_entropy.h"
#include "internal.h"

namespace fuselet {

// A checked cross-entropy problem: N rows of V logits, one target per row.
struct CrossEntropyProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;
  int64_t rows = 0, vocab = 0;
  int64_t ignore_index = -100;
  float label_smoothing = 0.f, z_loss = 0.f, softcap = 0.f;  // softcap 0: none
  float grad_scale = 1.f;                                     // fwd_bwd: g of every row
  // clang-format off: each data pointer beside its strides
  const void* logits = nullptr;  int64_t logits_stride = 0;
  const void* target = nullptr;  bool target64 = false;
  float* loss = nullptr;  // fwd, fwd_bwd
  float* z = nullptr;     // fwd, fwd_bwd (NULL: not written)
  float* lse = nullptr;   // fwd: written; bwd: read
  const float* dloss = nullptr;  // bwd (NULL in fwd_bwd: grad_scale instead)
  void* dlogits = nullptr;  int64_t dlogits_stride = 0;  // bwd, fwd_bwd
  // logprobs: loss is logp and dloss dlogp (NULL in the backward: 0); lse as above
  float* entropy = nullptr;           // fwd: written (NULL: not computed); bwd: read (NULL without dentropy)
  float* log_sum_sq_probs = nullptr;  // fwd (NULL: not computed)
  float* mean_logits = nullptr;       // fwd (NULL: not computed)
  float* is_top1 = nullptr;           // fwd (NULL: not computed)
  const float* dentropy = nullptr;    // bwd (NULL: 0)
  // clang-format on

  FUSELET_HOST_DEVICE int64_t target_at(int64_t r) const {
    return target64 ? static_cast<const int64_t*>(target)[r] : static_cast<const int32_t*>(target)[r];
  }
  // Ignored rows are skipped (zeros); a class id outside [0, V) that is not ignored is a
  // caller error (CPU: refused before any row runs; CUDA: NaN loss, see the header).
  FUSELET_HOST_DEVICE bool ignored(int64_t t) const { return t == ignore_index; }
  FUSELET_HOST_DEVICE bool in_range(int64_t t) const { return t >= 0 && t < vocab; }
};

fuselet_status check_cross_entropy_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                       const fuselet_cross_entropy_options* opts, fuselet_tensor* loss,
                                       fuselet_tensor* z, fuselet_tensor* lse, CrossEntropyProblem* p);
fuselet_status check_cross_entropy_bwd(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                       const fuselet_tensor* target, const fuselet_tensor* lse,
                                       const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits,
                                       CrossEntropyProblem* p);
fuselet_status check_cross_entropy_fwd_bwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                           const fuselet_cross_entropy_options* opts, float grad_scale,
                                           fuselet_tensor* loss, fuselet_tensor* z, fuselet_tensor* dlogits,
                                           CrossEntropyProblem* p);

// The log-probabilities (fuselet_logprobs_*): the same problem, label_smoothing and z_loss 0.
fuselet_status check_logprobs_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                  const fuselet_cross_entropy_options* opts, fuselet_tensor* logp, fuselet_tensor* lse,
                                  fuselet_tensor* entropy, fuselet_tensor* log_sum_sq_probs,
                                  fuselet_tensor* mean_logits, fuselet_tensor* is_top1, CrossEntropyProblem* p);
fuselet_status check_logprobs_bwd(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                  const fuselet_tensor* logits, const fuselet_tensor* target,
                                  const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                  const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits,
                                  CrossEntropyProblem* p);

}  // namespace fuselet
