// RMSNorm and LayerNorm on the CPU: one pass over each row for the statistics, one for
// the output; rows split across fuselet's own thread pool. Math and shapes: fuselet/norm.h.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu_common.h"
#include "cpu_math.h"
#include "norm_check.h"
#include "parallel.h"

namespace fuselet {
namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h, cpu_math.h)

FUSELET_INLINE float sum_squares(const float* x, int64_t n) {
  return lane_reduce(n, [=](int64_t i) { return x[i] * x[i]; });
}

FUSELET_INLINE float sum(const float* x, int64_t n) {
  return lane_reduce(n, [=](int64_t i) { return x[i]; });
}

FUSELET_INLINE float sum_squared_deviations(const float* x, int64_t n, float c) {
  return lane_reduce(n, [=](int64_t i) { return (x[i] - c) * (x[i] - c); });
}

// sum(a * b * (x - c)).
FUSELET_INLINE float sum_products(const float* a, const float* b, const float* x, int64_t n, float c) {
  return lane_reduce(n, [=](int64_t i) { return a[i] * b[i] * (x[i] - c); });
}

// sum(a * b).
FUSELET_INLINE float sum_products(const float* a, const float* b, int64_t n) {
  return lane_reduce(n, [=](int64_t i) { return a[i] * b[i]; });
}

// 1 / sqrt(mean((x - c)^2) + eps) of a row of finite values whose sum of squares overflowed
// float32 (|x - c| beyond ~1e19, float32 and bfloat16 inputs): the squares are summed over
// (x - c) / m, m = max |x - c|, and the scale applied after -- the same value in exact
// arithmetic, and what a float64 computation gives. -1 when the row holds an inf (the
// caller keeps the plain result: inf and NaN propagate as in the frameworks' own norms).
// The rare path: out of line, compiled once at the baseline ISA (bit-identical anyway).
__attribute__((noinline)) float rescaled_rstd(const float* x, int64_t n, float c, float eps) {
  const float m = lane_max(n, [=](int64_t i) { return std::fabs(x[i] - c); });
  if (!std::isfinite(m) || m == 0.f) return -1.f;
  const float inv_m = 1.f / m;
  const float ms = lane_reduce(n,
                               [=](int64_t i) {
                                 const float t = (x[i] - c) * inv_m;
                                 return t * t;
                               }) /
                   static_cast<float>(n);
  return inv_m / std::sqrt(ms + eps * inv_m * inv_m);
}

// 1 / sqrt(ms + eps) for ms = mean((x - c)^2), rescaled when ms overflowed (rescaled_rstd).
FUSELET_INLINE float rstd_of(float ms, const float* x, int64_t n, float c, float eps) {
  const float rstd = 1.f / std::sqrt(ms + eps);
  if (!std::isinf(ms)) return rstd;
  const float rescaled = rescaled_rstd(x, n, c, eps);
  return rescaled >= 0.f ? rescaled : rstd;
}

// Mean and 1 / sqrt(biased variance + eps) with two passes over the (cache-resident) row:
// exact, and each pass one accumulator per lane, which GCC vectorizes (a fused one-pass loop
// with two accumulators did not: 4x slower, measured).
FUSELET_INLINE void mean_rstd(const float* x, int64_t n, float eps, float* mean, float* rstd) {
  const float m = sum(x, n) / static_cast<float>(n);
  *mean = m;
  *rstd = rstd_of(sum_squared_deviations(x, n, m) / static_cast<float>(n), x, n, m, eps);
}

// Residual add: row r of x + res rounded to T, written to hout and, as float, to buf.
template <typename T>
FUSELET_INLINE const float* add_residual(const NormProblem& p, int64_t r, float* buf) {
  const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
  const T* res = static_cast<const T*>(p.res) + r * p.res_stride;
  T* h = static_cast<T*>(p.hout) + r * p.hout_stride;
  // Two loops: in one, the rounded value (a struct for float16 / bfloat16) both stored and
  // read back kept GCC from vectorizing it ("more than one data ref in stmt"), which made
  // the bfloat16 forward 2.5x slower than float32 at 1024x1024.
  for (int64_t i = 0; i < p.hidden; ++i) h[i] = from_float<T>(to_float(x[i]) + to_float(res[i]));
  if constexpr (std::is_same_v<T, float>) return h;
  for (int64_t i = 0; i < p.hidden; ++i) buf[i] = to_float(h[i]);
  return buf;
}

