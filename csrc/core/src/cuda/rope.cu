/*
 * fuselet CUDA kernels: rotary position embedding, forward and backward (math in rope.h).
 *
 * One thread per unit of a row (one head of one token), grid-strided over rows x units. A
 * unit is W pairs (half-split: W features of each half) or W / 2 pairs (interleaved: W
 * consecutive features) of the rotated part, or W features of the pass-through part. W = 4
 * (vector loads and stores) when every pointer and stride allows it, else 1 (scalar; an
 * interleaved scalar unit is one pair). All launches go on the caller's stream, each followed
 * by a cudaGetLastError() check.
 */
#include "common.cuh"
#include "rope_check.h"

namespace fuselet {
namespace {

using namespace gpu;  // NOLINT: the shared building blocks (common.cuh)

template <typename T, int N>
__device__ __forceinline__ void load_n(const T* p, float (&out)[N]) {
  if constexpr (N == 1) {
    out[0] = to_float(*p);
  } else {
    load(p, out);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_n(T* p, const float (&in)[N]) {
  if constexpr (N == 1) {
    *p = from_float<T>(in[0]);
  } else {
    store(p, in);
  }
}

// E consecutive table elements of one row: a vector load (E > 1) or a scalar (E == 1 is not
// used: an interleaved unit holds at least one pair).
template <int E, typename C>
__device__ __forceinline__ void load_table(const C* p, float (&out)[E]) {
  if constexpr (E == 2) {
    out[0] = to_float(p[0]);
    out[1] = to_float(p[1]);
  } else {
    load(p, out);
  }
}

// Features i..i+E-1's table elements, each from its table and column (rope.h), of the (b, t)
// row `row` of table 0.
template <int E, typename C>
__device__ __forceinline__ void gather(const RopeProblem& p, const C* row, int64_t stride_k, int64_t i,
                                       float (&out)[E]) {
#pragma unroll
  for (int k = 0; k < E; ++k) out[k] = to_float(row[p.table_offset(i + k, stride_k)]);
}

// kBwd = false: y_i = x_i c_i + e_i s_i x_p(i); true: dx_i = dy_i c_i - e_i s_p(i) dy_p(i).
template <typename T, typename C, int W, bool kInter, bool kBwd>
__global__ void __launch_bounds__(256) rope_kernel(const RopeProblem p, int64_t rot_units, int64_t units) {
  const int64_t total = p.rows * units;
  const int64_t h = p.R / 2;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / units, u = idx - r * units;
    int64_t b, t, n;
    p.locate(r, &b, &t, &n);
    const T* x = static_cast<const T*>(p.in) + b * p.in_b + t * p.in_s + n * p.in_n;
    T* y = static_cast<T*>(p.out) + b * p.out_b + t * p.out_s + n * p.out_n;
    if (u >= rot_units) {  // pass-through features R..D-1
      const int64_t i = p.R + (u - rot_units) * W;
      if constexpr (W == 1) {
        y[i] = x[i];
      } else {
        *reinterpret_cast<Vec<T, W>*>(y + i) = *reinterpret_cast<const Vec<T, W>*>(x + i);
      }
      continue;
    }
    const C* cr = static_cast<const C*>(p.cos) + b * p.cos_b + t * p.cos_s;
    const C* sr = static_cast<const C*>(p.sin) + b * p.sin_b + t * p.sin_s;
    const bool direct = p.direct;  // else each feature's table and column (rope.h)
    if constexpr (kInter) {
      constexpr int E = W < 2 ? 2 : W;  // features of the unit: E / 2 pairs
      const int64_t i = u * E;
      float a[E], c[E], s[E], o[E];
      if constexpr (W == 1) {
#pragma unroll
        for (int k = 0; k < 2; ++k) a[k] = to_float(x[i + k]);
      } else {
        load(x + i, a);
      }
      if (direct) {
        load_table<E>(cr + i, c);
        load_table<E>(sr + i, s);
      } else {
        gather<E>(p, cr, p.cos_k, i, c);
        gather<E>(p, sr, p.sin_k, i, s);
      }
#pragma unroll
      for (int k = 0; k < E; k += 2) {
        if constexpr (kBwd) {
          o[k] = a[k] * c[k] + a[k + 1] * s[k + 1];
          o[k + 1] = a[k + 1] * c[k + 1] - a[k] * s[k];
        } else {
          o[k] = a[k] * c[k] - a[k + 1] * s[k];
          o[k + 1] = a[k + 1] * c[k + 1] + a[k] * s[k + 1];
        }
      }
      if constexpr (W == 1) {
#pragma unroll
        for (int k = 0; k < 2; ++k) y[i + k] = from_float<T>(o[k]);
      } else {
        store(y + i, o);
      }
    } else {
      const int64_t i = u * W, j = i + h;
      float a[W], e[W], ca[W], ce[W], sa[W], se[W], oa[W], oe[W];
      load_n(x + i, a);
      load_n(x + j, e);
      if (direct) {
        load_n(cr + i, ca);
        load_n(cr + j, ce);
        load_n(sr + i, sa);
        load_n(sr + j, se);
      } else {
        gather<W>(p, cr, p.cos_k, i, ca);
        gather<W>(p, cr, p.cos_k, j, ce);
        gather<W>(p, sr, p.sin_k, i, sa);
        gather<W>(p, sr, p.sin_k, j, se);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if constexpr (kBwd) {
          oa[k] = a[k] * ca[k] + e[k] * se[k];
          oe[k] = e[k] * ce[k] - a[k] * sa[k];
        } else {
          oa[k] = a[k] * ca[k] - e[k] * sa[k];
          oe[k] = e[k] * ce[k] + a[k] * se[k];
        }
      }
      store_n(y + i, oa);
      store_n(y + j, oe);
    }
  }
}

// W-element vectors everywhere: every feature count and row stride a multiple of W, every
// pointer aligned to W elements of its type (the tables' only where they are read directly).
template <typename T, typename C>
bool vectorizable(const RopeProblem& p, int64_t w) {
  const int64_t counts[] = {p.D,     p.R,    p.interleaved ? p.R : p.R / 2, p.in_b, p.in_s, p.in_n, p.out_b,
                            p.out_s, p.out_n};
  for (int64_t v : counts)
    if (v % w != 0) return false;
  if (!aligned(p.in, w * sizeof(T)) || !aligned(p.out, w * sizeof(T))) return false;
  if (!p.direct) return true;  // the tables are gathered element by element
  const int64_t tables[] = {p.cos_b, p.cos_s, p.sin_b, p.sin_s};
  for (int64_t v : tables)
    if (v % w != 0) return false;
  return aligned(p.cos, w * sizeof(C)) && aligned(p.sin, w * sizeof(C));
}

template <typename T, typename C, int W, bool kInter>
fuselet_status launch(const RopeProblem& p, cudaStream_t s) {
  constexpr int64_t kPairsPerUnit = kInter ? (W < 2 ? 1 : W / 2) : W;
  const int64_t rot_units = p.R / 2 / kPairsPerUnit, units = rot_units + (p.D - p.R) / W;
  if (p.rows > INT64_MAX / units)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "x: too many heads x features for one launch");
  constexpr int kThreads = 256;
  const int64_t blocks = (p.rows * units + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, kMaxGrid));
  if (p.backward)
    launch_kernel<rope_kernel<T, C, W, kInter, true>>(grid, kThreads, 0, s, p, rot_units, units);
  else
    launch_kernel<rope_kernel<T, C, W, kInter, false>>(grid, kThreads, 0, s, p, rot_units, units);
  return launch_status(p.backward ? "rope_bwd_kernel" : "rope_fwd_kernel");
}

template <typename T, typename C>
fuselet_status run_typed(const RopeProblem& p, cudaStream_t s) {
  if (fuselet_status st =
          check_alignment({{p.backward ? "dy" : "x", p.in}, {p.backward ? "dx" : "y", p.out}}, sizeof(T)))
    return st;
  if (fuselet_status st = check_alignment({{"cos", p.cos}, {"sin", p.sin}}, sizeof(C))) return st;
  const bool vec = vectorizable<T, C>(p, 4);
  if (p.interleaved) return vec ? launch<T, C, 4, true>(p, s) : launch<T, C, 1, true>(p, s);
  return vec ? launch<T, C, 4, false>(p, s) : launch<T, C, 1, false>(p, s);
}

fuselet_status run(const RopeProblem& p, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (p.cs_dtype == FUSELET_FLOAT32) return run_typed<T, float>(p, s);
    return run_typed<T, T>(p, s);
  });
}

}  // namespace
}  // namespace fuselet

