// Rotary position embedding on the CPU: heads (rows of D features) split across fuselet's own
// thread pool, read in place through x's strides. Math and shapes: fuselet/rope.h.
#include <cstring>

#include "cpu_common.h"
#include "parallel.h"
#include "rope_check.h"

namespace fuselet {

namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h)

// The R floats of feature i's c_i of the (b, t) table row (rope.h: its table and column), for a
// pair table or K tables; `row` points at that row of table 0, `stride_k` is cos_k or sin_k.
template <typename C>
FUSELET_INLINE const float* gather_row(const RopeProblem* p, const C* row, int64_t stride_k, float* buf) {
  for (int64_t i = 0; i < p->R; ++i) buf[i] = to_float(row[p->table_offset(i, stride_k)]);
  return buf;
}

// One (b, t) row of cos or sin as R floats (copied into buf unless it is float32 already).
template <typename C>
FUSELET_INLINE const float* table_row(const RopeProblem* p, const C* row, int64_t stride_k, float* buf) {
  return p->direct ? row_as_float(row, buf, p->R) : gather_row(p, row, stride_k, buf);
}

// Rows [r0, r1) of p (buf: 3R floats of scratch): out = the rotation of in (forward) or its
// transpose (backward) on the first R features, in copied beyond. The same float32 products
// and sums in every ISA copy, so the results are bit-identical.
template <typename T, typename C, bool kInter, bool kBwd>
struct RopeRows {
  static FUSELET_INLINE void run(const RopeProblem* p, float* buf, int64_t r0, int64_t r1) {
    const int64_t D = p->D, R = p->R, h = R / 2;
    float* xf = buf;
    float* cf = buf + R;
    float* sf = buf + 2 * R;
    const float* c = nullptr;
    const float* s = nullptr;
    int64_t table = -1;  // (b, s) of the cos / sin row in c, s
    for (int64_t r = r0; r < r1; ++r) {
      int64_t b, t, n;
      p->locate(r, &b, &t, &n);
      if (b * p->S + t != table) {
        table = b * p->S + t;
        c = table_row(p, static_cast<const C*>(p->cos) + b * p->cos_b + t * p->cos_s, p->cos_k, cf);
        s = table_row(p, static_cast<const C*>(p->sin) + b * p->sin_b + t * p->sin_s, p->sin_k, sf);
      }
      const T* xr = static_cast<const T*>(p->in) + b * p->in_b + t * p->in_s + n * p->in_n;
      T* y = static_cast<T*>(p->out) + b * p->out_b + t * p->out_s + n * p->out_n;
      const float* x = row_as_float(xr, xf, R);
      if constexpr (kInter) {
        // Even and odd features in separate loops: one loop writing both lets GCC 12's SLP
        // vectorizer fuse the alternating sub / add into vfmaddsub (an FMA despite
        // -ffp-contract=off), and the AVX2 / AVX-512 copies would round differently.
        for (int64_t j = 0; j < h; ++j) {
          if constexpr (kBwd)
            y[2 * j] = from_float<T>(x[2 * j] * c[2 * j] + x[2 * j + 1] * s[2 * j + 1]);
          else
            y[2 * j] = from_float<T>(x[2 * j] * c[2 * j] - x[2 * j + 1] * s[2 * j]);
        }
        for (int64_t j = 0; j < h; ++j) {
          if constexpr (kBwd)
            y[2 * j + 1] = from_float<T>(x[2 * j + 1] * c[2 * j + 1] - x[2 * j] * s[2 * j]);
          else
            y[2 * j + 1] = from_float<T>(x[2 * j + 1] * c[2 * j + 1] + x[2 * j] * s[2 * j + 1]);
        }
      } else {
        for (int64_t i = 0; i < h; ++i) {
          if constexpr (kBwd)
            y[i] = from_float<T>(x[i] * c[i] + x[i + h] * s[i + h]);
          else
            y[i] = from_float<T>(x[i] * c[i] - x[i + h] * s[i]);
        }
        for (int64_t i = 0; i < h; ++i) {
          if constexpr (kBwd)
            y[i + h] = from_float<T>(x[i + h] * c[i + h] - x[i] * s[i]);
          else
            y[i + h] = from_float<T>(x[i + h] * c[i + h] + x[i] * s[i + h]);
        }
      }
      if (D > R) std::memcpy(y + R, xr + R, static_cast<size_t>(D - R) * sizeof(T));
    }
  }
};

