// Per-row divergences on the CPU: rows split across fuselet's own thread pool, input and target
// rows read in float32, the forward a lane reduction of the element terms, the backward one pass
// writing each element's gradients. Math and shapes: fuselet/divergence.h.
#include <cmath>

#include "cpu_common.h"
#include "cpu_math.h"
#include "divergence_check.h"
#include "parallel.h"

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
  if (opts->kind == FUSELET_DIVERGENCE_JSD ? !(opts->beta >= 0.f && opts->beta <= 1.f) : opts->beta != 0.f)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                opts->kind == FUSELET_DIVERGENCE_JSD ? "beta: expected a number in [0, 1], got %g"
                                                     : "beta: expected 0 (beta is JSD's), got %g",
                static_cast<double>(opts->beta));
  p->kind = opts->kind;
  p->log_target = opts->log_target == 1;
  p->beta = opts->beta;
  return FUSELET_OK;
}

// input and target: rows of the same shape and dtype.
fuselet_status check_pair(const fuselet_tensor* input, const fuselet_tensor* target, DivergenceProblem* p) {
  Rows ri, rt;
  if (fuselet_status s = as_rows(input, "input", &ri)) return s;
  if (ri.hidden == 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "input: the last dimension (classes) must be > 0, got 0");
  if (target != nullptr && is_float_dtype(dtype_code(target)) && target->dtype != input->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "target: expected dtype %s (the dtype of input), got %s",
                dtype_name(input->dtype), dtype_name(target->dtype));
  if (fuselet_status s = rows_like_x(target, "target", input->dtype, ri.rows, ri.hidden, &rt)) return s;
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

}  // namespace

fuselet_status check_divergence_fwd(const fuselet_tensor* input, const fuselet_tensor* target,
                                    const fuselet_divergence_options* opts, fuselet_tensor* loss,
                                    DivergenceProblem* p) {
  if (fuselet_status s = check_pair(input, target, p)) return s;
  if (fuselet_status s = check_options(opts, p)) return s;
  void* data = nullptr;
  if (fuselet_status s = as_vector(loss, "loss", FUSELET_FLOAT32, p->rows, &data)) return s;
  p->loss = static_cast<float*>(data);
  return ok();
}

fuselet_status check_divergence_bwd(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                    const fuselet_tensor* target, const fuselet_divergence_options* opts,
                                    fuselet_tensor* dinput, fuselet_tensor* dtarget, DivergenceProblem* p) {
  if (fuselet_status s = check_pair(input, target, p)) return s;
  if (fuselet_status s = check_options(opts, p)) return s;
  void* data = nullptr;
  if (fuselet_status s = as_vector(dloss, "dloss", FUSELET_FLOAT32, p->rows, &data)) return s;
  p->dloss = static_cast<const float*>(data);
  if (dinput == nullptr && dtarget == nullptr)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "dinput, dtarget: expected at least one output, got NULL for both");
  if (dinput != nullptr)
    if (fuselet_status s = check_grad(dinput, "dinput", "input", p, &p->dinput, &p->dinput_stride)) return s;
  if (dtarget != nullptr)
    if (fuselet_status s = check_grad(dtarget, "dtarget", "target", p, &p->dtarget, &p->dtarget_stride)) return s;
  return ok();
}

namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h, cpu_math.h)

// The kind's lambda, inlined into each ISA copy like the rest of the row kernel (cpu_isa.h).
#define FUSELET_INLINE_LAMBDA __attribute__((always_inline))

struct ExpApprox {
  FUSELET_INLINE float operator()(float v) const { return exp_approx(v); }
};
struct LogApprox {
  FUSELET_INLINE float operator()(float v) const { return log_approx(v); }
};

// loss of rows [r0, r1) (buf: 3V floats of scratch: the rows in float32, then the terms).
template <typename T>
struct FwdRows {
  static FUSELET_INLINE void run(const DivergenceProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t V = p->vocab;
    float* terms = buf + 2 * V;
    with_divergence_math<ExpApprox, LogApprox>(*p, [&](auto math) FUSELET_INLINE_LAMBDA {
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = row_as_float(static_cast<const T*>(p->input) + r * p->input_stride, buf, V);
        const float* t = row_as_float(static_cast<const T*>(p->target) + r * p->target_stride, buf + V, V);
        for (int64_t j = 0; j < V; ++j) terms[j] = math.term(x[j], t[j]);
        p->loss[r] = lane_reduce(V, [=](int64_t j) { return terms[j]; });
      }
    });
  }
};

// dinput and / or dtarget of rows [r0, r1) (buf: 2V floats of scratch). The bindings allocate
// both outputs: neither aliases input or target.
template <typename T>
struct BwdRows {
  static FUSELET_INLINE void run(const DivergenceProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t V = p->vocab;
    with_divergence_math<ExpApprox, LogApprox>(*p, [&](auto math) FUSELET_INLINE_LAMBDA {
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = row_as_float(static_cast<const T*>(p->input) + r * p->input_stride, buf, V);
        const float* t = row_as_float(static_cast<const T*>(p->target) + r * p->target_stride, buf + V, V);
        const float g = p->dloss[r];
        T* dx = p->dinput ? static_cast<T*>(p->dinput) + r * p->dinput_stride : nullptr;
        T* dt = p->dtarget ? static_cast<T*>(p->dtarget) + r * p->dtarget_stride : nullptr;
        if (dx)
          for (int64_t j = 0; j < V; ++j) dx[j] = from_float<T>(g * math.grad(x[j], t[j]).dx);
        if (dt)
          for (int64_t j = 0; j < V; ++j) dt[j] = from_float<T>(g * math.grad(x[j], t[j]).dt);
      }
    });
  }
};

fuselet_status run(const DivergenceProblem& p, bool backward) {
  if (p.rows == 0) return ok();
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.vocab));
  return with_scratch("input", tasks, backward ? 2 : 3, p.vocab, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (backward)
        parallel_rows<T>(p.rows, row_grain(p.vocab), s.tasks,
                         {{p.dinput, p.dinput_stride, p.vocab}, {p.dtarget, p.dtarget_stride, p.vocab}},
                         [&](int64_t c, int64_t r0, int64_t r1) { run_best<BwdRows<T>>(&p, s.task(c), r0, r1); });
      else
        parallel_rows<T>(p.rows, row_grain(p.vocab), s.tasks, {{nullptr, 0, p.vocab}},
                         [&](int64_t c, int64_t r0, int64_t r1) { run_best<FwdRows<T>>(&p, s.task(c), r0, r1); });
    });
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_divergence_fwd(const fuselet_tensor* input, const fuselet_tensor* target,
                                      const fuselet_divergence_options* opts, fuselet_tensor* loss) {
  return fuselet::guarded("fuselet_divergence_fwd", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::check_divergence_fwd(input, target, opts, loss, &p)) return s;
    return fuselet::run(p, false);
  });
}

fuselet_status fuselet_divergence_bwd(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                      const fuselet_tensor* target, const fuselet_divergence_options* opts,
                                      fuselet_tensor* dinput, fuselet_tensor* dtarget) {
  return fuselet::guarded("fuselet_divergence_bwd", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::check_divergence_bwd(dloss, input, target, opts, dinput, dtarget, &p)) return s;
    return fuselet::run(p, true);
  });
}

#ifndef FUSELET_WITH_CUDA
fuselet_status fuselet_divergence_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*,
                                           const fuselet_divergence_options*, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_divergence_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                           const fuselet_divergence_options*, fuselet_tensor*, fuselet_tensor*,
                                           void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
