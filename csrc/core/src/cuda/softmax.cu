/*
 * fuselet CUDA kernels: scaled, optionally causal softmax, forward and backward (math in
 * softmax.h).
 *
 * One block per row (grid-strided over the rows), 32..1024 threads striding over its K
 * keys: the forward reduces the max, then the sum of exp (both block all-reductions), then
 * writes y, re-reading the row (from L2) in each pass; masked keys and fully masked rows get
 * zeros. The backward reduces sum(dy * y), then writes dx. All launches go on the caller's
 * stream, each followed by a cudaGetLastError() check.
 */
#include <cmath>

#include "common.cuh"
#include "softmax_check.h"

namespace fuselet {
namespace {

using namespace gpu;  // NOLINT: the shared building blocks (common.cuh)

template <typename T>
__global__ void __launch_bounds__(1024) softmax_fwd_kernel(const SoftmaxProblem p) {
  FUSELET_SHARED(float[33], scratch);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    T* y = static_cast<T*>(p.out) + r * p.out_stride;
    const int64_t n = p.visible(r);
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, p.scale * to_float(x[j]));
    m = block_allreduce(m, Max(), scratch, -INFINITY);
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(p.scale * to_float(x[j]) - m);
    sum = block_allreduce(sum, Add(), scratch);
    const float inv = n > 0 ? 1.f / sum : 0.f;
    for (int64_t j = threadIdx.x; j < p.keys; j += blockDim.x)
      y[j] = from_float<T>(j < n ? expf(p.scale * to_float(x[j]) - m) * inv : 0.f);
  }
}

template <typename T>
__global__ void __launch_bounds__(1024) softmax_bwd_kernel(const SoftmaxProblem p) {
  FUSELET_SHARED(float[33], scratch);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* y = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    T* dx = static_cast<T*>(p.out) + r * p.out_stride;
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < p.keys; j += blockDim.x) dot += to_float(dy[j]) * to_float(y[j]);
    dot = block_allreduce(dot, Add(), scratch);
    for (int64_t j = threadIdx.x; j < p.keys; j += blockDim.x) {
      const float yj = to_float(y[j]);
      dx[j] = from_float<T>(p.scale * yj * (to_float(dy[j]) - dot));
    }
  }
}

fuselet_status run(const SoftmaxProblem& p, bool backward, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = team_threads(p.keys, 4, 1024, 32);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status st = check_alignment({{"x", p.x}, {"dy", p.dy}, {"y", p.out}}, sizeof(T))) return st;
    if (backward) {
      launch_kernel<softmax_bwd_kernel<T>>(grid, threads, 0, s, p);
      return launch_status("softmax_bwd_kernel");
    }
    launch_kernel<softmax_fwd_kernel<T>>(grid, threads, 0, s, p);
    return launch_status("softmax_fwd_kernel");
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_softmax_fwd_cuda(const fuselet_tensor* x, float scale, uint32_t flags, fuselet_tensor* y,
                                        void* stream) {
  return fuselet::guarded("fuselet_softmax_fwd_cuda", [&] {
    fuselet::SoftmaxProblem p;
    if (fuselet_status s = fuselet::check_softmax_fwd(x, scale, flags, y, &p)) return s;
    return fuselet::run(p, false, stream);
  });
}

fuselet_status fuselet_softmax_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* y, float scale,
                                        fuselet_tensor* dx, void* stream) {
  return fuselet::guarded("fuselet_softmax_bwd_cuda", [&] {
    fuselet::SoftmaxProblem p;
    if (fuselet_status s = fuselet::check_softmax_bwd(dy, y, scale, dx, &p)) return s;
    return fuselet::run(p, true, stream);
  });
}

}  // extern "C"
