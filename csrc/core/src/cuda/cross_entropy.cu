/*
 * fuselet CUDA kernels: cross-entropy loss, forward, backward and the fused forward + backward,
 * and the log-probabilities' forward and backward (math in cross_entropy.h).
 *
 * One block per row (grid-strided over the rows), 32..1024 threads striding over its V logits
 * (128k-256k classes just mean more strides). The forward keeps a per-thread online max and
 * sum of exp in one pass, combined by one block all-reduction of (max, sum) pairs (plus one
 * sum of the logits with label smoothing); the gradient pass re-reads the row (from L2). Every
 * thread reads logits[t] before the block's first barrier, so that dlogits may be the logits
 * (in place: each thread then reads and writes only its own elements). A target outside
 * [0, V) that is not ignore_index gives NaN loss and z and a zero gradient row. All launches
 * go on the caller's stream, each followed by a cudaGetLastError() check.
 */
#include <cmath>

#include "common.cuh"
#include "cross_entropy_check.h"

namespace fuselet {
namespace {

using namespace gpu;  // NOLINT: the shared building blocks (common.cuh)

enum Mode { kFwd = 0, kBwd = 1, kFwdBwd = 2 };

// (max, sum of exp(v - max)) pairs: the combination of two partial logsumexps.
struct LseOp {
  __device__ float2 operator()(float2 a, float2 b) const {
    const float m = fmaxf(a.x, b.x);
    if (m == -INFINITY) return make_float2(m, 0.f);
    return make_float2(m, a.y * expf(a.x - m) + b.y * expf(b.x - m));
  }
};

__device__ __forceinline__ float capped(float v, float c) { return c > 0.f ? c * tanhf(v / c) : v; }

template <typename T, int kMode>
__global__ void __launch_bounds__(1024) cross_entropy_kernel(const CrossEntropyProblem p) {
  FUSELET_SHARED(float2[33], pairs);
  FUSELET_SHARED(float[33], sums);
  const int64_t V = p.vocab;
  const float c = p.softcap, ls = p.label_smoothing, zl = p.z_loss;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int64_t t = p.target_at(r);
    T* dx = kMode == kFwd ? nullptr : static_cast<T*>(p.dlogits) + r * p.dlogits_stride;
    if (p.ignored(t)) {
      if (threadIdx.x == 0 && kMode != kBwd) {
        p.loss[r] = 0.f;
        if (p.z) p.z[r] = 0.f;
        if (kMode == kFwd) p.lse[r] = 0.f;
      }
      if (kMode != kFwd)
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = from_float<T>(0.f);
      continue;
    }
    const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
    const bool valid = p.in_range(t);
    const float st = valid ? capped(to_float(x[t]), c) : NAN;  // before any dx is written
    float lse;
    if (kMode == kBwd) {
      lse = p.lse[r];
      __syncthreads();  // every thread has read x[t]
    } else {
      float m = -INFINITY, sum = 0.f, total = 0.f;
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = capped(to_float(x[j]), c);
        if (v > m) {
          sum = sum * expf(m - v) + 1.f;
          m = v;
        } else if (v != -INFINITY) {
          sum += expf(v - m);
        }
        total += v;
      }
      const float2 ms = block_allreduce(make_float2(m, sum), LseOp(), pairs, make_float2(-INFINITY, 0.f));
      lse = ms.x + logf(ms.y);
      float ce = lse - st;
      if (ls > 0.f) {
        const float mean = block_allreduce(total, Add(), sums) / static_cast<float>(V);
        ce = (1.f - ls) * (lse - st) + ls * (lse - mean);
      }
      if (threadIdx.x == 0) {
        const float zt = valid ? zl * lse * lse : NAN;
        p.loss[r] = ce + zt;
        if (p.z) p.z[r] = zt;
        if (kMode == kFwd) p.lse[r] = lse;
      }
      if (kMode == kFwd) continue;
    }
    if (!valid) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = from_float<T>(0.f);
      continue;
    }
    const float g = kMode == kBwd ? p.dloss[r] : p.grad_scale;
    const float a = g * (1.f + 2.f * zl * lse), b = g * ls / static_cast<float>(V), bt = g * (1.f - ls);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = capped(to_float(x[j]), c);
      float d = a * expf(v - lse) - b - (j == t ? bt : 0.f);
      if (c > 0.f) {
        const float q = v / c;
        d *= 1.f - q * q;
      }
      dx[j] = from_float<T>(d);
    }
  }
}