namespace fuselet {
namespace {

// Every `_cuda` entry point: the checks, then the launch (the old entry points: no K dim).
fuselet_status entry(const char* name, const fuselet_tensor* in, const fuselet_tensor* cos, const fuselet_tensor* sin,
                     const int64_t* sections, int32_t n_sections, uint32_t flags, fuselet_tensor* out, bool backward,
                     void* stream) {
  return guarded(name, [&] {
    RopeProblem p;
    if (fuselet_status s = check_rope(in, backward ? "dy" : "x", cos, sin, sections, n_sections, flags, out,
                                      backward ? "dx" : "y", backward, &p))
      return s;
    return run(p, stream);
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_rope_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                     uint32_t flags, fuselet_tensor* y, void* stream) {
  return fuselet::entry("fuselet_rope_fwd_cuda", x, cos, sin, nullptr, 0, flags, y, false, stream);
}

fuselet_status fuselet_rope_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                     uint32_t flags, fuselet_tensor* dx, void* stream) {
  return fuselet::entry("fuselet_rope_bwd_cuda", dy, cos, sin, nullptr, 0, flags, dx, true, stream);
}

fuselet_status fuselet_rope_sections_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* cos,
                                              const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections,
                                              uint32_t flags, fuselet_tensor* y, void* stream) {
  return fuselet::entry("fuselet_rope_sections_fwd_cuda", x, cos, sin, sections, n_sections, flags, y, false, stream);
}

fuselet_status fuselet_rope_sections_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                              const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections,
                                              uint32_t flags, fuselet_tensor* dx, void* stream) {
  return fuselet::entry("fuselet_rope_sections_bwd_cuda", dy, cos, sin, sections, n_sections, flags, dx, true, stream);
}

}  // extern "C"