// Rows [r0, r1) of the forward; task: 3H floats of scratch (row, weight, bias).
template <typename T>
struct FwdRows {
  static FUSELET_INLINE void run(const NormProblem* pp, float* task, int64_t r0, int64_t r1) {
    const NormProblem& p = *pp;
    const int64_t H = p.hidden;
    const bool layer = p.mean != nullptr;
    float* xbuf = task;
    float* w = xbuf + H;
    float* b = w + H;
    load_param(p.weight, p.param_dtype, H, p.w_offset, 1.f, w);
    if (layer) load_param(p.bias, p.param_dtype, H, 0.f, 0.f, b);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x =
          p.res ? add_residual<T>(p, r, xbuf) : row_as_float(static_cast<const T*>(p.x) + r * p.x_stride, xbuf, H);
      T* y = static_cast<T*>(p.y) + r * p.y_stride;
      if (layer) {
        float mean, rstd;
        mean_rstd(x, H, p.eps, &mean, &rstd);
        for (int64_t i = 0; i < H; ++i) y[i] = from_float<T>((x[i] - mean) * rstd * w[i] + b[i]);
        p.mean[r] = mean;
        p.rstd[r] = rstd;
      } else {
        const float rstd = rstd_of(sum_squares(x, H) / static_cast<float>(H), x, H, 0.f, p.eps);
        for (int64_t i = 0; i < H; ++i) y[i] = from_float<T>(x[i] * rstd * w[i]);
        p.rstd[r] = rstd;
      }
    }
  }
};

// Rows [r0, r1) of the backward; task: 5H floats of scratch (x, dy, weight, and this task's
// dweight and dbias partial sums).
template <typename T>
struct BwdRows {
  static constexpr int64_t kAcc = 3;
  static FUSELET_INLINE void run(const NormProblem* pp, float* task, int64_t r0, int64_t r1) {
    const NormProblem& p = *pp;
    const int64_t H = p.hidden;
    const bool layer = p.mean != nullptr;
    const float inv_h = 1.f / static_cast<float>(H);
    float* xbuf = task;
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
      if (p.dres) {  // residual add + RMSNorm: the gradient of the residual stream joins dx
        const T* dres = static_cast<const T*>(p.dres) + r * p.dres_stride;
        for (i = 0; i < H; ++i) {
          const float xhat = (x[i] - mean) * rstd;
          dx[i] = from_float<T>(rstd * (dy[i] * w[i] - c1 - xhat * c2) + to_float(dres[i]));
          dw[i] += dy[i] * xhat;
        }
      } else {
        for (i = 0; i < H; ++i) {
          const float xhat = (x[i] - mean) * rstd;
          dx[i] = from_float<T>(rstd * (dy[i] * w[i] - c1 - xhat * c2));
          dw[i] += dy[i] * xhat;
        }
      }
      if (p.dbias)
        for (i = 0; i < H; ++i) db[i] += dy[i];
    }
  }
};

// Gated RMSNorm: silu(z) and its derivative.
FUSELET_INLINE float silu(float z) { return z * sigmoid_approx(z); }
FUSELET_INLINE float dsilu(float z) {
  const float s = sigmoid_approx(z);
  return s * (1.f + z * (1.f - s));
}

// Rows [r0, r1) of the gated RMSNorm forward; task: 4H floats of scratch (x, z, the norm's
// input h, weight). Each group of p.group elements has its own rstd.
template <typename T>
struct GatedFwdRows {
  static FUSELET_INLINE void run(const NormProblem* pp, float* task, int64_t r0, int64_t r1) {
    const NormProblem& p = *pp;
    const int64_t H = p.hidden, S = p.group, G = H / S;
    float* xbuf = task;
    float* zbuf = xbuf + H;
    float* hbuf = zbuf + H;
    float* w = hbuf + H;
    load_param(p.weight, p.param_dtype, H, p.w_offset, 1.f, w);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p.x) + r * p.x_stride, xbuf, H);
      const float* z = row_as_float(static_cast<const T*>(p.z) + r * p.z_stride, zbuf, H);
      const float* h = x;
      if (p.gate_first) {
        for (int64_t i = 0; i < H; ++i) hbuf[i] = x[i] * silu(z[i]);
        h = hbuf;
      }
      T* y = static_cast<T*>(p.y) + r * p.y_stride;
      for (int64_t g = 0; g < G; ++g) {
        const float* hg = h + g * S;
        const float rstd = rstd_of(sum_squares(hg, S) / static_cast<float>(S), hg, S, 0.f, p.eps);
        p.rstd[r * G + g] = rstd;
        if (p.gate_first) {
          for (int64_t i = g * S; i < (g + 1) * S; ++i) y[i] = from_float<T>(h[i] * rstd * w[i]);
        } else {
          for (int64_t i = g * S; i < (g + 1) * S; ++i) y[i] = from_float<T>(h[i] * rstd * w[i] * silu(z[i]));
        }
      }
    }
  }
};

