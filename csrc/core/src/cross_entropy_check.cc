// Argument checking shared by the CPU and CUDA cross-entropy entry points, and the
// fuselet_cross_entropy_*_check functions of the C ABI (the same checks of the inputs and options).
// The class ids' values are checked by the entry points (they read the data).
#include "cross_entropy_check.h"

#include <cinttypes>
#include <cmath>

namespace fuselet {

namespace {

fuselet_status check_options(const fuselet_cross_entropy_options* opts, CrossEntropyProblem* p) {
  if (opts == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "opts: expected the options, got NULL");
  char buf[32];
  if (!(opts->label_smoothing >= 0.f && opts->label_smoothing <= 1.f))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "label_smoothing: expected a number in [0, 1], got %s",
                float_string(opts->label_smoothing, buf, sizeof buf));
  if (!(std::isfinite(opts->z_loss) && opts->z_loss >= 0.f))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "z_loss: expected a finite number >= 0, got %s",
                float_string(opts->z_loss, buf, sizeof buf));
  if (!(opts->softcap == 0.f || (std::isfinite(opts->softcap) && opts->softcap > 0.f)))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "softcap: expected 0 (none) or a finite number > 0, got %s",
                float_string(opts->softcap, buf, sizeof buf));
  p->ignore_index = opts->ignore_index;
  p->label_smoothing = opts->label_smoothing;
  p->z_loss = opts->z_loss;
  p->softcap = opts->softcap;
  return FUSELET_OK;
}

fuselet_status check_logits(const fuselet_tensor* logits, Layout layout, CrossEntropyProblem* p, Rows* r) {
  if (fuselet_status s = as_rows(logits, "logits", r, layout, "V")) return s;
  if (r->hidden == 0) {
    char buf[160];
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "logits: the number of classes (last dimension) must be > 0, got shape %s",
                shape_string(logits, buf, sizeof buf));
  }
  p->dtype = logits->dtype;
  p->rows = r->rows;
  p->vocab = r->hidden;
  p->logits = r->data;
  p->logits_stride = r->row_stride;
  return FUSELET_OK;
}

// target: `n` int32 or int64 class ids, any shape (with Layout::kKernel contiguous, data non-null).
fuselet_status check_target(const fuselet_tensor* t, int64_t n, Layout layout, CrossEntropyProblem* p) {
  if (t == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "target: expected a tensor, got NULL");
  if (fuselet_status s = check_ndim(t, "target")) return s;
  const int code = dtype_code(t);
  if (code != FUSELET_INT32 && code != FUSELET_INT64) {
    char buf[32];
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "target: expected dtype int32 or int64 (class ids), got %s",
                dtype_string(code, buf, sizeof buf));
  }
  int64_t numel = 0;
  if (fuselet_status s = check_extent(t, "target", &numel)) return s;
  char buf[160];
  if (numel != n)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "target: expected %" PRId64 " elements (the rows of logits), got shape %s", n,
                shape_string(t, buf, sizeof(buf)));
  p->target = t->data;
  p->target64 = code == FUSELET_INT64;
  if (layout == Layout::kAny) return FUSELET_OK;
  int64_t expect = 1;
  for (int32_t d = t->ndim - 1; d >= 0 && n > 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expect)
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "target: expected a contiguous tensor");
    expect *= t->shape[d];
  }
  if (n > 0 && t->data == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "target: data pointer is NULL");
  return FUSELET_OK;
}

fuselet_status float_vector(const fuselet_tensor* t, const char* name, int64_t n, float** out,
                            Layout layout = Layout::kKernel) {
  void* data = nullptr;
  if (fuselet_status s = as_vector(t, name, FUSELET_FLOAT32, n, &data, layout)) return s;
  *out = static_cast<float*>(data);
  return FUSELET_OK;
}

fuselet_status check_dlogits(fuselet_tensor* dlogits, CrossEntropyProblem* p) {
  Rows r;
  if (dlogits != nullptr && is_float_dtype(dtype_code(dlogits)) && dlogits->dtype != p->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "dlogits: expected dtype %s (the dtype of logits), got %s",
                dtype_name(p->dtype), dtype_name(dlogits->dtype));
  if (fuselet_status s = rows_like_x(dlogits, "dlogits", p->dtype, p->rows, p->vocab, &r)) return s;
  p->dlogits = r.data;
  p->dlogits_stride = r.row_stride;
  return FUSELET_OK;
}

// loss and z (z may be NULL).
fuselet_status check_loss(fuselet_tensor* loss, fuselet_tensor* z, CrossEntropyProblem* p) {
  if (fuselet_status s = float_vector(loss, "loss", p->rows, &p->loss)) return s;
  if (z != nullptr)
    if (fuselet_status s = float_vector(z, "z", p->rows, &p->z)) return s;
  return FUSELET_OK;
}

