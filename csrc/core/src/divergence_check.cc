// Argument checking shared by the CPU and CUDA divergence entry points, and the
// fuselet_divergence_*_check functions of the C ABI (the same checks of the inputs and options).
#include "divergence_check.h"

namespace fuselet {

namespace {

fuselet_status check_options(const fuselet_divergence_options* opts, DivergenceProblem* p) {
  if (opts == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "opts: expected the options, got NULL");
  if (opts->kind != FUSELET_DIVERGENCE_KL && opts->kind != FUSELET_DIVERGENCE_JSD &&
      opts->kind != FUSELET_DIVERGENCE_TVD)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "kind: expected FUSELET_DIVERGENCE_KL (0), FUSELET_DIVERGENCE_JSD (1) or FUSELET_DIVERGENCE_TVD (2), "
                "got %d",
                static_cast<int>(opts->kind));
  if (opts->log_target != 0 && opts->log_target != 1)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "log_target: expected 0 or 1, got %d",
                static_cast<int>(opts->log_target));
  if (opts->kind != FUSELET_DIVERGENCE_KL && opts->log_target != 1)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "log_target: expected 1 (target as log-probabilities) for JSD and TVD, got %d",
                static_cast<int>(opts->log_target));
  char buf[32];
  if (opts->kind == FUSELET_DIVERGENCE_JSD ? !(opts->beta >= 0.f && opts->beta <= 1.f) : opts->beta != 0.f)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                opts->kind == FUSELET_DIVERGENCE_JSD ? "beta: expected a number in [0, 1], got %s"
                                                     : "beta: expected 0 (beta is JSD's), got %s",
                float_string(opts->beta, buf, sizeof buf));
  p->kind = opts->kind;
  p->log_target = opts->log_target == 1;
  p->beta = opts->beta;
  return FUSELET_OK;
}

// input and target: rows of the same shape and dtype.
fuselet_status check_pair(const fuselet_tensor* input, const fuselet_tensor* target, Layout layout,
                          DivergenceProblem* p) {
  Rows ri, rt;
  if (fuselet_status s = as_rows(input, "input", &ri, layout, "V")) return s;
  if (ri.hidden == 0) {
    char buf[160];
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "input: the number of classes (last dimension) must be > 0, got shape %s",
                shape_string(input, buf, sizeof buf));
  }
  if (target != nullptr && is_float_dtype(dtype_code(target)) && target->dtype != input->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "target: expected dtype %s (the dtype of input), got %s",
                dtype_name(input->dtype), dtype_name(target->dtype));
  if (fuselet_status s = rows_like_x(target, "target", input->dtype, ri.rows, ri.hidden, &rt, layout)) return s;
  p->dtype = input->dtype;
  p->rows = ri.rows;
  p->vocab = ri.hidden;
  p->input = ri.data;
  p->input_stride = ri.row_stride;
  p->target = rt.data;
  p->target_stride = rt.row_stride;
  return FUSELET_OK;
}

// An output gradient like input (dinput) or target (dtarget).
fuselet_status check_grad(fuselet_tensor* t, const char* name, const char* like, DivergenceProblem* p, void** data,
                          int64_t* stride) {
  Rows r;
  if (t != nullptr && is_float_dtype(dtype_code(t)) && t->dtype != p->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of %s), got %s", name,
                dtype_name(p->dtype), like, dtype_name(t->dtype));
  if (fuselet_status s = rows_like_x(t, name, p->dtype, p->rows, p->vocab, &r)) return s;
  *data = r.data;
  *stride = r.row_stride;
  return FUSELET_OK;
}

// The inputs and options of a forward, or with dloss (not NULL) of a backward.
fuselet_status inputs(const fuselet_tensor* dloss, bool backward, const fuselet_tensor* input,
                      const fuselet_tensor* target, const fuselet_divergence_options* opts, Layout layout,
                      DivergenceProblem* p) {
  if (fuselet_status s = check_pair(input, target, layout, p)) return s;
  if (fuselet_status s = check_options(opts, p)) return s;
  if (!backward) return FUSELET_OK;
  void* data = nullptr;
  if (fuselet_status s = as_vector(dloss, "dloss", FUSELET_FLOAT32, p->rows, &data, layout)) return s;
  p->dloss = static_cast<const float*>(data);
  return FUSELET_OK;
}

