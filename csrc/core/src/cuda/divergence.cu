/*
 * fuselet CUDA kernels: per-row divergences (KL, JSD, TVD), forward and backward (math in
 * divergence.h, per element in divergence_check.h's DivergenceMath, shared with the CPU).
 *
 * One block per row (grid-strided over the rows), 128..1024 threads striding over its V
 * elements: the forward sums the element terms (a block all-reduction) and thread 0 writes the
 * row's loss; the backward writes each element's gradients, scaled by the row's dloss. The kind
 * and log_target are template arguments, chosen on the host. All launches go on the caller's
 * stream, each followed by a cudaGetLastError() check.
 */
#include <cmath>

#include "common.cuh"
#include "divergence_check.h"

namespace fuselet {
namespace {

using namespace gpu;  // NOLINT: the shared building blocks (common.cuh)

struct ExpF {
  FUSELET_HOST_DEVICE float operator()(float v) const { return expf(v); }
};
struct LogF {
  FUSELET_HOST_DEVICE float operator()(float v) const { return logf(v); }
};

template <typename T, typename Math>
__global__ void __launch_bounds__(1024) divergence_fwd_kernel(const DivergenceProblem p, const Math math) {
  FUSELET_SHARED(float[33], scratch);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(p.input) + r * p.input_stride;
    const T* t = static_cast<const T*>(p.target) + r * p.target_stride;
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < p.vocab; j += blockDim.x) sum += math.term(to_float(x[j]), to_float(t[j]));
    sum = block_allreduce(sum, Add(), scratch);
    if (threadIdx.x == 0) p.loss[r] = sum;
  }
}

template <typename T, typename Math>
__global__ void __launch_bounds__(1024) divergence_bwd_kernel(const DivergenceProblem p, const Math math) {
  T* const dinput = static_cast<T*>(p.dinput);
  T* const dtarget = static_cast<T*>(p.dtarget);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(p.input) + r * p.input_stride;
    const T* t = static_cast<const T*>(p.target) + r * p.target_stride;
    const float g = p.dloss[r];
    for (int64_t j = threadIdx.x; j < p.vocab; j += blockDim.x) {
      const DivergenceGrad d = math.grad(to_float(x[j]), to_float(t[j]));
      if (dinput) dinput[r * p.dinput_stride + j] = from_float<T>(g * d.dx);
      if (dtarget) dtarget[r * p.dtarget_stride + j] = from_float<T>(g * d.dt);
    }
  }
}

// Over logits (fuselet_divergence_logits): per row, the maxima of the scaled input and target, their
// sums of exponentials, then the loss and the sum of dx, and last each element's gradient through
// log_softmax written over input by the thread that read it (every read of the row is behind the
// last reduction's barrier).
template <typename T, typename Math>
__global__ void __launch_bounds__(1024) divergence_logits_kernel(const DivergenceProblem p, const Math math) {
  FUSELET_SHARED(float[33], scratch);
  FUSELET_SHARED(float2[33], scratch2);
  const float scale = p.scale;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    T* x = static_cast<T*>(p.dinput) + r * p.dinput_stride;
    const T* t = static_cast<const T*>(p.target) + r * p.target_stride;
    float mx = -INFINITY, mt = -INFINITY;
    for (int64_t j = threadIdx.x; j < p.vocab; j += blockDim.x) {
      mx = fmaxf(mx, scale * to_float(x[j]));
      mt = fmaxf(mt, scale * to_float(t[j]));
    }
    mx = block_allreduce(mx, Max(), scratch, -INFINITY);
    mt = block_allreduce(mt, Max(), scratch, -INFINITY);
    float2 e = make_float2(0.f, 0.f);
    for (int64_t j = threadIdx.x; j < p.vocab; j += blockDim.x) {
      e.x += expf(scale * to_float(x[j]) - mx);
      e.y += expf(scale * to_float(t[j]) - mt);
    }
    e = block_allreduce(e, Add(), scratch2);
    const float lx = mx + logf(e.x), lt = mt + logf(e.y);
    float2 sums = make_float2(0.f, 0.f);  // the loss, the sum of dx
    for (int64_t j = threadIdx.x; j < p.vocab; j += blockDim.x) {
      const float xj = scale * to_float(x[j]) - lx, tj = scale * to_float(t[j]) - lt;
      const DivergenceTermDx d = math.term_dx(xj, expf(xj), tj, expf(tj));
      sums.x += d.term;
      sums.y += d.dx;
    }
    sums = block_allreduce(sums, Add(), scratch2);
    if (threadIdx.x == 0) p.loss[r] = sums.x;
    const float c = p.dloss[r] * scale;
    for (int64_t j = threadIdx.x; j < p.vocab; j += blockDim.x) {
      const float xj = scale * to_float(x[j]) - lx, tj = scale * to_float(t[j]) - lt;
      const float q = expf(xj);
      const DivergenceTermDx d = math.term_dx(xj, q, tj, expf(tj));
      x[j] = from_float<T>(c * (d.dx - q * sums.y));
    }
  }
}