fuselet_status run(const CrossEntropyProblem& p, int mode, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = team_threads(p.vocab, 8, 1024, 32);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
  if (fuselet_status st = check_alignment({{"loss", p.loss}, {"z", p.z}, {"lse", p.lse}, {"dloss", p.dloss}}, 4))
    return st;
  if (fuselet_status st = check_alignment({{"target", p.target}}, p.target64 ? 8 : 4)) return st;
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status st = check_alignment({{"logits", p.logits}, {"dlogits", p.dlogits}}, sizeof(T))) return st;
    switch (mode) {
      case kFwd: launch_kernel<cross_entropy_kernel<T, kFwd>>(grid, threads, 0, s, p); break;
      case kBwd: launch_kernel<cross_entropy_kernel<T, kBwd>>(grid, threads, 0, s, p); break;
      default: launch_kernel<cross_entropy_kernel<T, kFwdBwd>>(grid, threads, 0, s, p); break;
    }
    return launch_status("cross_entropy_kernel");
  });
}

// The log-probabilities (fuselet_logprobs_*), one block per row as above. The forward reads the
// row twice: (max, sum of the logits, count of the classes before t that reach s_t), then the
// sums of e_j, e_j (s_j - m) and e_j^2 with e_j = exp(s_j - m), each a block all-reduction. The
// backward reads it once. A target outside [0, V) that is not ignore_index: NaN in every forward
// output but lse, a zero gradient row.
template <typename T, bool kBwd>
__global__ void __launch_bounds__(1024) logprobs_kernel(const CrossEntropyProblem p) {
  FUSELET_SHARED(float2[33], pairs);
  FUSELET_SHARED(float[33], sums);
  const int64_t V = p.vocab;
  const float c = p.softcap;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int64_t t = p.target_at(r);
    T* dx = kBwd ? static_cast<T*>(p.dlogits) + r * p.dlogits_stride : nullptr;
    if (p.ignored(t)) {
      if (kBwd) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = from_float<T>(0.f);
      } else if (threadIdx.x == 0) {
        p.loss[r] = p.lse[r] = 0.f;
        if (p.entropy) p.entropy[r] = 0.f;
        if (p.log_sum_sq_probs) p.log_sum_sq_probs[r] = 0.f;
        if (p.mean_logits) p.mean_logits[r] = 0.f;
        if (p.is_top1) p.is_top1[r] = 0.f;
      }
      continue;
    }
    const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
    const bool valid = p.in_range(t);
    const float st = valid ? capped(to_float(x[t]), c) : NAN;  // before any dx is written
    if (kBwd) {
      __syncthreads();  // every thread has read x[t]
      if (!valid) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = from_float<T>(0.f);
        continue;
      }
      const float lse = p.lse[r];
      const float g = p.dloss ? p.dloss[r] : 0.f, h = p.dentropy ? p.dentropy[r] : 0.f;
      const float he = p.dentropy ? h * p.entropy[r] : 0.f;
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = capped(to_float(x[j]), c), pj = expf(v - lse);
        float d = pj > 0.f ? -pj * (g + h * (v - lse) + he) : 0.f;
        if (j == t) d += g;
        if (c > 0.f) {
          const float q = v / c;
          d *= 1.f - q * q;
        }
        dx[j] = from_float<T>(d);
      }
      continue;
    }
    float m = -INFINITY, total = 0.f, before = 0.f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = capped(to_float(x[j]), c);
      m = fmaxf(m, v);
      total += v;
      if (j < t && v >= st) before += 1.f;
    }
    m = block_allreduce(m, Max(), sums, -INFINITY);
    float e_sum = 0.f, ed_sum = 0.f, ee_sum = 0.f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float d = capped(to_float(x[j]), c) - m, e = expf(d);
      e_sum += e;
      if (e > 0.f) ed_sum += e * d;
      ee_sum += e * e;
    }
    const float2 tb = block_allreduce(make_float2(total, before), Add(), pairs);
    const float2 sd = block_allreduce(make_float2(e_sum, ed_sum), Add(), pairs);
    ee_sum = block_allreduce(ee_sum, Add(), sums);
    if (threadIdx.x == 0) {
      const float log_sum = logf(sd.x), lse = m + log_sum, bad = valid ? 0.f : NAN;
      p.loss[r] = st - lse;
      p.lse[r] = lse;
      if (p.entropy) p.entropy[r] = log_sum - sd.y / sd.x + bad;
      if (p.log_sum_sq_probs) p.log_sum_sq_probs[r] = logf(ee_sum) - 2.f * log_sum + bad;
      if (p.mean_logits) p.mean_logits[r] = tb.x / static_cast<float>(V) + bad;
      if (p.is_top1) p.is_top1[r] = valid ? (st == m && tb.y == 0.f ? 1.f : 0.f) : NAN;
    }
  }
}