// The inputs and options of each entry point: logits, target, the options, then the forward
// and backward's own (grad_scale: NaN for none; dloss and lse: NULL for none).
enum class Kind { kFwd, kBwd, kFwdBwd };

fuselet_status inputs(Kind kind, const fuselet_tensor* dloss, const fuselet_tensor* logits,
                      const fuselet_tensor* target, const fuselet_tensor* lse,
                      const fuselet_cross_entropy_options* opts, float grad_scale, Layout layout,
                      CrossEntropyProblem* p) {
  Rows r;
  if (fuselet_status s = check_logits(logits, layout, p, &r)) return s;
  if (fuselet_status s = check_target(target, p->rows, layout, p)) return s;
  if (fuselet_status s = check_options(opts, p)) return s;
  if (kind == Kind::kFwdBwd) {
    char buf[32];
    if (!std::isfinite(grad_scale))
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "grad_scale: expected a finite number, got %s",
                  float_string(grad_scale, buf, sizeof buf));
    p->grad_scale = grad_scale;
  }
  if (kind == Kind::kBwd) {
    float* g = nullptr;
    if (fuselet_status s = float_vector(dloss, "dloss", p->rows, &g, layout)) return s;
    p->dloss = g;
    if (fuselet_status s = float_vector(lse, "lse", p->rows, &p->lse, layout)) return s;
  }
  return FUSELET_OK;
}

// The checks of the inputs and options alone (the `_check` functions).
fuselet_status check_inputs(const char* entry, Kind kind, const fuselet_tensor* dloss, const fuselet_tensor* logits,
                            const fuselet_tensor* target, const fuselet_tensor* lse,
                            const fuselet_cross_entropy_options* opts, float grad_scale) {
  return guarded(entry, [&] {
    CrossEntropyProblem p;
    if (fuselet_status s = inputs(kind, dloss, logits, target, lse, opts, grad_scale, Layout::kAny, &p)) return s;
    return ok();
  });
}

// The log-probabilities' inputs and options: logits, target, the options (label_smoothing and
// z_loss 0), then the backward's own (dlogp, dentropy: NULL for 0; lse; entropy, needed with
// dentropy).
fuselet_status logprobs_inputs(bool bwd, const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                               const fuselet_tensor* logits, const fuselet_tensor* target, const fuselet_tensor* lse,
                               const fuselet_tensor* entropy, const fuselet_cross_entropy_options* opts, Layout layout,
                               CrossEntropyProblem* p) {
  Rows r;
  if (fuselet_status s = check_logits(logits, layout, p, &r)) return s;
  if (fuselet_status s = check_target(target, p->rows, layout, p)) return s;
  if (opts != nullptr) {
    char buf[32];
    if (opts->label_smoothing != 0.f)
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "label_smoothing: expected 0 (the log-probabilities take no label smoothing), got %s",
                  float_string(opts->label_smoothing, buf, sizeof buf));
    if (opts->z_loss != 0.f)
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "z_loss: expected 0 (the log-probabilities take no z-loss), got %s",
                  float_string(opts->z_loss, buf, sizeof buf));
  }
  if (fuselet_status s = check_options(opts, p)) return s;
  if (!bwd) return FUSELET_OK;
  float* v = nullptr;
  if (dlogp != nullptr) {
    if (fuselet_status s = float_vector(dlogp, "dlogp", p->rows, &v, layout)) return s;
    p->dloss = v;
  }
  if (dentropy != nullptr) {
    if (fuselet_status s = float_vector(dentropy, "dentropy", p->rows, &v, layout)) return s;
    p->dentropy = v;
  }
  if (fuselet_status s = float_vector(lse, "lse", p->rows, &p->lse, layout)) return s;
  if (dentropy != nullptr && entropy == nullptr)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "entropy: expected a tensor (the forward's entropy, needed with dentropy), got NULL");
  if (entropy != nullptr)
    if (fuselet_status s = float_vector(entropy, "entropy", p->rows, &p->entropy, layout)) return s;
  return FUSELET_OK;
}

fuselet_status check_logprobs_inputs(const char* entry, bool bwd, const fuselet_tensor* dlogp,
                                     const fuselet_tensor* dentropy, const fuselet_tensor* logits,
                                     const fuselet_tensor* target, const fuselet_tensor* lse,
                                     const fuselet_tensor* entropy, const fuselet_cross_entropy_options* opts) {
  return guarded(entry, [&] {
    CrossEntropyProblem p;
    if (fuselet_status s = logprobs_inputs(bwd, dlogp, dentropy, logits, target, lse, entropy, opts, Layout::kAny, &p))
      return s;
    return ok();
  });
}

}  // namespace

