// Rotary position embedding on the CPU: heads (rows of D features) split across fuselet's own
// thread pool, read in place through x's strides. Math and shapes: fuselet/rope.h.
#include <cinttypes>
#include <cstring>

#include "cpu_common.h"
#include "parallel.h"
#include "rope_check.h"

namespace fuselet {

namespace {

constexpr uint32_t kKnownFlags = FUSELET_ROPE_INTERLEAVED | FUSELET_ROPE_BHSD;

// Checks a strided view: check_header (non-null, 0..8 dims, float dtype, sizes >= 0, strides
// >= 0 where a dim has more than one element, every element and byte offset within int64), last
// stride 1, data non-null when there are elements.
fuselet_status check_view(const fuselet_tensor* t, const char* name) {
  int64_t numel = 0;
  if (fuselet_status s = check_header(t, name, &numel)) return s;
  if (numel == 0) return FUSELET_OK;
  const int32_t last = t->ndim - 1;
  if (t->ndim > 0 && t->shape[last] > 1 && t->strides[last] != 1)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the last dimension must have stride 1, got stride %" PRId64, name,
                t->strides[last]);
  if (t->data == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: data pointer is NULL", name);
  return FUSELET_OK;
}

bool same_shape(const fuselet_tensor* a, const fuselet_tensor* b) {
  if (a->ndim != b->ndim) return false;
  for (int32_t d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

// The stride of dim d of t, or 0 when it has at most one element (any stride is valid there).
int64_t stride_of(const fuselet_tensor* t, int32_t d) { return t->shape[d] > 1 ? t->strides[d] : 0; }

}  // namespace

fuselet_status check_rope(const fuselet_tensor* in, const char* in_name, const fuselet_tensor* cos,
                          const fuselet_tensor* sin, uint32_t flags, fuselet_tensor* out, const char* out_name,
                          bool backward, RopeProblem* p) {
  char buf[160], buf2[160];
  if (fuselet_status s = check_view(in, in_name)) return s;
  if (flags & ~kKnownFlags)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "flags: unknown bits 0x%x (known: FUSELET_ROPE_INTERLEAVED, FUSELET_ROPE_BHSD)",
                static_cast<unsigned>(flags & ~kKnownFlags));
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  if (in->ndim != 3 && in->ndim != 4)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected shape %s or %s, got %s", in_name,
                bhsd ? "[B, N, S, D]" : "[B, S, N, D]", bhsd ? "[N, S, D]" : "[S, N, D]",
                shape_string(in, buf, sizeof buf));
  const int32_t o = in->ndim - 3;  // offset of the (S, N) / (N, S) dims
  const int32_t ds = o + (bhsd ? 1 : 0), dn = o + (bhsd ? 0 : 1);
  p->dtype = in->dtype;
  p->interleaved = flags & FUSELET_ROPE_INTERLEAVED;
  p->bhsd = bhsd;
  p->backward = backward;
  p->B = o ? in->shape[0] : 1;
  p->S = in->shape[ds];
  p->N = in->shape[dn];
  p->D = in->shape[o + 2];
  if (p->D == 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the head dim D (last dimension) must be > 0, got shape %s", in_name,
                shape_string(in, buf, sizeof buf));
  p->in = in->data;
  p->in_b = o ? stride_of(in, 0) : 0;
  p->in_s = stride_of(in, ds);
  p->in_n = stride_of(in, dn);

  if (fuselet_status s = check_view(cos, "cos")) return s;
  if (fuselet_status s = check_view(sin, "sin")) return s;
  if (cos->dtype != FUSELET_FLOAT32 && cos->dtype != in->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected dtype float32 or %s (the dtype of %s), got %s",
                dtype_name(in->dtype), in_name, dtype_name(cos->dtype));
  if (sin->dtype != cos->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "sin: expected dtype %s (the dtype of cos), got %s",
                dtype_name(cos->dtype), dtype_name(sin->dtype));
  if (cos->ndim != 2 && !(cos->ndim == 3 && o == 1))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected shape %s, got %s",
                o ? "[S, R] or [B, S, R]" : "[S, R] (x has no batch dim)", shape_string(cos, buf, sizeof buf));
  const int32_t co = cos->ndim - 2;
  p->R = cos->shape[co + 1];
  if (p->R < 2 || p->R > p->D || p->R % 2 != 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "cos: the rotary dim R (last dimension) must be even and in [2, D = %" PRId64 "], got shape %s", p->D,
                shape_string(cos, buf, sizeof buf));
  if (cos->shape[co] != p->S)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "cos: expected %" PRId64 " positions (S, dimension %d of %s), got shape %s", p->S,
                static_cast<int>(ds), in_name, shape_string(cos, buf, sizeof buf));
  if (co && cos->shape[0] != p->B)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "cos: expected a batch of %" PRId64 " (B, dimension 0 of %s), got shape %s", p->B, in_name,
                shape_string(cos, buf, sizeof buf));
  if (!same_shape(sin, cos))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "sin: expected shape %s (the shape of cos), got %s",
                shape_string(cos, buf, sizeof buf), shape_string(sin, buf2, sizeof buf2));
  p->cs_dtype = cos->dtype;
  p->cos = cos->data;
  p->sin = sin->data;
  p->cos_b = co ? stride_of(cos, 0) : 0;
  p->cos_s = stride_of(cos, co);
  p->sin_b = co ? stride_of(sin, 0) : 0;
  p->sin_s = stride_of(sin, co);

  if (fuselet_status s = check_view(out, out_name)) return s;
  if (out->dtype != in->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of %s), got %s", out_name,
                dtype_name(in->dtype), in_name, dtype_name(out->dtype));
  if (!same_shape(out, in))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected shape %s (the shape of %s), got %s", out_name,
                shape_string(in, buf, sizeof buf), in_name, shape_string(out, buf2, sizeof buf2));
  p->out = out->data;
  p->out_b = o ? stride_of(out, 0) : 0;
  p->out_s = stride_of(out, ds);
  p->out_n = stride_of(out, dn);
  // No overflow: a view of no elements has no rows (B * S alone may overflow when N is 0), and
  // otherwise x holds rows * D elements, D >= 1, a count check_view found to fit.
  p->rows = p->B == 0 || p->S == 0 || p->N == 0 ? 0 : p->B * p->S * p->N;
  return ok();
}

namespace {

using namespace cpu;  // NOLINT: the shared building blocks (cpu_common.h)

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
        c = row_as_float(static_cast<const C*>(p->cos) + b * p->cos_b + t * p->cos_s, cf, R);
        s = row_as_float(static_cast<const C*>(p->sin) + b * p->sin_b + t * p->sin_s, sf, R);
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

extern "C" {

fuselet_status fuselet_rope_fwd(const fuselet_tensor* x, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                uint32_t flags, fuselet_tensor* y) {
  return fuselet::guarded("fuselet_rope_fwd", [&] {
    fuselet::RopeProblem p;
    if (fuselet_status s = fuselet::check_rope(x, "x", cos, sin, flags, y, "y", false, &p)) return s;
    return fuselet::run(p);
  });
}

fuselet_status fuselet_rope_bwd(const fuselet_tensor* dy, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                uint32_t flags, fuselet_tensor* dx) {
  return fuselet::guarded("fuselet_rope_bwd", [&] {
    fuselet::RopeProblem p;
    if (fuselet_status s = fuselet::check_rope(dy, "dy", cos, sin, flags, dx, "dx", true, &p)) return s;
    return fuselet::run(p);
  });
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
#endif

}  // extern "C"