fuselet_status run_logits(const DivergenceProblem& p, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = team_threads(p.vocab, 8, 1024);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status st = check_alignment({{"input", p.input}, {"target", p.target}}, sizeof(T))) return st;
    fuselet_status st = FUSELET_OK;
    with_divergence_math<ExpF, LogF, true>(p, [&](auto math) {  // log_target: checked
      launch_kernel<divergence_logits_kernel<T, decltype(math)>>(grid, threads, 0, s, p, math);
      st = launch_status("divergence_logits_kernel");
    });
    return st;
  });
}

fuselet_status run(const DivergenceProblem& p, bool backward, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = team_threads(p.vocab, 8, 1024);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status st = check_alignment(
            {{"input", p.input}, {"target", p.target}, {"dinput", p.dinput}, {"dtarget", p.dtarget}}, sizeof(T)))
      return st;
    fuselet_status st = FUSELET_OK;
    with_divergence_math<ExpF, LogF>(p, [&](auto math) {
      if (backward) {
        launch_kernel<divergence_bwd_kernel<T, decltype(math)>>(grid, threads, 0, s, p, math);
        st = launch_status("divergence_bwd_kernel");
      } else {
        launch_kernel<divergence_fwd_kernel<T, decltype(math)>>(grid, threads, 0, s, p, math);
        st = launch_status("divergence_fwd_kernel");
      }
    });
    return st;
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_divergence_fwd_cuda(const fuselet_tensor* input, const fuselet_tensor* target,
                                           const fuselet_divergence_options* opts, fuselet_tensor* loss,
                                           void* stream) {
  return fuselet::guarded("fuselet_divergence_fwd_cuda", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::check_divergence_fwd(input, target, opts, loss, &p)) return s;
    return fuselet::run(p, false, stream);
  });
}

fuselet_status fuselet_divergence_bwd_cuda(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                           const fuselet_tensor* target, const fuselet_divergence_options* opts,
                                           fuselet_tensor* dinput, fuselet_tensor* dtarget, void* stream) {
  return fuselet::guarded("fuselet_divergence_bwd_cuda", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::check_divergence_bwd(dloss, input, target, opts, dinput, dtarget, &p)) return s;
    return fuselet::run(p, true, stream);
  });
}

fuselet_status fuselet_divergence_logits_cuda(fuselet_tensor* input, const fuselet_tensor* target,
                                              const fuselet_tensor* dloss, const fuselet_divergence_options* opts,
                                              float scale, fuselet_tensor* loss, void* stream) {
  return fuselet::guarded("fuselet_divergence_logits_cuda", [&] {
    fuselet::DivergenceProblem p;
    if (fuselet_status s = fuselet::check_divergence_logits(input, target, dloss, opts, scale, loss, &p)) return s;
    return fuselet::run_logits(p, stream);
  });
}

}  // extern "C"