template <typename T, typename C, bool kInter, bool kBwd>
void rope_rows(const RopeProblem& p, Scratch& s, const OutRows& out) {
  parallel_rows<T>(p.rows, row_grain(p.D), s.tasks, {out}, [&](int64_t c, int64_t r0, int64_t r1) {
    run_best<RopeRows<T, C, kInter, kBwd>>(&p, s.task(c), r0, r1);
  });
}

// out as rows of one stride (for parallel_rows' huge-page hint), or no rows when it is strided.
OutRows out_rows(const RopeProblem& p) {
  const int64_t inner = p.bhsd ? p.S : p.N, outer = p.bhsd ? p.N : p.S;
  const int64_t s_inner = p.bhsd ? p.out_s : p.out_n, s_outer = p.bhsd ? p.out_n : p.out_s;
  const bool dense = (inner <= 1 || s_inner == p.D) && (outer <= 1 || s_outer == inner * p.D) &&
                     (p.B <= 1 || p.out_b == outer * inner * p.D);
  return dense ? OutRows{p.out, p.D, p.D} : OutRows{nullptr, 0, 0};
}

template <typename T, typename C>
void rope_typed(const RopeProblem& p, Scratch& s) {
  const OutRows out = out_rows(p);
  if (p.interleaved)
    p.backward ? rope_rows<T, C, true, true>(p, s, out) : rope_rows<T, C, true, false>(p, s, out);
  else
    p.backward ? rope_rows<T, C, false, true>(p, s, out) : rope_rows<T, C, false, false>(p, s, out);
}

fuselet_status run(const RopeProblem& p) {
  if (p.rows == 0) return ok();
  const int64_t tasks = parallel_chunks(p.rows, row_grain(p.D));
  return with_scratch("cos", tasks, 3, p.R, [&](Scratch& s) {
    dispatch(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (p.cs_dtype == FUSELET_FLOAT32)
        rope_typed<T, float>(p, s);
      else
        rope_typed<T, T>(p, s);
    });
  });
}

}  // namespace
}  // namespace fuselet

namespace fuselet {
namespace {

// Every host entry point: the checks, then the kernels (the old entry points: no K dim).
fuselet_status entry(const char* name, const fuselet_tensor* in, const fuselet_tensor* cos, const fuselet_tensor* sin,
                     const int64_t* sections, int32_t n_sections, uint32_t flags, fuselet_tensor* out, bool backward) {
  return guarded(name, [&] {
    RopeProblem p;
    if (fuselet_status s = check_rope(in, backward ? "dy" : "x", cos, sin, sections, n_sections, flags, out,
                                      backward ? "dx" : "y", backward, &p))
      return s;
    return run(p);
  });
}

}  // namespace
}  // namespace fuselet

extern "C" {

fuselet_status fuselet_rope_fwd(const fuselet_tensor* x, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                uint32_t flags, fuselet_tensor* y) {
  return fuselet::entry("fuselet_rope_fwd", x, cos, sin, nullptr, 0, flags, y, false);
}

fuselet_status fuselet_rope_bwd(const fuselet_tensor* dy, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                uint32_t flags, fuselet_tensor* dx) {
  return fuselet::entry("fuselet_rope_bwd", dy, cos, sin, nullptr, 0, flags, dx, true);
}

fuselet_status fuselet_rope_sections_fwd(const fuselet_tensor* x, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                         const int64_t* sections, int32_t n_sections, uint32_t flags,
                                         fuselet_tensor* y) {
  return fuselet::entry("fuselet_rope_sections_fwd", x, cos, sin, sections, n_sections, flags, y, false);
}

fuselet_status fuselet_rope_sections_bwd(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                         const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections,
                                         uint32_t flags, fuselet_tensor* dx) {
  return fuselet::entry("fuselet_rope_sections_bwd", dy, cos, sin, sections, n_sections, flags, dx, true);
}

#ifndef FUSELET_WITH_CUDA
fuselet_status fuselet_rope_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*, uint32_t,
                                     fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_rope_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*, uint32_t,
                                     fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_rope_sections_fwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                              const int64_t*, int32_t, uint32_t, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
fuselet_status fuselet_rope_sections_bwd_cuda(const fuselet_tensor*, const fuselet_tensor*, const fuselet_tensor*,
                                              const int64_t*, int32_t, uint32_t, fuselet_tensor*, void*) {
  return fuselet::no_cuda();
}
#endif

}  // extern "C"
