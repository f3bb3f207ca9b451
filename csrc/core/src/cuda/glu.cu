/*
 * fuselet CUDA kernels: SwiGLU, GeGLU and the clamped SwiGLU, forward and backward (math in glu.h).
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

// The plain GLUs: y = act(g) * u.
template <typename Act>
struct Gated {
  __device__ explicit Gated(const GluProblem&) {}
  __device__ float fwd(float g, float u) const { return Act::f(g) * u; }
  __device__ void bwd(float g, float u, float dy, float* dg, float* du) const {
    float a;
    const float da = Act::df(g, &a);
    *dg = dy * u * da;
    *du = dy * a;
  }
};

// GPT-OSS's clamped SwiGLU (NaN kept, the gradient passed at the bounds: torch.clamp's rules).
struct SiluClamped {
  float alpha, limit;
  __device__ explicit SiluClamped(const GluProblem& p) : alpha(p.alpha), limit(p.limit) {}
  __device__ float gate(float g) const { return g > limit ? limit : g; }
  __device__ float up(float u) const { return u > limit ? limit : (u < -limit ? -limit : u); }
  __device__ float fwd(float g, float u) const {
    const float gc = gate(g);
    return gc / (1.f + expf(-alpha * gc)) * (up(u) + 1.f);
  }
  __device__ void bwd(float g, float u, float dy, float* dg, float* du) const {
    const float gc = gate(g), s = 1.f / (1.f + expf(-alpha * gc));
    *dg = g <= limit ? dy * (up(u) + 1.f) * s * (1.f + alpha * gc * (1.f - s)) : 0.f;
    *du = (u >= -limit && u <= limit) ? dy * gc * s : 0.f;
  }
};

// Where g_i and u_i sit in a row of x (and dx): halves, or interleaved pairs.
template <bool Interleaved>
struct Layout {
  __device__ static int64_t g(int64_t i, int64_t) { return Interleaved ? 2 * i : i; }
  __device__ static int64_t u(int64_t i, int64_t F) { return Interleaved ? 2 * i + 1 : F + i; }
};

template <typename T, typename Math, typename L>
__global__ void __launch_bounds__(kThreads) glu_fwd_kernel(const GluProblem p) {
  const Math math(p);
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    T* y = static_cast<T*>(p.y) + r * p.y_stride;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < p.half; i += int64_t(gridDim.x) * kThreads)
      y[i] = from_float<T>(math.fwd(to_float(x[L::g(i, p.half)]), to_float(x[L::u(i, p.half)])));
  }
}

template <typename T, typename Math, typename L>
__global__ void __launch_bounds__(kThreads) glu_bwd_kernel(const GluProblem p) {
  const Math math(p);
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    T* dx = static_cast<T*>(p.dx) + r * p.dx_stride;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < p.half; i += int64_t(gridDim.x) * kThreads) {
      const int64_t gi = L::g(i, p.half), ui = L::u(i, p.half);
      float dg, du;
      math.bwd(to_float(x[gi]), to_float(x[ui]), to_float(dy[i]), &dg, &du);
      dx[gi] = from_float<T>(dg);
      dx[ui] = from_float<T>(du);
    }
  }
}

template <typename Math, typename L>
fuselet_status launch(const GluProblem& p, bool backward, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((p.half - 1) / kThreads + 1, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGridY)));
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (fuselet_status s = check_alignment({{"x", p.x}, {"y", p.y}, {"dy", p.dy}, {"dx", p.dx}}, sizeof(T))) return s;
    if (backward) {
      launch_kernel<glu_bwd_kernel<T, Math, L>>(grid, kThreads, 0, stream, p);
      return launch_status("glu_bwd_kernel");
    }
    launch_kernel<glu_fwd_kernel<T, Math, L>>(grid, kThreads, 0, stream, p);
    return launch_status("glu_fwd_kernel");
  });
}

template <typename Math>
fuselet_status launch(const GluProblem& p, bool backward, cudaStream_t stream) {
  return p.interleaved ? launch<Math, Layout<true>>(p, backward, stream)
                       : launch<Math, Layout<false>>(p, backward, stream);
}

fuselet_status run(const GluProblem& p, bool backward, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.activation) {
    case FUSELET_GLU_GELU: return launch<Gated<Gelu>>(p, backward, s);
    case FUSELET_GLU_GELU_TANH: return launch<Gated<GeluTanh>>(p, backward, s);
    case FUSELET_GLU_SILU_CLAMPED: return launch<SiluClamped>(p, backward, s);
    default: return launch<Gated<Silu>>(p, backward, s);
  }
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_glu_fwd_ex_cuda(const fuselet_tensor* x, const fuselet_glu_options* opts, fuselet_tensor* y,
                                       void* stream) {
  return fuselet::guarded("fuselet_glu_fwd_ex_cuda", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_fwd(x, opts, true, y, &p)) return s;
    return fuselet::run(p, false, stream);
  });
}

fuselet_status fuselet_glu_bwd_ex_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                       const fuselet_glu_options* opts, fuselet_tensor* dx, void* stream) {
  return fuselet::guarded("fuselet_glu_bwd_ex_cuda", [&] {
    fuselet::GluProblem p;
    if (fuselet_status s = fuselet::check_glu_bwd(dy, x, opts, true, dx, &p)) return s;
    return fuselet::run(p, true, stream);
  });
}

fuselet_status fuselet_glu_fwd_cuda(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y, void* stream) {
  return fuselet::guarded("fuselet_glu_fwd_cuda", [&] {
    fuselet::GluProblem p;
    const fuselet_glu_options opts = fuselet::glu_options(activation);
    if (fuselet_status s = fuselet::check_glu_fwd(x, &opts, false, y, &p)) return s;
    return fuselet::run(p, false, stream);
  });
}

fuselet_status fuselet_glu_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation,
                                    fuselet_tensor* dx, void* stream) {
  return fuselet::guarded("fuselet_glu_bwd_cuda", [&] {
    fuselet::GluProblem p;
    const fuselet_glu_options opts = fuselet::glu_options(activation);
    if (fuselet_status s = fuselet::check_glu_bwd(dy, x, &opts, false, dx, &p)) return s;
    return fuselet::run(p, true, stream);
  });
}

}  // extern "C"
