// RMSNorm and LayerNorm on the CPU: one pass over each row for the statistics, one for
// the output; rows split across fuselet's own thread pool. Math and shapes: fuselet/norm.h.
#include <algorithm>
#include <cmath>
#include <new>
#include <type_traits>
#include <vector>

#include "dtype.h"
#include "norm_check.h"
#include "parallel.h"

namespace fuselet {
namespace {

// Lanes of independent float accumulators in every row reduction (see lane_reduce).
constexpr int kLanes = 16;

// Rows per task: enough elements that a task outweighs the cost of waking a worker.
int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)); }

template <typename T>
const float* row_as_float(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buf;
    (void)n;
    return src;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = to_float(src[i]);
    return buf;
  }
}

// sum(term(i)) for i in [0, n), one accumulator per lane so that GCC vectorizes it without
// -ffast-math (the order of additions is fixed, so results are deterministic).
template <typename Term>
inline float lane_reduce(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (int l = 0; i < n; ++i, ++l) acc[l] += term(i);
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

float sum_squares(const float* x, int64_t n) {
  return lane_reduce(n, [=](int64_t i) { return x[i] * x[i]; });
}

float sum(const float* x, int64_t n) {
  return lane_reduce(n, [=](int64_t i) { return x[i]; });
}

float sum_squared_deviations(const float* x, int64_t n, float c) {
  return lane_reduce(n, [=](int64_t i) { return (x[i] - c) * (x[i] - c); });
}

// sum(a * b * (x - c)).
float sum_products(const float* a, const float* b, const float* x, int64_t n, float c) {
  return lane_reduce(n, [=](int64_t i) { return a[i] * b[i] * (x[i] - c); });
}

// sum(a * b).
float sum_products(const float* a, const float* b, int64_t n) {
  return lane_reduce(n, [=](int64_t i) { return a[i] * b[i]; });
}

// Mean and biased variance with two passes over the (cache-resident) row: exact, and each
// pass one accumulator per lane, which GCC vectorizes (a fused one-pass loop with two
// accumulators did not: 4x slower, measured).
void mean_var(const float* x, int64_t n, float* mean, float* var) {
  const float m = sum(x, n) / static_cast<float>(n);
  *mean = m;
  *var = sum_squared_deviations(x, n, m) / static_cast<float>(n);
}

// out[i] = float(param[i]) + offset, or `fill` when there is no parameter (NULL).
void load_param(const void* param, fuselet_dtype dtype, int64_t n, float offset, float fill, float* out) {
  if (param == nullptr) {
    std::fill(out, out + n, fill);
    return;
  }
  const auto load = [&](const auto* src) {
    for (int64_t i = 0; i < n; ++i) out[i] = to_float(src[i]) + offset;
  };
  switch (dtype) {
    case FUSELET_FLOAT32: load(static_cast<const float*>(param)); break;
    case FUSELET_FLOAT16: load(static_cast<const half_t*>(param)); break;
    case FUSELET_BFLOAT16: load(static_cast<const bfloat16_t*>(param)); break;
  }
}

// dst[i0..i1) = src[i0..i1) rounded to `dtype`.
void store_param(const float* src, fuselet_dtype dtype, int64_t i0, int64_t i1, void* dst) {
  const auto store = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    for (int64_t i = i0; i < i1; ++i) out[i] = from_float<T>(src[i]);
  };
  switch (dtype) {
    case FUSELET_FLOAT32: store(static_cast<float*>(dst)); break;
    case FUSELET_FLOAT16: store(static_cast<half_t*>(dst)); break;
    case FUSELET_BFLOAT16: store(static_cast<bfloat16_t*>(dst)); break;
  }
}

// Per-task scratch: floats for converted rows and partial sums, allocated by the caller
// before any worker starts (no allocation, hence no exception, inside a task).
struct Scratch {
  std::vector<float> buf;
  int64_t per_task = 0;
  float* task(int64_t c) { return buf.data() + c * per_task; }
};

