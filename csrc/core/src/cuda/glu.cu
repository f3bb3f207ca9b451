/*
 * fuselet CUDA kernels: SwiGLU and GeGLU, forward and backward (math in glu.h).
 *
 * Elementwise over R rows of F outputs: blockIdx.y strides over the rows, blockIdx.x and the
 * threads over the F columns of a row; each thread reads g and u (and dy), float32 math with
 * the accurate expf / erff / tanhf, one rounding to the storage dtype. All launches go on the
 * caller's stream, each followed by a cudaGetLastError() check.
 */
#include "common.cuh"
#include "glu_check.h"

namespace fuselet {
namespace {

using namespace gpu;  // NOLINT: the shared building blocks (common.cuh)

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

struct Silu {
  __device__ static float f(float g) { return g / (1.f + expf(-g)); }
  __device__ static float df(float g, float* a) {
    const float s = 1.f / (1.f + expf(-g));
    *a = g * s;
    return s * (1.f + g * (1.f - s));
  }
};

struct Gelu {
  __device__ static float f(float g) { return 0.5f * g * (1.f + erff(g * 0.70710678118654752f)); }
  __device__ static float df(float g, float* a) {
    const float cdf = 0.5f * (1.f + erff(g * 0.70710678118654752f));
    *a = g * cdf;
    return cdf + g * 0.39894228040143268f * expf(-0.5f * g * g);
  }
};

// 0.5 (1 + tanh(z)) = sigmoid(2 z): no cancellation where tanh(z) is near -1.
struct GeluTanh {
  __device__ static float sig(float g) {
    return 1.f / (1.f + expf(-2.f * 0.79788456080286536f * (g + 0.044715f * g * g * g)));
  }
  __device__ static float f(float g) { return g * sig(g); }
  __device__ static float df(float g, float* a) {
    const float s = sig(g);
    *a = g * s;
    return s + 2.f * g * s * (1.f - s) * 0.79788456080286536f * (1.f + 3.f * 0.044715f * g * g);
  }
};

template <typename T, typename Act>
__global__ void __launch_bounds__(kThreads) glu_fwd_kernel(const GluProblem p) {
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    T* y = static_cast<T*>(p.y) + r * p.y_stride;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < p.half; i += int64_t(gridDim.x) * kThreads)
      y[i] = from_float<T>(Act::f(to_float(x[i])) * to_float(x[p.half + i]));
  }
}

template <typename T, typename Act>
__global__ void __launch_bounds__(kThreads) glu_bwd_kernel(const GluProblem p) {
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    T* dx = static_cast<T*>(p.dx) + r * p.dx_stride;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < p.half; i += int64_t(gridDim.x) * kThreads) {
      const float g = to_float(x[i]), u = to_float(x[p.half + i]), d = to_float(dy[i]);
      float a;
      const float da = Act::df(g, &a);
      dx[i] = from_float<T>(d * u * da);
      dx[p.half + i] = from_float<T>(d * a);
    }
  }
}

template <typename Act>
fuselet_status launch(const GluProblem& p, bool backward, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((p.half - 1) / kThreads + 1, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGridY)));
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status s = check_alignment({{"x", p.x}, {"y", p.y}, {"dy", p.dy}, {"dx", p.dx}}, sizeof(T))) return s;
    if (backward) {
      glu_bwd_kernel<T, Act><<<grid, kThreads, 0, stream>>>(p);
      return launch_status("glu_bwd_kernel");
    }
    glu_fwd_kernel<T, Act><<<grid, kThreads, 0, stream>>>(p);
    return launch_status("glu_fwd_kernel");
  });
}

fuselet_status run(const GluProblem& p, bool backward, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.activation) {
    case FUSELET_GLU_GELU: return launch<Gelu>(p, backward, s);
    case FUSELET_GLU_GELU_TANH: return launch<GeluTanh>(p, backward, s);
    default: return launch<Silu>(p, backward, s);
  }
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_glu_fwd_cuda(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y, void* stream) {
  return fuselet::guarded("fuselet_glu_fwd_cuda", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_fwd(x, activation, y, &p)) return s;
    return fuselet::run(p, false, stream);
  });
}

fuselet_status fuselet_glu_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation,
                                    fuselet_tensor* dx, void* stream) {
  return fuselet::guarded("fuselet_glu_bwd_cuda", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_bwd(dy, x, activation, dx, &p)) return s;
    return fuselet::run(p, true, stream);
  });
}

}  // extern "C"
