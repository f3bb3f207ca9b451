// SwiGLU, GeGLU and the clamped SwiGLU on the CPU: one pass over each row, rows split across fuselet's own
// thread pool. Math and shapes: fuselet/glu.h.
#include <cmath>

#include "cpu_common.h"
#include "cpu_math.h"
#include "glu_check.h"
#include "parallel.h"

namespace fuselet {

namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h, cpu_math.h)

// act(g) and act'(g) of each activation.
struct Silu {
  static FUSELET_INLINE float f(float g) { return g * sigmoid_approx(g); }
  static FUSELET_INLINE float df(float g, float* a) {
    const float s = sigmoid_approx(g);
    *a = g * s;
    return s * (1.f + g * (1.f - s));
  }
};

struct Gelu {
  static FUSELET_INLINE float f(float g) { return 0.5f * g * (1.f + erf_approx(g * 0.70710678118654752f)); }
  static FUSELET_INLINE float df(float g, float* a) {
    const float cdf = 0.5f * (1.f + erf_approx(g * 0.70710678118654752f));
    *a = g * cdf;
    return cdf + g * 0.39894228040143268f * exp_approx(-0.5f * g * g);
  }
};

// 0.5 (1 + tanh(z)) = sigmoid(2 z): no cancellation where tanh(z) is near -1.
struct GeluTanh {
  static constexpr float kK = 0.79788456080286536f, kC = 0.044715f;
  static FUSELET_INLINE float f(float g) { return g * sigmoid_approx(2.f * kK * (g + kC * g * g * g)); }
  static FUSELET_INLINE float df(float g, float* a) {
    const float s = sigmoid_approx(2.f * kK * (g + kC * g * g * g));
    *a = g * s;
    return s + 2.f * g * s * (1.f - s) * kK * (1.f + 3.f * kC * g * g);
  }
};

// The plain GLUs: y = act(g) * u.
template <typename Act>
struct Gated {
  explicit Gated(const GluProblem&) {}
  FUSELET_INLINE float fwd(float g, float u) const { return Act::f(g) * u; }
  FUSELET_INLINE void bwd(float g, float u, float dy, float* dg, float* du) const {
    float a;
    const float da = Act::df(g, &a);
    *dg = dy * u * da;
    *du = dy * a;
  }
};

// GPT-OSS's clamped SwiGLU. The comparisons keep a NaN (torch.clamp's rule) and pass the
// gradient at the bounds, where torch.clamp passes it.
struct SiluClamped {
  float alpha, limit;
  explicit SiluClamped(const GluProblem& p) : alpha(p.alpha), limit(p.limit) {}
  FUSELET_INLINE float gate(float g) const { return g > limit ? limit : g; }
  FUSELET_INLINE float up(float u) const { return u > limit ? limit : (u < -limit ? -limit : u); }
  FUSELET_INLINE float fwd(float g, float u) const {
    const float gc = gate(g);
    return gc * sigmoid_approx(alpha * gc) * (up(u) + 1.f);
  }
  FUSELET_INLINE void bwd(float g, float u, float dy, float* dg, float* du) const {
    const float gc = gate(g), s = sigmoid_approx(alpha * gc);
    *dg = g <= limit ? dy * (up(u) + 1.f) * s * (1.f + alpha * gc * (1.f - s)) : 0.f;
    *du = (u >= -limit && u <= limit) ? dy * gc * s : 0.f;
  }
};

// Where g_i and u_i sit in a row of x (and dx): halves, or interleaved pairs.
template <bool Interleaved>
struct Layout {
  static FUSELET_INLINE int64_t g(int64_t i, int64_t) { return Interleaved ? 2 * i : i; }
  static FUSELET_INLINE int64_t u(int64_t i, int64_t F) { return Interleaved ? 2 * i + 1 : F + i; }
};

// y = fwd(g, u) for rows [r0, r1) (buf: 2F floats of scratch).
template <typename T, typename Math, typename L>
struct FwdRows {
  static FUSELET_INLINE void run(const GluProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t F = p->half;
    const Math math(*p);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p->x) + r * p->x_stride, buf, 2 * F);
      T* y = static_cast<T*>(p->y) + r * p->y_stride;
      for (int64_t i = 0; i < F; ++i) y[i] = from_float<T>(math.fwd(x[L::g(i, F)], x[L::u(i, F)]));
    }
  }
};

