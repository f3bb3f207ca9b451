// SwiGLU and GeGLU on the CPU: one pass over each row, rows split across fuselet's own
// thread pool. Math and shapes: fuselet/glu.h.
#include <cinttypes>
#include <cmath>

#include "cpu_common.h"
#include "cpu_math.h"
#include "glu_check.h"
#include "parallel.h"

namespace fuselet {

namespace {

fuselet_status check_x(const fuselet_tensor* x, int32_t activation, Rows* rx, GluProblem* p) {
  if (fuselet_status s = as_rows(x, "x", rx)) return s;
  if (rx->hidden == 0 || rx->hidden % 2 != 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "x: expected an even last dimension > 0 (2F: the gate and up halves), got %" PRId64, rx->hidden);
  if (activation < FUSELET_GLU_SILU || activation > FUSELET_GLU_GELU_TANH)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "activation: expected FUSELET_GLU_SILU, FUSELET_GLU_GELU or FUSELET_GLU_GELU_TANH, got %d",
                static_cast<int>(activation));
  p->dtype = x->dtype;
  p->activation = activation;
  p->rows = rx->rows;
  p->half = rx->hidden / 2;
  p->x = rx->data;
  p->x_stride = rx->row_stride;
  return FUSELET_OK;
}

}  // namespace

fuselet_status check_glu_fwd(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y, GluProblem* p) {
  Rows rx, ry;
  if (fuselet_status s = check_x(x, activation, &rx, p)) return s;
  if (fuselet_status s = rows_like_x(y, "y", x->dtype, rx.rows, p->half, &ry)) return s;
  p->y = ry.data;
  p->y_stride = ry.row_stride;
  return ok();
}

fuselet_status check_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation, fuselet_tensor* dx,
                             GluProblem* p) {
  Rows rx, rdy, rdx;
  if (fuselet_status s = check_x(x, activation, &rx, p)) return s;
  if (fuselet_status s = rows_like_x(dy, "dy", x->dtype, rx.rows, p->half, &rdy)) return s;
  if (fuselet_status s = rows_like_x(dx, "dx", x->dtype, rx.rows, rx.hidden, &rdx)) return s;
  p->dy = rdy.data;
  p->dy_stride = rdy.row_stride;
  p->dx = rdx.data;
  p->dx_stride = rdx.row_stride;
  return ok();
}

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

// y = act(g) * u for rows [r0, r1) (buf: 2F floats of scratch).
template <typename T, typename Act>
struct FwdRows {
  static FUSELET_INLINE void run(const GluProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t F = p->half;
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p->x) + r * p->x_stride, buf, 2 * F);
      T* y = static_cast<T*>(p->y) + r * p->y_stride;
      for (int64_t i = 0; i < F; ++i) y[i] = from_float<T>(Act::f(x[i]) * x[F + i]);
    }
  }
};

// dx = [dy * u * act'(g), dy * act(g)] for rows [r0, r1) (buf: 3F floats of scratch).
template <typename T, typename Act>
struct BwdRows {
  static FUSELET_INLINE void run(const GluProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t F = p->half;
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p->x) + r * p->x_stride, buf, 2 * F);
      const float* dy = row_as_float(static_cast<const T*>(p->dy) + r * p->dy_stride, buf + 2 * F, F);
      T* dx = static_cast<T*>(p->dx) + r * p->dx_stride;
      for (int64_t i = 0; i < F; ++i) {
        float a;
        const float da = Act::df(x[i], &a);
        dx[i] = from_float<T>(dy[i] * x[F + i] * da);
        dx[F + i] = from_float<T>(dy[i] * a);
      }
    }
  }
};

template <typename T, typename Act>
void glu_fwd(const GluProblem& p, Scratch& s) {
  parallel_rows<T>(p.rows, row_grain(2 * p.half), s.tasks, {{p.y, p.y_stride, p.half}},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<FwdRows<T, Act>>(&p, s.task(c), r0, r1); });
}

template <typename T, typename Act>
void glu_bwd(const GluProblem& p, Scratch& s) {
  parallel_rows<T>(p.rows, row_grain(3 * p.half), s.tasks, {{p.dx, p.dx_stride, 2 * p.half}},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<BwdRows<T, Act>>(&p, s.task(c), r0, r1); });
}

template <typename Act>
fuselet_status run(const GluProblem& p, bool backward) {
  const int64_t tasks = parallel_chunks(p.rows, row_grain((backward ? 3 : 2) * p.half));
  return with_scratch("x", tasks, 3, p.half, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      if (backward)
        glu_bwd<decltype(tag), Act>(p, s);
      else
        glu_fwd<decltype(tag), Act>(p, s);
    });
  });
}

fuselet_status run(const GluProblem& p, bool backward) {
  if (p.rows == 0) return ok();
  switch (p.activation) {
    case FUSELET_GLU_GELU: return run<Gelu>(p, backward);
    case FUSELET_GLU_GELU_TANH: return run<GeluTanh>(p, backward);
    default: return run<Silu>(p, backward);
  }
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_glu_fwd(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y) {
  return fuselet::guarded("fuselet_glu_fwd", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_fwd(x, activation, y, &p)) return s;
    return fuselet::run(p, false);
  });
}

fuselet_status fuselet_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation,
                               fuselet_tensor* dx) {
  return fuselet::guarded("fuselet_glu_bwd", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_bwd(dy, x, activation, dx, &p)) return s;
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
#endif

}  // extern "C"