template <typename T>
void norm_fwd(const NormProblem& p, Scratch& s) {
  const int64_t H = p.hidden;
  const bool layer = p.mean != nullptr;
  parallel_for(p.rows, row_grain(H), [&](int64_t c, int64_t r0, int64_t r1) {
    float* xbuf = s.task(c);
    float* w = xbuf + H;
    float* b = w + H;
    load_param(p.weight, p.param_dtype, H, p.w_offset, 1.f, w);
    if (layer) load_param(p.bias, p.param_dtype, H, 0.f, 0.f, b);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p.x) + r * p.x_stride, xbuf, H);
      T* y = static_cast<T*>(p.y) + r * p.y_stride;
      if (layer) {
        float mean, var;
        mean_var(x, H, &mean, &var);
        const float rstd = 1.f / std::sqrt(var + p.eps);
        for (int64_t i = 0; i < H; ++i) y[i] = from_float<T>((x[i] - mean) * rstd * w[i] + b[i]);
        p.mean[r] = mean;
        p.rstd[r] = rstd;
      } else {
        const float rstd = 1.f / std::sqrt(sum_squares(x, H) / static_cast<float>(H) + p.eps);
        for (int64_t i = 0; i < H; ++i) y[i] = from_float<T>(x[i] * rstd * w[i]);
        p.rstd[r] = rstd;
      }
    }
  });
}

template <typename T>
void norm_bwd(const NormProblem& p, Scratch& s, int64_t tasks) {
  const int64_t H = p.hidden;
  const bool layer = p.mean != nullptr;
  const float inv_h = 1.f / static_cast<float>(H);
  // Scratch per task: x, dy, weight, dweight partial, dbias partial.
  for (int64_t c = 0; c < tasks; ++c) std::fill(s.task(c) + 3 * H, s.task(c) + 5 * H, 0.f);
  parallel_for(p.rows, row_grain(H), [&](int64_t c, int64_t r0, int64_t r1) {
    float* xbuf = s.task(c);
    float* dybuf = xbuf + H;
    float* w = dybuf + H;
    float* dw = w + H;
    float* db = dw + H;
    load_param(p.weight, p.param_dtype, H, p.w_offset, 1.f, w);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p.x) + r * p.x_stride, xbuf, H);
      const float* dy = row_as_float(static_cast<const T*>(p.dy) + r * p.dy_stride, dybuf, H);
      T* dx = static_cast<T*>(p.dx) + r * p.dx_stride;
      const float mean = layer ? p.mean[r] : 0.f;
      const float rstd = p.rstd[r];
      // c1 = mean(g), c2 = mean(g * xhat) with g = dy * w, xhat = (x - mean) * rstd.
      const float c1 = layer ? sum_products(dy, w, H) * inv_h : 0.f;
      const float c2 = sum_products(dy, w, x, H, mean) * rstd * inv_h;
      int64_t i;
      for (i = 0; i < H; ++i) {
        const float xhat = (x[i] - mean) * rstd;
        dx[i] = from_float<T>(rstd * (dy[i] * w[i] - c1 - xhat * c2));
        dw[i] += dy[i] * xhat;
      }
      if (p.dbias)
        for (i = 0; i < H; ++i) db[i] += dy[i];
    }
  });
  // Sum the partials of every task, columns split across the pool,
  // into task 0's partials (in task order), then rounded to the parameter dtype.
  parallel_for(H, 4096, [&](int64_t, int64_t i0, int64_t i1) {
    float* dw = s.task(0) + 3 * H;
    float* db = s.task(0) + 4 * H;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t c = 1; c < tasks; ++c) {
        dw[i] += s.task(c)[3 * H + i];
        db[i] += s.task(c)[4 * H + i];
      }
    if (p.dweight) store_param(dw, p.param_dtype, i0, i1, p.dweight);
    if (p.dbias) store_param(db, p.param_dtype, i0, i1, p.dbias);
  });
}

fuselet_status run_fwd(const NormProblem& p) {
  try {
    Scratch s;
    s.per_task = 3 * p.hidden;
    s.buf.resize(static_cast<size_t>(parallel_chunks(p.rows, row_grain(p.hidden)) * s.per_task));
    switch (p.dtype) {
      case FUSELET_FLOAT32: norm_fwd<float>(p, s); break;
      case FUSELET_FLOAT16: norm_fwd<half_t>(p, s); break;
      case FUSELET_BFLOAT16: norm_fwd<bfloat16_t>(p, s); break;
    }
  } catch (const std::bad_alloc&) {
    return fail(FUSELET_ERR_INTERNAL, "out of memory allocating %lld floats of scratch",
                static_cast<long long>(3 * p.hidden));
  }
  return ok();
}

