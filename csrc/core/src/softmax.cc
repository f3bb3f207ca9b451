// Scaled, optionally causal softmax on the CPU: rows split across fuselet's own thread
// pool, each row read once into float32 scratch. Math and shapes: fuselet/softmax.h.
#include <cmath>

#include "cpu_common.h"
#include "cpu_math.h"
#include "parallel.h"
#include "softmax_check.h"

namespace fuselet {

namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h, cpu_math.h)

// y = softmax of rows [r0, r1) (buf: 2K floats of scratch).
template <typename T>
struct FwdRows {
  static FUSELET_INLINE void run(const SoftmaxProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t K = p->keys;
    const float scale = p->scale;
    float* e = buf + K;
    for (int64_t r = r0; r < r1; ++r) {
      T* y = static_cast<T*>(p->out) + r * p->out_stride;
      const int64_t n = p->visible(r);
      for (int64_t j = n; j < K; ++j) y[j] = from_float<T>(0.f);
      if (n == 0) continue;
      const float* x = row_as_float(static_cast<const T*>(p->x) + r * p->x_stride, buf, n);
      const float m = lane_max(n, [=](int64_t j) { return scale * x[j]; });
      for (int64_t j = 0; j < n; ++j) e[j] = exp_approx(scale * x[j] - m);
      const float inv = 1.f / lane_reduce(n, [=](int64_t j) { return e[j]; });
      for (int64_t j = 0; j < n; ++j) y[j] = from_float<T>(e[j] * inv);
    }
  }
};

// dx = scale * y * (dy - sum(dy * y)) for rows [r0, r1) (buf: 2K floats of scratch).
template <typename T>
struct BwdRows {
  static FUSELET_INLINE void run(const SoftmaxProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t K = p->keys;
    const float scale = p->scale;
    for (int64_t r = r0; r < r1; ++r) {
      const float* y = row_as_float(static_cast<const T*>(p->x) + r * p->x_stride, buf, K);
      const float* dy = row_as_float(static_cast<const T*>(p->dy) + r * p->dy_stride, buf + K, K);
      T* dx = static_cast<T*>(p->out) + r * p->out_stride;
      const float dot = lane_reduce(K, [=](int64_t j) { return dy[j] * y[j]; });
      for (int64_t j = 0; j < K; ++j) dx[j] = from_float<T>(scale * y[j] * (dy[j] - dot));
    }
  }
};

template <typename T>
void softmax_fwd(const SoftmaxProblem& p, Scratch& s) {
  parallel_rows<T>(p.rows, row_grain(p.keys), s.tasks, {{p.out, p.out_stride, p.keys}},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<FwdRows<T>>(&p, s.task(c), r0, r1); });
}

template <typename T>
void softmax_bwd(const SoftmaxProblem& p, Scratch& s) {
  parallel_rows<T>(p.rows, row_grain(p.keys), s.tasks, {{p.out, p.out_stride, p.keys}},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<BwdRows<T>>(&p, s.task(c), r0, r1); });
}

fuselet_status run(const SoftmaxProblem& p, bool backward) {
  if (p.rows == 0) return ok();
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.keys));
  return with_scratch(backward ? "y" : "x", tasks, 2, p.keys, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      if (backward)
        softmax_bwd<decltype(tag)>(p, s);
      else
        softmax_fwd<decltype(tag)>(p, s);
    });
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_softmax_fwd(const fuselet_tensor* x, float scale, uint32_t flags, fuselet_tensor* y) {
  return fuselet::guarded("fuselet_softmax_fwd", [&] {
    fuselet::SoftmaxProblem p;
    if (fuselet_status s = fuselet::check_softmax_fwd(x, scale, flags, y, &p)) return s;
    return fuselet::run(p, false);
  });
}

fuselet_status fuselet_softmax_bwd(const fuselet_tensor* dy, const fuselet_tensor* y, float scale,
                                   fuselet_tensor* dx) {
  return fuselet::guarded("fuselet_softmax_bwd", [&] {
    fuselet::SoftmaxProblem p;
    if (fuselet_status s = fuselet::check_softmax_bwd(dy, y, scale, dx, &p)) return s;
    return fuselet::run(p, true);
  });
}

#ifndef FUSELET_WITH_CUDA
fuselet_status fuselet_softmax_fwd_cuda(const fuselet_tensor*, float, uint32_t, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_softmax_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, float, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