// Rows [r0, r1) of the gated RMSNorm backward; task: 10H floats of scratch (x, z, dy, weight,
// the norm's input h, the gradient gy that reaches its output, silu(z) and silu'(z), then this
// task's dweight partial sums at kAcc). Each loop is branch-free, so that GCC vectorizes it.
template <typename T>
struct GatedBwdRows {
  static constexpr int64_t kAcc = 8;
  static FUSELET_INLINE void run(const NormProblem* pp, float* task, int64_t r0, int64_t r1) {
    const NormProblem& p = *pp;
    const int64_t H = p.hidden, S = p.group, G = H / S;
    const float inv_s = 1.f / static_cast<float>(S);
    float* xbuf = task;
    float* zbuf = xbuf + H;
    float* dybuf = zbuf + H;
    float* w = dybuf + H;
    float* hbuf = w + H;
    float* gybuf = hbuf + H;
    float* s = gybuf + H;
    float* ds = s + H;
    float* dw = task + kAcc * H;
    load_param(p.weight, p.param_dtype, H, p.w_offset, 1.f, w);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = row_as_float(static_cast<const T*>(p.x) + r * p.x_stride, xbuf, H);
      const float* z = row_as_float(static_cast<const T*>(p.z) + r * p.z_stride, zbuf, H);
      const float* dy = row_as_float(static_cast<const T*>(p.dy) + r * p.dy_stride, dybuf, H);
      T* dx = static_cast<T*>(p.dx) + r * p.dx_stride;
      T* dz = static_cast<T*>(p.dz) + r * p.dz_stride;
      for (int64_t i = 0; i < H; ++i) {
        const float sig = sigmoid_approx(z[i]);
        s[i] = z[i] * sig;
        ds[i] = sig * (1.f + z[i] * (1.f - sig));
      }
      // The norm's input h and the gradient gy that reaches its output.
      const float* h = x;
      const float* gy = dy;
      if (p.gate_first) {
        for (int64_t i = 0; i < H; ++i) hbuf[i] = x[i] * s[i];
        h = hbuf;
      } else {
        for (int64_t i = 0; i < H; ++i) gybuf[i] = dy[i] * s[i];
        gy = gybuf;
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t i0 = g * S, i1 = i0 + S;
        const float rstd = p.rstd[r * G + g];
        const float c2 = sum_products(gy + i0, w + i0, h + i0, S, 0.f) * rstd * inv_s;
        if (p.gate_first) {
          for (int64_t i = i0; i < i1; ++i) {
            const float xhat = h[i] * rstd;
            const float dh = rstd * (gy[i] * w[i] - xhat * c2);
            dw[i] += gy[i] * xhat;
            dx[i] = from_float<T>(dh * s[i]);
            dz[i] = from_float<T>(dh * x[i] * ds[i]);
          }
        } else {
          for (int64_t i = i0; i < i1; ++i) {
            const float xhat = h[i] * rstd;
            dw[i] += gy[i] * xhat;
            dx[i] = from_float<T>(rstd * (gy[i] * w[i] - xhat * c2));
            dz[i] = from_float<T>(dy[i] * xhat * w[i] * ds[i]);
          }
        }
      }
    }
  }
};

template <typename T>
void norm_fwd(const NormProblem& p, Scratch& s) {
  const OutRows y{p.y, p.y_stride, p.hidden}, hout{p.res ? p.hout : nullptr, p.hout_stride, p.hidden};
  parallel_rows<T>(p.rows, row_grain(p.hidden), s.tasks, {y, hout},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<FwdRows<T>>(&p, s.task(c), r0, r1); });
}

