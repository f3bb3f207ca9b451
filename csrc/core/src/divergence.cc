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