fuselet_status run_bwd(const NormProblem& p) {
  try {
    Scratch s;
    s.per_task = 5 * p.hidden;
    const int64_t tasks = parallel_chunks(p.rows, row_grain(p.hidden));
    s.buf.resize(static_cast<size_t>(tasks * s.per_task));
    switch (p.dtype) {
      case FUSELET_FLOAT32: norm_bwd<float>(p, s, tasks); break;
      case FUSELET_FLOAT16: norm_bwd<half_t>(p, s, tasks); break;
      case FUSELET_BFLOAT16: norm_bwd<bfloat16_t>(p, s, tasks); break;
    }
  } catch (const std::bad_alloc&) {
    return fail(FUSELET_ERR_INTERNAL, "out of memory allocating %lld floats of scratch",
                static_cast<long long>(5 * p.hidden));
  }
  return ok();
}

}  // namespace
}  // namespace fuselet

using fuselet::NormProblem;

extern "C" {

fuselet_status fuselet_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight, float eps, uint32_t flags,
                                    fuselet_tensor* y, fuselet_tensor* rstd) {
  NormProblem p;
  if (fuselet_status s = fuselet::check_norm_fwd(x, weight, nullptr, eps, flags, y, nullptr, rstd, false, &p))
    return s;
  return fuselet::run_fwd(p);
}

fuselet_status fuselet_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                                    const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                    fuselet_tensor* dweight) {
  NormProblem p;
  if (fuselet_status s =
          fuselet::check_norm_bwd(dy, x, weight, nullptr, rstd, flags, dx, dweight, nullptr, false, &p))
    return s;
  return fuselet::run_bwd(p);
}

fuselet_status fuselet_layer_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight,
                                      const fuselet_tensor* bias, float eps, uint32_t flags, fuselet_tensor* y,
                                      fuselet_tensor* mean, fuselet_tensor* rstd) {
  NormProblem p;
  if (fuselet_status s = fuselet::check_norm_fwd(x, weight, bias, eps, flags, y, mean, rstd, true, &p)) return s;
  return fuselet::run_fwd(p);
}

fuselet_status fuselet_layer_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                                      const fuselet_tensor* mean, const fuselet_tensor* rstd, uint32_t flags,
                                      fuselet_tensor* dx, fuselet_tensor* dweight, fuselet_tensor* dbias) {
  NormProblem p;
  if (fuselet_status s = fuselet::check_norm_bwd(dy, x, weight, mean, rstd, flags, dx, dweight, dbias, true, &p))
    return s;
  return fuselet::run_bwd(p);
}

#ifndef FUSELET_WITH_CUDA
// CPU-only builds: the CUDA entry points exist and say so.
static fuselet_status no_cuda() {
  return fuselet::fail(FUSELET_ERR_UNSUPPORTED, "this libfuselet was built without CUDA (FUSELET_CUDA=OFF)");
}
size_t fuselet_norm_bwd_workspace_bytes_cuda(int64_t, int64_t) { return 0; }
fuselet_status fuselet_rms_norm_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, float, uint32_t,
                                         fuselet_tensor*, fuselet_tensor*, void*) { return no_cuda(); }
fuselet_status fuselet_rms_norm_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                         const fuselet_tensor*, uint32_t, fuselet_tensor*, fuselet_tensor*, void*,
                                         size_t, void*) { return no_cuda(); }
fuselet_status fuselet_layer_norm_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*, float,
                                           uint32_t, fuselet_tensor*, fuselet_tensor*, fuselet_tensor*, void*) {
  return no_cuda();
}
fuselet_status fuselet_layer_norm_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                           const fuselet_tensor*, const fuselet_tensor*, uint32_t, fuselet_tensor*,
                                           fuselet_tensor*, fuselet_tensor*, void*, size_t, void*) {
  return no_cuda();
}
#endif

}  // extern "C"
