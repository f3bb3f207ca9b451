// Cross-entropy loss and the log-probabilities on the CPU: rows split across fuselet's own
// thread pool, each row read in float32 (soft-capped into scratch when asked), a two-pass
// logsumexp (lane max, then lane sums of exp), then the gradient row when one is asked for.
// Math and shapes: fuselet/cross_entropy.h.
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

// The row as float32, soft-capped (c tanh(x / c)) where c > 0: into buf (V floats), or x itself
// for float32 without a softcap. Inlined into each ISA's copy of the row loops.
template <typename T>
FUSELET_INLINE const float* capped_row(const T* x, float* buf, int64_t V, float c) {
  if (c > 0.f) {
    for (int64_t j = 0; j < V; ++j) buf[j] = c * tanh_approx(to_float(x[j]) / c);
    return buf;
  }
  return row_as_float(x, buf, V);
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
      const float* s = capped_row(x, buf, V, c);
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

// --- the log-probabilities (fuselet_logprobs_*) ------------------------------------------------

// Rows [r0, r1) of the log-probabilities' forward (kBwd false) or backward (buf: V floats).
// The forward reads the (soft-capped) row twice: its max, sum and first index of a value >= s_t
// before t; then, lane-wise, sum e_j, sum e_j (s_j - m), sum e_j^2 with e_j = exp(s_j - m).
template <typename T, bool kBwd>
struct LogprobsRows {
  static FUSELET_INLINE void run(const CrossEntropyProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t V = p->vocab;
    const float c = p->softcap;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = p->target_at(r);
      T* dx = kBwd ? static_cast<T*>(p->dlogits) + r * p->dlogits_stride : nullptr;
      if (p->ignored(t)) {
        if (kBwd) {
          for (int64_t j = 0; j < V; ++j) dx[j] = from_float<T>(0.f);
        } else {
          for (float* out : {p->loss, p->lse, p->entropy, p->log_sum_sq_probs, p->mean_logits, p->is_top1})
            if (out) out[r] = 0.f;
        }
        continue;
      }
      const T* x = static_cast<const T*>(p->logits) + r * p->logits_stride;
      const float* s = capped_row(x, buf, V, c);
      const float st = s[t];  // read before dx (which may be x) is written
      if (kBwd) {
        const float lse = p->lse[r];
        const float g = p->dloss ? p->dloss[r] : 0.f, h = p->dentropy ? p->dentropy[r] : 0.f;
        const float he = p->dentropy ? h * p->entropy[r] : 0.f;
        // ds_j = -p_j (g + h (s_j - lse) + h entropy) + g [j == t]; p_j = 0 (s_j = -inf): 0.
        const float inv_c = c > 0.f ? 1.f / c : 0.f;
        for (int64_t j = 0; j < V; ++j) {
          const float pj = exp_approx(s[j] - lse);
          const float d = pj > 0.f ? -pj * (g + h * (s[j] - lse) + he) : 0.f;
          const float q = s[j] * inv_c;
          dx[j] = from_float<T>(c > 0.f ? d * (1.f - q * q) : d);
        }
        const float pt = exp_approx(st - lse);
        float dt = g - pt * (g + h * (st - lse) + he);
        if (c > 0.f) dt *= 1.f - (st * inv_c) * (st * inv_c);
        dx[t] = from_float<T>(dt);
        continue;
      }
      const float m = lane_max(V, [=](int64_t j) { return s[j]; });
      // e_j (s_j - m) with s_j - m clamped at -88: exp_approx is 0 below -87.3, so the clamp
      // changes no term with e_j > 0 and makes 0 (not NaN) of e_j = 0 at s_j = -inf, without a
      // branch (a select there stops the loop's vectorization: 12x slower, measured).
      float acc_e[kLanes] = {}, acc_ed[kLanes] = {}, acc_ee[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= V; j += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          const float d = s[j + l] - m, e = exp_approx(d);
          acc_e[l] += e;
          acc_ed[l] += e * std::max(d, -88.f);
          acc_ee[l] += e * e;
        }
      for (int l = 0; j < V; ++j, ++l) {
        const float d = s[j] - m, e = exp_approx(d);
        acc_e[l] += e;
        acc_ed[l] += e * std::max(d, -88.f);
        acc_ee[l] += e * e;
      }
      float sum = 0.f, sum_ed = 0.f, sum_ee = 0.f;
      for (int l = 0; l < kLanes; ++l) {
        sum += acc_e[l];
        sum_ed += acc_ed[l];
        sum_ee += acc_ee[l];
      }
      const float log_sum = std::log(sum), lse = m + log_sum;
      p->loss[r] = st - lse;
      p->lse[r] = lse;
      if (p->entropy) p->entropy[r] = log_sum - sum_ed / sum;
      if (p->log_sum_sq_probs) p->log_sum_sq_probs[r] = std::log(sum_ee) - 2.f * log_sum;
      if (p->mean_logits) p->mean_logits[r] = lane_reduce(V, [=](int64_t k) { return s[k]; }) / static_cast<float>(V);
      if (p->is_top1) {
        // argmax == t: s_t is the max and no class before t reaches it.
        const float before = lane_reduce(t, [=](int64_t k) { return s[k] >= st ? 1.f : 0.f; });
        p->is_top1[r] = st == m && before == 0.f ? 1.f : 0.f;
      }
    }
  }
};

template <typename T, bool kBwd>
void logprobs_rows(const CrossEntropyProblem& p, Scratch& s) {
  const OutRows out{kBwd ? p.dlogits : nullptr, p.dlogits_stride, p.vocab};
  parallel_rows<T>(p.rows, row_grain(p.vocab), s.tasks, {out},
                   [&](int64_t c, int64_t r0, int64_t r1) { run_best<LogprobsRows<T, kBwd>>(&p, s.task(c), r0, r1); });
}

fuselet_status run_logprobs(const CrossEntropyProblem& p, bool bwd) {
  if (fuselet_status s = check_target_values(p)) return s;
  if (p.rows == 0) return ok();
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.vocab));
  return with_scratch("logits", tasks, 1, p.vocab, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (bwd)
        logprobs_rows<T, true>(p, s);
      else
        logprobs_rows<T, false>(p, s);
    });
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_logprobs_fwd(const fuselet_tensor* logits, const fuselet_tensor* target,
                                    const fuselet_cross_entropy_options* opts, fuselet_tensor* logp,
                                    fuselet_tensor* lse, fuselet_tensor* entropy, fuselet_tensor* log_sum_sq_probs,
                                    fuselet_tensor* mean_logits, fuselet_tensor* is_top1) {
  return fuselet::guarded("fuselet_logprobs_fwd", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s = fuselet::check_logprobs_fwd(logits, target, opts, logp, lse, entropy, log_sum_sq_probs,
                                                       mean_logits, is_top1, &p))
      return s;
    return fuselet::run_logprobs(p, false);
  });
}

fuselet_status fuselet_logprobs_bwd(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                    const fuselet_tensor* logits, const fuselet_tensor* target,
                                    const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                    const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits) {
  return fuselet::guarded("fuselet_logprobs_bwd", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s =
            fuselet::check_logprobs_bwd(dlogp, dentropy, logits, target, lse, entropy, opts, dlogits, &p))
      return s;
    return fuselet::run_logprobs(p, true);
  });
}

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
fuselet_status fuselet_logprobs_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*,
                                         const fuselet_cross_entropy_options*, fuselet_tensor*, fuselet_tensor*,
                                         fuselet_tensor*, fuselet_tensor*, fuselet_tensor*, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_logprobs_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                         const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                         const fuselet_cross_entropy_options*, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
