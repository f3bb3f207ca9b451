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
        ahead(
            V,
            [&](int64_t j0, int64_t j1) FUSELET_INLINE_LAMBDA {
              for (int64_t j = j0; j < j1; ++j) terms[j] = math.term(x[j], t[j]);
            },
            x, t);
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
          ahead(
              V,
              [&](int64_t j0, int64_t j1) FUSELET_INLINE_LAMBDA {
                for (int64_t j = j0; j < j1; ++j) dx[j] = from_float<T>(g * math.grad(x[j], t[j]).dx);
              },
              x, t);
        if (dt)
          ahead(
              V,
              [&](int64_t j0, int64_t j1) FUSELET_INLINE_LAMBDA {
                for (int64_t j = j0; j < j1; ++j) dt[j] = from_float<T>(g * math.grad(x[j], t[j]).dt);
              },
              x, t);
      }
    });
  }
};

// Over logits, rows [r0, r1) (buf: 2V floats of scratch): the scaled rows of input and target in
// float32, their log-sum-exps, then per element x, t, q, p, the term and dx (the buffers then hold
// q and dx), the row's loss and sum of dx, and last the gradient through log_softmax over input.
template <typename T>
struct LogitsRows {
  static FUSELET_INLINE void run(const DivergenceProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t V = p->vocab;
    const float scale = p->scale;
    float* a = buf;
    float* b = buf + V;
    with_divergence_math<ExpApprox, LogApprox>(*p, [&](auto math) FUSELET_INLINE_LAMBDA {
      for (int64_t r = r0; r < r1; ++r) {
        T* x = static_cast<T*>(p->dinput) + r * p->dinput_stride;
        const T* t = static_cast<const T*>(p->target) + r * p->target_stride;
        ahead(
            V,
            [&](int64_t j0, int64_t j1) FUSELET_INLINE_LAMBDA {
              for (int64_t j = j0; j < j1; ++j) a[j] = scale * to_float(x[j]);
            },
            x);
        ahead(
            V,
            [&](int64_t j0, int64_t j1) FUSELET_INLINE_LAMBDA {
              for (int64_t j = j0; j < j1; ++j) b[j] = scale * to_float(t[j]);
            },
            t);
        const float mx = lane_max(V, [=](int64_t j) { return a[j]; });
        const float mt = lane_max(V, [=](int64_t j) { return b[j]; });
        const float lx = mx + std::log(lane_reduce(V, [=](int64_t j) { return exp_approx(a[j] - mx); }));
        const float lt = mt + std::log(lane_reduce(V, [=](int64_t j) { return exp_approx(b[j] - mt); }));
        float loss[kLanes] = {}, sum[kLanes] = {};
        auto element = [&](int64_t j, int l) FUSELET_INLINE_LAMBDA {
          const float xj = a[j] - lx, tj = b[j] - lt;
          const float q = exp_approx(xj);
          const DivergenceTermDx e = math.term_dx(xj, q, tj, exp_approx(tj));
          loss[l] += e.term;
          sum[l] += e.dx;
          a[j] = q;
          b[j] = e.dx;
        };
        int64_t j = 0;
        for (; j + kLanes <= V; j += kLanes)
          for (int l = 0; l < kLanes; ++l) element(j + l, l);
        for (int l = 0; j < V; ++j, ++l) element(j, l);
        float row_loss = 0.f, s = 0.f;
        for (int l = 0; l < kLanes; ++l) {
          row_loss += loss[l];
          s += sum[l];
        }
        p->loss[r] = row_loss;
        const float c = p->dloss[r] * scale;
        for (int64_t k = 0; k < V; ++k) x[k] = from_float<T>(c * (b[k] - a[k] * s));
      }
    });
  }
};

fuselet_status run_logits(const DivergenceProblem& p) {
  if (p.rows == 0) return ok();
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.vocab));
  return with_scratch("input", tasks, 2, p.vocab, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      parallel_rows<T>(p.rows, row_grain(p.vocab), s.tasks, {{nullptr, 0, p.vocab}},
                       [&](int64_t c, int64_t r0, int64_t r1) { run_best<LogitsRows<T>>(&p, s.task(c), r0, r1); });
    });
  });
}

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

fuselet_status fuselet_divergence_logits(fuselet_tensor* input, const fuselet_tensor* target,
                                         const fuselet_tensor* dloss, const fuselet_divergence_options* opts,
                                         float scale, fuselet_tensor* loss) {
  return fuselet::guarded("fuselet_divergence_logits", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::check_divergence_logits(input, target, dloss, opts, scale, loss, &p)) return s;
    return fuselet::run_logits(p);
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
fuselet_status fuselet_divergence_logits_cuda(fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                              const fuselet_divergence_options*, float, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