fuselet_status check_logprobs_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                  const fuselet_cross_entropy_options* opts, fuselet_tensor* logp, fuselet_tensor* lse,
                                  fuselet_tensor* entropy, fuselet_tensor* log_sum_sq_probs,
                                  fuselet_tensor* mean_logits, fuselet_tensor* is_top1, CrossEntropyProblem* p) {
  if (fuselet_status s =
          logprobs_inputs(false, nullptr, nullptr, logits, target, nullptr, nullptr, opts, Layout::kKernel, p))
    return s;
  if (fuselet_status s = float_vector(logp, "logp", p->rows, &p->loss)) return s;
  if (fuselet_status s = float_vector(lse, "lse", p->rows, &p->lse)) return s;
  const struct {
    fuselet_tensor* t;
    const char* name;
    float** out;
  } optional[] = {{entropy, "entropy", &p->entropy},
                  {log_sum_sq_probs, "log_sum_sq_probs", &p->log_sum_sq_probs},
                  {mean_logits, "mean_logits", &p->mean_logits},
                  {is_top1, "is_top1", &p->is_top1}};
  for (const auto& o : optional)
    if (o.t != nullptr)
      if (fuselet_status s = float_vector(o.t, o.name, p->rows, o.out)) return s;
  return ok();
}

fuselet_status check_logprobs_bwd(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                  const fuselet_tensor* logits, const fuselet_tensor* target,
                                  const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                  const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits,
                                  CrossEntropyProblem* p) {
  if (fuselet_status s =
          logprobs_inputs(true, dlogp, dentropy, logits, target, lse, entropy, opts, Layout::kKernel, p))
    return s;
  if (fuselet_status s = check_dlogits(dlogits, p)) return s;
  return ok();
}

fuselet_status check_cross_entropy_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                       const fuselet_cross_entropy_options* opts, fuselet_tensor* loss,
                                       fuselet_tensor* z, fuselet_tensor* lse, CrossEntropyProblem* p) {
  if (fuselet_status s = inputs(Kind::kFwd, nullptr, logits, target, nullptr, opts, 0.f, Layout::kKernel, p)) return s;
  if (fuselet_status s = check_loss(loss, z, p)) return s;
  if (fuselet_status s = float_vector(lse, "lse", p->rows, &p->lse)) return s;
  return ok();
}

fuselet_status check_cross_entropy_bwd(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                       const fuselet_tensor* target, const fuselet_tensor* lse,
                                       const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits,
                                       CrossEntropyProblem* p) {
  if (fuselet_status s = inputs(Kind::kBwd, dloss, logits, target, lse, opts, 0.f, Layout::kKernel, p)) return s;
  if (fuselet_status s = check_dlogits(dlogits, p)) return s;
  return ok();
}

fuselet_status check_cross_entropy_fwd_bwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                           const fuselet_cross_entropy_options* opts, float grad_scale,
                                           fuselet_tensor* loss, fuselet_tensor* z, fuselet_tensor* dlogits,
                                           CrossEntropyProblem* p) {
  if (fuselet_status s = inputs(Kind::kFwdBwd, nullptr, logits, target, nullptr, opts, grad_scale, Layout::kKernel, p))
    return s;
  if (fuselet_status s = check_loss(loss, z, p)) return s;
  if (fuselet_status s = check_dlogits(dlogits, p)) return s;
  return ok();
}

}  // namespace fuselet

extern "C" {

fuselet_status fuselet_cross_entropy_fwd_check(const fuselet_tensor* logits, const fuselet_tensor* target,
                                               const fuselet_cross_entropy_options* opts) {
  return fuselet::check_inputs("fuselet_cross_entropy_fwd_check", fuselet::Kind::kFwd, nullptr, logits, target,
                               nullptr, opts, 0.f);
}

fuselet_status fuselet_cross_entropy_bwd_check(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                               const fuselet_tensor* target, const fuselet_tensor* lse,
                                               const fuselet_cross_entropy_options* opts) {
  return fuselet::check_inputs("fuselet_cross_entropy_bwd_check", fuselet::Kind::kBwd, dloss, logits, target, lse,
                               opts, 0.f);
}

fuselet_status fuselet_cross_entropy_fwd_bwd_check(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                   const fuselet_cross_entropy_options* opts, float grad_scale) {
  return fuselet::check_inputs("fuselet_cross_entropy_fwd_bwd_check", fuselet::Kind::kFwdBwd, nullptr, logits, target,
                               nullptr, opts, grad_scale);
}

fuselet_status fuselet_logprobs_fwd_check(const fuselet_tensor* logits, const fuselet_tensor* target,
                                          const fuselet_cross_entropy_options* opts) {
  return fuselet::check_logprobs_inputs("fuselet_logprobs_fwd_check", false, nullptr, nullptr, logits, target, nullptr,
                                        nullptr, opts);
}

fuselet_status fuselet_logprobs_bwd_check(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                          const fuselet_tensor* logits, const fuselet_tensor* target,
                                          const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                          const fuselet_cross_entropy_options* opts) {
  return fuselet::check_logprobs_inputs("fuselet_logprobs_bwd_check", true, dlogp, dentropy, logits, target, lse,
                                        entropy, opts);
}

}  // extern "C"