// The backward over the rows of Rows<T> (BwdRows, GatedBwdRows), whose tasks keep their dweight
// and dbias partial sums at Rows<T>::kAcc * H and (kAcc + 1) * H of their scratch.
template <template <typename> class Rows, typename T>
void norm_bwd(const NormProblem& p, Scratch& s, int64_t tasks) {
  const int64_t H = p.hidden, acc = Rows<T>::kAcc * H;
  for (int64_t c = 0; c < tasks; ++c) std::fill(s.task(c) + acc, s.task(c) + acc + 2 * H, 0.f);
  const OutRows dx{p.dx, p.dx_stride, H}, dz{p.dz, p.dz_stride, H};
  parallel_rows<T>(p.rows, row_grain(H), s.tasks, {dx, dz},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<Rows<T>>(&p, s.task(c), r0, r1); });
  // Sum the partials of every task, columns split across the pool,
  // into task 0's partials (in task order), then rounded to the parameter dtype.
  parallel_for(H, 4096, [&](int64_t, int64_t i0, int64_t i1) {
    float* dw = s.task(0) + acc;
    float* db = s.task(0) + acc + H;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t c = 1; c < tasks; ++c) {
        dw[i] += s.task(c)[acc + i];
        db[i] += s.task(c)[acc + H + i];
      }
    if (p.dweight) store_param(dw, p.param_dtype, i0, i1, p.dweight);
    if (p.dbias) store_param(db, p.param_dtype, i0, i1, p.dbias);
  });
}

fuselet_status run_fwd(const NormProblem& p) {
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.hidden));
  if (p.z != nullptr)
    return with_scratch("x", tasks, 4, p.hidden, [&](Scratch& s) {
      dispatch(p.dtype, [&](auto tag) {
        using T = decltype(tag);
        parallel_rows<T>(p.rows, row_grain(p.hidden), s.tasks, {{p.y, p.y_stride, p.hidden}},
                         [&](int64_t c, int64_t r0, int64_t r1) { run_best<GatedFwdRows<T>>(&p, s.task(c), r0, r1); });
      });
    });
  return with_scratch("x", tasks, 3, p.hidden,
                      [&](Scratch& s) { dispatch(p.dtype, [&](auto tag) { norm_fwd<decltype(tag)>(p, s); }); });
}

fuselet_status run_bwd(const NormProblem& p) {
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.hidden));
  if (p.z != nullptr)
    return with_scratch("x", tasks, GatedBwdRows<float>::kAcc + 2, p.hidden, [&](Scratch& s) {
      dispatch(p.dtype, [&](auto tag) { norm_bwd<GatedBwdRows, decltype(tag)>(p, s, tasks); });
    });
  return with_scratch("x", tasks, BwdRows<float>::kAcc + 2, p.hidden, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) { norm_bwd<BwdRows, decltype(tag)>(p, s, tasks); });
  });
}

}  // namespace
}  // namespace fuselet

using fuselet::NormProblem;

extern "C" {

fuselet_status fuselet_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight, float eps, uint32_t flags,
                                    fuselet_tensor* y, fuselet_tensor* rstd) {
  return fuselet::guarded("fuselet_rms_norm_fwd", [&] {
    NormProblem p;
    if (fuselet_status s = fuselet::check_norm_fwd(x, weight, nullptr, eps, flags, y, nullptr, rstd, false, &p))
      return s;
    return fuselet::run_fwd(p);
  });
}

fuselet_status fuselet_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                                    const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                    fuselet_tensor* dweight) {
  return fuselet::guarded("fuselet_rms_norm_bwd", [&] {
    NormProblem p;
    if (fuselet_status s =
            fuselet::check_norm_bwd(dy, x, weight, nullptr, rstd, flags, dx, dweight, nullptr, false, &p))
      return s;
    return fuselet::run_bwd(p);
  });
}

fuselet_status fuselet_add_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* residual,
                                        const fuselet_tensor* weight, float eps, uint32_t flags, fuselet_tensor* y,
                                        fuselet_tensor* residual_out, fuselet_tensor* rstd) {
  return fuselet::guarded("fuselet_add_rms_norm_fwd", [&] {
    NormProblem p;
    if (fuselet_status s = fuselet::check_add_norm_fwd(x, residual, weight, eps, flags, y, residual_out, rstd, &p))
      return s;
    return fuselet::run_fwd(p);
  });
}

fuselet_status fuselet_add_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                        const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                        const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                        fuselet_tensor* dweight) {
  return fuselet::guarded("fuselet_add_rms_norm_bwd", [&] {
    NormProblem p;
    if (fuselet_status s =
            fuselet::check_add_norm_bwd(dy, dresidual_out, residual_out, weight, rstd, flags, dx, dweight, &p))
      return s;
    return fuselet::run_bwd(p);
  });
}

