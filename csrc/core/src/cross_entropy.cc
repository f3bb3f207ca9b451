// Cross-entropy loss on the CPU: rows split across fuselet's own thread pool, each row read
// in float32 (soft-capped into scratch when asked), a two-pass logsumexp (lane max, then lane
// sum of exp), then the gradient row when one is asked for. Math and shapes:
// fuselet/cross_entropy.h.
#include <cinttypes>
#include <cmath>

#include "cpu_common.h"
#include "cpu_math.h"
#include "cross_entropy_check.h"
#include "parallel.h"

namespace fuselet {

namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h, cpu_math.h)

enum class Mode { kFwd, kBwd, kFwdBwd };

// Every target is ignore_index or inside [0, V): checked before any row runs.
fuselet_status check_target_values(const CrossEntropyProblem& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t t = p.target_at(r);
    if (!p.ignored(t) && !p.in_range(t))
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "target: element %" PRId64 " is %" PRId64 ", outside [0, %" PRId64 ") and not ignore_index (%" PRId64
                  ")",
                  r, t, p.vocab, p.ignore_index);
  }
  return FUSELET_OK;
}

// Rows [r0, r1) in mode M (buf: V floats of scratch).
template <typename T, Mode M>
struct CrossEntropyRows {
  static FUSELET_INLINE void run(const CrossEntropyProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t V = p->vocab;
    const float c = p->softcap, ls = p->label_smoothing, zl = p->z_loss;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = p->target_at(r);
      T* dx = M == Mode::kFwd ? nullptr : static_cast<T*>(p->dlogits) + r * p->dlogits_stride;
      if (p->ignored(t)) {
        if (M != Mode::kBwd) {
          p->loss[r] = 0.f;
          if (p->z) p->z[r] = 0.f;
        }
        if (M == Mode::kFwd) p->lse[r] = 0.f;
        if (M != Mode::kFwd)
          for (int64_t j = 0; j < V; ++j) dx[j] = from_float<T>(0.f);
        continue;
      }
      const T* x = static_cast<const T*>(p->logits) + r * p->logits_stride;
      const float* s;  // the (soft-capped) row; x itself for float32 without a softcap
      if (c > 0.f) {
        for (int64_t j = 0; j < V; ++j) buf[j] = c * tanh_approx(to_float(x[j]) / c);
        s = buf;
      } else {
        s = row_as_float(x, buf, V);
      }
      const float st = s[t];  // read before dx (which may be x) is written
      float lse;
      if (M == Mode::kBwd) {
        lse = p->lse[r];
      } else {
        const float m = lane_max(V, [=](int64_t j) { return s[j]; });
        const float sum = lane_reduce(V, [=](int64_t j) { return exp_approx(s[j] - m); });
        lse = m + std::log(sum);
        float ce = lse - st;
        if (ls > 0.f) {
          const float mean = lane_reduce(V, [=](int64_t j) { return s[j]; }) / static_cast<float>(V);
          ce = (1.f - ls) * (lse - st) + ls * (lse - mean);
        }
        const float zt = zl * lse * lse;
        p->loss[r] = ce + zt;
        if (p->z) p->z[r] = zt;
        if (M == Mode::kFwd) {
          p->lse[r] = lse;
          continue;
        }
      }
      const float g = M == Mode::kBwd ? p->dloss[r] : p->grad_scale;
      const float a = g * (1.f + 2.f * zl * lse);  // times p_j
      const float b = g * ls / static_cast<float>(V);  // minus, every j
      const float bt = g * (1.f - ls);  // minus, j == t
      if (c > 0.f) {
        const float inv_c = 1.f / c;
        for (int64_t j = 0; j < V; ++j) {
          const float q = s[j] * inv_c;
          dx[j] = from_float<T>((a * exp_approx(s[j] - lse) - b) * (1.f - q * q));
        }
        const float q = st * inv_c;
        dx[t] = from_float<T>((a * exp_approx(st - lse) - b - bt) * (1.f - q * q));
      } else {
        for (int64_t j = 0; j < V; ++j) dx[j] = from_float<T>(a * exp_approx(s[j] - lse) - b);
        dx[t] = from_float<T>(a * exp_approx(st - lse) - b - bt);
      }
    }
  }
};

template <typename T, Mode M>
void cross_entropy_rows(const CrossEntropyProblem& p, Scratch& s) {
  const OutRows out{M == Mode::kFwd ? nullptr : p.dlogits, p.dlogits_stride, p.vocab};
  parallel_rows<T>(p.rows, row_grain(p.vocab), s.tasks, {out}, [&](int64_t c, int64_t r0, int64_t r1) {
    run_best<CrossEntropyRows<T, M>>(&p, s.task(c), r0, r1);
  });
}

fuselet_status run(const CrossEntropyProblem& p, Mode mode) {
  if (fuselet_status s = check_target_values(p)) return s;
  if (p.rows == 0) return ok();
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.vocab));
  return with_scratch("logits", tasks, 1, p.vocab, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      switch (mode) {
        case Mode::kFwd: cross_entropy_rows<T, Mode::kFwd>(p, s); break;
        case Mode::kBwd: cross_entropy_rows<T, Mode::kBwd>(p, s); break;
        case Mode::kFwdBwd: cross_entropy_rows<T, Mode::kFwdBwd>(p, s); break;
      }
    });
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_cross_entropy_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                         const fuselet_cross_entropy_options* opts, fuselet_tensor* loss,
                                         fuselet_tensor* z, fuselet_tensor* lse) {
  return fuselet::guarded("fuselet_cross_entropy_fwd", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s = fuselet::check_cross_entropy_fwd(logits, target, opts, loss, z, lse, &p)) return s;
    return fuselet::run(p, fuselet::Mode::kFwd);
  });
}

fuselet_status fuselet_cross_entropy_bwd(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                         const fuselet_tensor* target, const fuselet_tensor* lse,
                                         const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits) {
  return fuselet::guarded("fuselet_cross_entropy_bwd", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s = fuselet::check_cross_entropy_bwd(dloss, logits, target, lse, opts, dlogits, &p)) return s;
    return fuselet::run(p, fuselet::Mode::kBwd);
  });
}

fuselet_status fuselet_cross_entropy_fwd_bwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                             const fuselet_cross_entropy_options* opts, float grad_scale,
                                             fuselet_tensor* loss, fuselet_tensor* z, fuselet_tensor* dlogits) {
  return fuselet::guarded("fuselet_cross_entropy_fwd_bwd", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s =
            fuselet::check_cross_entropy_fwd_bwd(logits, target, opts, grad_scale, loss, z, dlogits, &p))
      return s;
    return fuselet::run(p, fuselet::Mode::kFwdBwd);
  });
}

#ifndef FUSELET_WITH_CUDA
fuselet_status fuselet_cross_entropy_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*,
                                              const fuselet_cross_entropy_options*, fuselet_tensor*, fuselet_tensor*,
                                              fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_cross_entropy_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                              const fuselet_tensor*, const fuselet_cross_entropy_options*,
                                              fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_cross_entropy_fwd_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*,
                                                  const fuselet_cross_entropy_options*, float, fuselet_tensor*,
                                                  fuselet_tensor*, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