fuselet_status run_logprobs(const CrossEntropyProblem& p, bool bwd, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = team_threads(p.vocab, 8, 1024, 32);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
  if (fuselet_status st = check_alignment({{"logp", p.loss},
                                           {"lse", p.lse},
                                           {"entropy", p.entropy},
                                           {"log_sum_sq_probs", p.log_sum_sq_probs},
                                           {"mean_logits", p.mean_logits},
                                           {"is_top1", p.is_top1},
                                           {"dlogp", p.dloss},
                                           {"dentropy", p.dentropy}},
                                          4))
    return st;
  if (fuselet_status st = check_alignment({{"target", p.target}}, p.target64 ? 8 : 4)) return st;
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status st = check_alignment({{"logits", p.logits}, {"dlogits", p.dlogits}}, sizeof(T))) return st;
    if (bwd)
      launch_kernel<logprobs_kernel<T, true>>(grid, threads, 0, s, p);
    else
      launch_kernel<logprobs_kernel<T, false>>(grid, threads, 0, s, p);
    return launch_status("logprobs_kernel");
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_cross_entropy_fwd_cuda(const fuselet_tensor* logits, const fuselet_tensor* target,
                                              const fuselet_cross_entropy_options* opts, fuselet_tensor* loss,
                                              fuselet_tensor* z, fuselet_tensor* lse, void* stream) {
  return fuselet::guarded("fuselet_cross_entropy_fwd_cuda", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s = fuselet::check_cross_entropy_fwd(logits, target, opts, loss, z, lse, &p)) return s;
    return fuselet::run(p, fuselet::kFwd, stream);
  });
}

fuselet_status fuselet_cross_entropy_bwd_cuda(const fuselet_tensor* dloss, const fuselet_tensor* logits,
                                              const fuselet_tensor* target, const fuselet_tensor* lse,
                                              const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits,
                                              void* stream) {
  return fuselet::guarded("fuselet_cross_entropy_bwd_cuda", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s = fuselet::check_cross_entropy_bwd(dloss, logits, target, lse, opts, dlogits, &p)) return s;
    return fuselet::run(p, fuselet::kBwd, stream);
  });
}

fuselet_status fuselet_cross_entropy_fwd_bwd_cuda(const fuselet_tensor* logits, const fuselet_tensor* target,
                                                  const fuselet_cross_entropy_options* opts, float grad_scale,
                                                  fuselet_tensor* loss, fuselet_tensor* z, fuselet_tensor* dlogits,
                                                  void* stream) {
  return fuselet::guarded("fuselet_cross_entropy_fwd_bwd_cuda", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s =
            fuselet::check_cross_entropy_fwd_bwd(logits, target, opts, grad_scale, loss, z, dlogits, &p))
      return s;
    return fuselet::run(p, fuselet::kFwdBwd, stream);
  });
}

fuselet_status fuselet_logprobs_fwd_cuda(const fuselet_tensor* logits, const fuselet_tensor* target,
                                         const fuselet_cross_entropy_options* opts, fuselet_tensor* logp,
                                         fuselet_tensor* lse, fuselet_tensor* entropy,
                                         fuselet_tensor* log_sum_sq_probs, fuselet_tensor* mean_logits,
                                         fuselet_tensor* is_top1, void* stream) {
  return fuselet::guarded("fuselet_logprobs_fwd_cuda", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s = fuselet::check_logprobs_fwd(logits, target, opts, logp, lse, entropy, log_sum_sq_probs,
                                                       mean_logits, is_top1, &p))
      return s;
    return fuselet::run_logprobs(p, false, stream);
  });
}

fuselet_status fuselet_logprobs_bwd_cuda(const fuselet_tensor* dlogp, const fuselet_tensor* dentropy,
                                         const fuselet_tensor* logits, const fuselet_tensor* target,
                                         const fuselet_tensor* lse, const fuselet_tensor* entropy,
                                         const fuselet_cross_entropy_options* opts, fuselet_tensor* dlogits,
                                         void* stream) {
  return fuselet::guarded("fuselet_logprobs_bwd_cuda", [&] {
    fuselet::CrossEntropyProblem p;
    if (fuselet_status s =
            fuselet::check_logprobs_bwd(dlogp, dentropy, logits, target, lse, entropy, opts, dlogits, &p))
      return s;
    return fuselet::run_logprobs(p, true, stream);
  });
}

}  // extern "C"