fuselet_status fuselet_layer_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight,
                                      const fuselet_tensor* bias, float eps, uint32_t flags, fuselet_tensor* y,
                                      fuselet_tensor* mean, fuselet_tensor* rstd) {
  return fuselet::guarded("fuselet_layer_norm_fwd", [&] {
    NormProblem p;
    if (fuselet_status s = fuselet::check_norm_fwd(x, weight, bias, eps, flags, y, mean, rstd, true, &p)) return s;
    return fuselet::run_fwd(p);
  });
}

fuselet_status fuselet_layer_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                                      const fuselet_tensor* mean, const fuselet_tensor* rstd, uint32_t flags,
                                      fuselet_tensor* dx, fuselet_tensor* dweight, fuselet_tensor* dbias) {
  return fuselet::guarded("fuselet_layer_norm_bwd", [&] {
    NormProblem p;
    if (fuselet_status s = fuselet::check_norm_bwd(dy, x, weight, mean, rstd, flags, dx, dweight, dbias, true, &p))
      return s;
    return fuselet::run_bwd(p);
  });
}

fuselet_status fuselet_gated_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* z,
                                          const fuselet_tensor* weight, float eps, int64_t group_size, uint32_t flags,
                                          fuselet_tensor* y, fuselet_tensor* rstd) {
  return fuselet::guarded("fuselet_gated_rms_norm_fwd", [&] {
    NormProblem p;
    if (fuselet_status s = fuselet::check_gated_norm_fwd(x, z, weight, eps, group_size, flags, y, rstd, &p)) return s;
    return fuselet::run_fwd(p);
  });
}

fuselet_status fuselet_gated_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* z,
                                          const fuselet_tensor* weight, const fuselet_tensor* rstd, int64_t group_size,
                                          uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dz,
                                          fuselet_tensor* dweight) {
  return fuselet::guarded("fuselet_gated_rms_norm_bwd", [&] {
    NormProblem p;
    if (fuselet_status s =
            fuselet::check_gated_norm_bwd(dy, x, z, weight, rstd, group_size, flags, dx, dz, dweight, &p))
      return s;
    return fuselet::run_bwd(p);
  });
}

#ifndef FUSELET_WITH_CUDA
// CPU-only builds: the CUDA entry points exist and say so.
using fuselet::no_cuda;
size_t fuselet_norm_bwd_workspace_bytes_cuda(int64_t, int64_t) { return 0; }
fuselet_status fuselet_rms_norm_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, float, uint32_t,
                                         fuselet_tensor*, fuselet_tensor*, void*) {
  return no_cuda();
}
fuselet_status fuselet_rms_norm_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                         const fuselet_tensor*, uint32_t, fuselet_tensor*, fuselet_tensor*, void*,
                                         size_t, void*) {
  return no_cuda();
}
fuselet_status fuselet_add_rms_norm_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                             float, uint32_t, fuselet_tensor*, fuselet_tensor*, fuselet_tensor*,
                                             void*) {
  return no_cuda();
}
fuselet_status fuselet_add_rms_norm_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                             const fuselet_tensor*, const fuselet_tensor*, uint32_t, fuselet_tensor*,
                                             fuselet_tensor*, void*, size_t, void*) {
  return no_cuda();
}
fuselet_status fuselet_layer_norm_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*, float,
                                           uint32_t, fuselet_tensor*, fuselet_tensor*, fuselet_tensor*, void*) {
  return no_cuda();
}
fuselet_status fuselet_layer_norm_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                           const fuselet_tensor*, const fuselet_tensor*, uint32_t, fuselet_tensor*,
                                           fuselet_tensor*, fuselet_tensor*, void*, size_t, void*) {
  return no_cuda();
}
fuselet_status fuselet_gated_rms_norm_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                               float, int64_t, uint32_t, fuselet_tensor*, fuselet_tensor*, void*) {
  return no_cuda();
}
fuselet_status fuselet_gated_rms_norm_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                               const fuselet_tensor*, const fuselet_tensor*, int64_t, uint32_t,
                                               fuselet_tensor*, fuselet_tensor*, fuselet_tensor*, void*, size_t,
                                               void*) {
  return no_cuda();
}
#endif

}  // extern "C"