// dx = (dg, du) laid out like x, for rows [r0, r1) (buf: 3F floats of scratch).
template <typename T, typename Math, typename L>
struct BwdRows {
  static FUSELET_INLINE void run(const GluProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t F = p->half;
    const Math math(*p);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p->x) + r * p->x_stride, buf, 2 * F);
      const float* dy = row_as_float(static_cast<const T*>(p->dy) + r * p->dy_stride, buf + 2 * F, F);
      T* dx = static_cast<T*>(p->dx) + r * p->dx_stride;
      for (int64_t i = 0; i < F; ++i) {
        float dg, du;
        math.bwd(x[L::g(i, F)], x[L::u(i, F)], dy[i], &dg, &du);
        dx[L::g(i, F)] = from_float<T>(dg);
        dx[L::u(i, F)] = from_float<T>(du);
      }
    }
  }
};

template <typename T, typename Math, typename L>
void glu_fwd(const GluProblem& p, Scratch& s) {
  parallel_rows<T>(p.rows, row_grain(2 * p.half), s.tasks, {{p.y, p.y_stride, p.half}},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<FwdRows<T, Math, L>>(&p, s.task(c), r0, r1); });
}

template <typename T, typename Math, typename L>
void glu_bwd(const GluProblem& p, Scratch& s) {
  parallel_rows<T>(p.rows, row_grain(3 * p.half), s.tasks, {{p.dx, p.dx_stride, 2 * p.half}},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<BwdRows<T, Math, L>>(&p, s.task(c), r0, r1); });
}

template <typename Math, typename L>
fuselet_status run(const GluProblem& p, bool backward) {
  const int64_t tasks = parallel_chunks(p.rows, row_grain((backward ? 3 : 2) * p.half));
  return with_scratch("x", tasks, 3, p.half, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      if (backward)
        glu_bwd<decltype(tag), Math, L>(p, s);
      else
        glu_fwd<decltype(tag), Math, L>(p, s);
    });
  });
}

template <typename Math>
fuselet_status run(const GluProblem& p, bool backward) {
  return p.interleaved ? run<Math, Layout<true>>(p, backward) : run<Math, Layout<false>>(p, backward);
}

fuselet_status run(const GluProblem& p, bool backward) {
  if (p.rows == 0) return ok();
  switch (p.activation) {
    case FUSELET_GLU_GELU: return run<Gated<Gelu>>(p, backward);
    case FUSELET_GLU_GELU_TANH: return run<Gated<GeluTanh>>(p, backward);
    case FUSELET_GLU_SILU_CLAMPED: return run<SiluClamped>(p, backward);
    default: return run<Gated<Silu>>(p, backward);
  }
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_glu_fwd_ex(const fuselet_tensor* x, const fuselet_glu_options* opts, fuselet_tensor* y) {
  return fuselet::guarded("fuselet_glu_fwd_ex", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_fwd(x, opts, true, y, &p)) return s;
    return fuselet::run(p, false);
  });
}

fuselet_status fuselet_glu_bwd_ex(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_glu_options* opts,
                                  fuselet_tensor* dx) {
  return fuselet::guarded("fuselet_glu_bwd_ex", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_bwd(dy, x, opts, true, dx, &p)) return s;
    return fuselet::run(p, true);
  });
}

fuselet_status fuselet_glu_fwd(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y) {
  return fuselet::guarded("fuselet_glu_fwd", [&] {
    fuselet::GluProblem p;
    const fuselet_glu_options opts = fuselet::glu_options(activation);
    if (fuselet_status s = fuselet::check_glu_fwd(x, &opts, false, y, &p)) return s;
    return fuselet::run(p, false);
  });
}

fuselet_status fuselet_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation,
                               fuselet_tensor* dx) {
  return fuselet::guarded("fuselet_glu_bwd", [&] {
    fuselet::GluProblem p;
    const fuselet_glu_options opts = fuselet::glu_options(activation);
    if (fuselet_status s = fuselet::check_glu_bwd(dy, x, &opts, false, dx, &p)) return s;
    return fuselet::run(p, true);
  });
}

#ifndef FUSELET_WITH_CUDA
fuselet_status fuselet_glu_fwd_cuda(const fuselet_tensor*, int32_t, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_glu_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, int32_t, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_glu_fwd_ex_cuda(const fuselet_tensor*, const fuselet_glu_options*, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_glu_bwd_ex_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_glu_options*,
                                       fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