// The inputs and options over logits: those of a backward, log_target 1 and scale.
fuselet_status logits_inputs(const fuselet_tensor* input, const fuselet_tensor* target, const fuselet_tensor* dloss,
                             const fuselet_divergence_options* opts, float scale, Layout layout,
                             DivergenceProblem* p) {
  if (fuselet_status s = inputs(dloss, true, input, target, opts, layout, p)) return s;
  if (!p->log_target)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "log_target: expected 1 (the log_softmax of target's logits are log-probabilities), got 0");
  char buf[32];
  if (!(scale > 0.f && scale <= 3.40282347e38f))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "scale: expected a finite number > 0, got %s",
                float_string(scale, buf, sizeof buf));
  p->scale = scale;
  return FUSELET_OK;
}

// The checks of the inputs and options alone (the `_check` functions).
fuselet_status check_inputs(const char* entry, const fuselet_tensor* dloss, bool backward, const fuselet_tensor* input,
                            const fuselet_tensor* target, const fuselet_divergence_options* opts) {
  return guarded(entry, [&] {
    DivergenceProblem p;
    if (fuselet_status s = inputs(dloss, backward, input, target, opts, Layout::kAny, &p)) return s;
    return ok();
  });
}

}  // namespace

fuselet_status check_divergence_fwd(const fuselet_tensor* input, const fuselet_tensor* target,
                                    const fuselet_divergence_options* opts, fuselet_tensor* loss,
                                    DivergenceProblem* p) {
  if (fuselet_status s = inputs(nullptr, false, input, target, opts, Layout::kKernel, p)) return s;
  void* data = nullptr;
  if (fuselet_status s = as_vector(loss, "loss", FUSELET_FLOAT32, p->rows, &data)) return s;
  p->loss = static_cast<float*>(data);
  return ok();
}

fuselet_status check_divergence_bwd(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                    const fuselet_tensor* target, const fuselet_divergence_options* opts,
                                    fuselet_tensor* dinput, fuselet_tensor* dtarget, DivergenceProblem* p) {
  if (fuselet_status s = inputs(dloss, true, input, target, opts, Layout::kKernel, p)) return s;
  if (dinput == nullptr && dtarget == nullptr)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "dinput, dtarget: expected at least one output, got NULL for both");
  if (dinput != nullptr)
    if (fuselet_status s = check_grad(dinput, "dinput", "input", p, &p->dinput, &p->dinput_stride)) return s;
  if (dtarget != nullptr)
    if (fuselet_status s = check_grad(dtarget, "dtarget", "target", p, &p->dtarget, &p->dtarget_stride)) return s;
  return ok();
}

fuselet_status check_divergence_logits(fuselet_tensor* input, const fuselet_tensor* target,
                                       const fuselet_tensor* dloss, const fuselet_divergence_options* opts,
                                       float scale, fuselet_tensor* loss, DivergenceProblem* p) {
  if (fuselet_status s = logits_inputs(input, target, dloss, opts, scale, Layout::kKernel, p)) return s;
  void* data = nullptr;
  if (fuselet_status s = as_vector(loss, "loss", FUSELET_FLOAT32, p->rows, &data)) return s;
  p->loss = static_cast<float*>(data);
  p->dinput = const_cast<void*>(p->input);  // in place: the rows of input, their stride checked above
  p->dinput_stride = p->input_stride;
  return ok();
}

}  // namespace fuselet

extern "C" {

fuselet_status fuselet_divergence_fwd_check(const fuselet_tensor* input, const fuselet_tensor* target,
                                            const fuselet_divergence_options* opts) {
  return fuselet::check_inputs("fuselet_divergence_fwd_check", nullptr, false, input, target, opts);
}

fuselet_status fuselet_divergence_bwd_check(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                            const fuselet_tensor* target, const fuselet_divergence_options* opts) {
  return fuselet::check_inputs("fuselet_divergence_bwd_check", dloss, true, input, target, opts);
}

fuselet_status fuselet_divergence_logits_check(const fuselet_tensor* input, const fuselet_tensor* target,
                                               const fuselet_tensor* dloss, const fuselet_divergence_options* opts,
                                               float scale) {
  return fuselet::guarded("fuselet_divergence_logits_check", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::logits_inputs(input, target, dloss, opts, scale, fuselet::Layout::kAny, &p))
      return s;
    return fuselet::ok();
  });
}

}  // extern "C"
