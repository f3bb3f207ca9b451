// Argument checking shared by the CPU and CUDA rotary-embedding entry points, and the
// fuselet_rope_*_check functions of the C ABI (the same checks of the inputs and options).
#include "rope_check.h"

#include <cinttypes>
#include <cstdio>

namespace fuselet {

namespace {

constexpr uint32_t kKnownFlags =
    FUSELET_ROPE_INTERLEAVED | FUSELET_ROPE_BHSD | FUSELET_ROPE_PAIR_TABLE | FUSELET_ROPE_SECTIONS_INTERLEAVED;

// Checks a strided view: check_header (non-null, 0..8 dims, float dtype, sizes >= 0, strides
// >= 0 where a dim has more than one element, every element and byte offset within int64); with
// Layout::kKernel also last stride 1 and data non-null when there are elements.
fuselet_status check_view(const fuselet_tensor* t, const char* name, Layout layout = Layout::kKernel) {
  int64_t numel = 0;
  if (fuselet_status s = check_header(t, name, &numel)) return s;
  if (numel == 0 || layout == Layout::kAny) return FUSELET_OK;
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

// The inputs and options: x (dy in the backward: `in_name`), cos, sin, sections, flags.
fuselet_status inputs(const fuselet_tensor* in, const char* in_name, const fuselet_tensor* cos,
                      const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections, uint32_t flags,
                      bool backward, Layout layout, RopeProblem* p) {
  char buf[160], buf2[160];
  if (fuselet_status s = check_view(in, in_name, layout)) return s;
  if (flags & ~kKnownFlags)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "flags: unknown bits 0x%x (known: FUSELET_ROPE_INTERLEAVED, FUSELET_ROPE_BHSD, "
                "FUSELET_ROPE_PAIR_TABLE, FUSELET_ROPE_SECTIONS_INTERLEAVED)",
                static_cast<unsigned>(flags & ~kKnownFlags));
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  if (in->ndim != 3 && in->ndim != 4)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected shape %s (flags %s FUSELET_ROPE_BHSD), got shape %s",
                in_name, bhsd ? "[B, N, S, D] or [N, S, D]" : "[B, S, N, D] or [S, N, D]", bhsd ? "with" : "without",
                shape_string(in, buf, sizeof buf));
  const int32_t o = in->ndim - 3;  // offset of the (S, N) / (N, S) dims
  const int32_t ds = o + (bhsd ? 1 : 0), dn = o + (bhsd ? 0 : 1);
  p->dtype = in->dtype;
  p->interleaved = flags & FUSELET_ROPE_INTERLEAVED;
  p->pair_table = flags & FUSELET_ROPE_PAIR_TABLE;
  p->sections_interleaved = flags & FUSELET_ROPE_SECTIONS_INTERLEAVED;
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

  if (fuselet_status s = check_view(cos, "cos", layout)) return s;
  if (fuselet_status s = check_view(sin, "sin", layout)) return s;
  if (cos->dtype != FUSELET_FLOAT32 && cos->dtype != in->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected dtype %s (the dtype of %s)%s, got %s",
                dtype_name(in->dtype), in_name, in->dtype == FUSELET_FLOAT32 ? "" : " or float32",
                dtype_name(cos->dtype));
  if (sin->dtype != cos->dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "sin: expected dtype %s (the dtype of cos), got %s",
                dtype_name(cos->dtype), dtype_name(sin->dtype));
  if (n_sections < 0 || n_sections > FUSELET_ROPE_MAX_SECTIONS || (n_sections == 0 && sections != nullptr))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "sections: expected 1 to %d sections (one per table), got %d",
                FUSELET_ROPE_MAX_SECTIONS, static_cast<int>(n_sections));
  if (n_sections > 0 && sections == nullptr)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "sections: NULL with n_sections %d", static_cast<int>(n_sections));
  const int32_t kd = n_sections > 0 ? 1 : 0;  // cos / sin: the K dim
  if (!kd && p->sections_interleaved)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "flags: FUSELET_ROPE_SECTIONS_INTERLEAVED needs sections (got sections=NULL)");
  const char* w = p->pair_table ? "R/2" : "R";
  if (cos->ndim != 2 + kd && !(cos->ndim == 3 + kd && o == 1)) {
    char names[96];
    if (kd)
      std::snprintf(names, sizeof names, o ? "[K, S, %s] or [K, B, S, %s]" : "[K, S, %s] (x has no batch dim)", w, w);
    else
      std::snprintf(names, sizeof names, o ? "[S, %s] or [B, S, %s]" : "[S, %s] (x has no batch dim)", w, w);
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected shape %s, got shape %s", names,
                shape_string(cos, buf, sizeof buf));
  }
  if (kd && cos->shape[0] != n_sections)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected %d tables (K, one per section), got shape %s",
                static_cast<int>(n_sections), shape_string(cos, buf, sizeof buf));
  const int32_t co = cos->ndim - 2;  // cos / sin: the S dim
  const int64_t width = cos->shape[co + 1];
  if (p->pair_table) {
    p->R = width <= p->D ? 2 * width : p->D + 1;  // no overflow; any R > D is refused
    if (p->R < 2 || p->R > p->D)
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D=%" PRId64
                  "], got shape %s",
                  p->D, shape_string(cos, buf, sizeof buf));
  } else {
    p->R = width;
    if (p->R < 2 || p->R > p->D || p->R % 2 != 0)
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "cos: the rotary dim R (last dimension) must be even and in [2, D=%" PRId64 "], got shape %s", p->D,
                  shape_string(cos, buf, sizeof buf));
  }
  if (cos->shape[co] != p->S)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected %" PRId64 " positions (S, dim %d of %s %s), got shape %s",
                p->S, static_cast<int>(ds), in_name, shape_string(in, buf2, sizeof buf2),
                shape_string(cos, buf, sizeof buf));
  const bool per_seq = co > kd;
  if (per_seq && cos->shape[kd] != p->B)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "cos: expected a batch of %" PRId64 " (B, dim 0 of %s %s), got shape %s",
                p->B, in_name, shape_string(in, buf2, sizeof buf2), shape_string(cos, buf, sizeof buf));
  if (!same_shape(sin, cos))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "sin: expected shape %s (the shape of cos), got %s",
                shape_string(cos, buf, sizeof buf), shape_string(sin, buf2, sizeof buf2));
  p->K = kd ? n_sections : 1;
  if (kd) {
    const int64_t pairs = p->R / 2;
    int64_t sum = 0;
    for (int32_t k = 0; k < n_sections; ++k) {
      if (sections[k] < 0)
        return fail(FUSELET_ERR_INVALID_ARGUMENT, "sections: expected each >= 0, got %" PRId64 " (section %d)",
                    sections[k], static_cast<int>(k));
      sum += sections[k] > pairs ? pairs + 1 : sections[k];  // no overflow; any sum > pairs is refused
    }
    if (sum != pairs) {
      int64_t given = 0;  // the sum as given where it fits, for the message
      bool fits = true;
      for (int32_t k = 0; k < n_sections; ++k)
        if (__builtin_add_overflow(given, sections[k], &given)) fits = false;
      if (fits)
        return fail(FUSELET_ERR_INVALID_ARGUMENT,
                    "sections: expected a sum of %" PRId64 " (R/2, the rotating pairs), got %" PRId64, pairs, given);
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "sections: expected a sum of %" PRId64 " (R/2, the rotating pairs), got more", pairs);
    }
    for (int32_t k = 0; k < n_sections; ++k) {
      if (p->sections_interleaved) {
        if (k > 0 && sections[k] > 0 && n_sections * (sections[k] - 1) + k >= pairs)
          return fail(FUSELET_ERR_INVALID_ARGUMENT,
                      "sections: interleaved section %d reads pairs %d, %d, ... up to %" PRId64
                      ", beyond the R/2 = %" PRId64 " pairs (K * (s_k - 1) + k < R/2)",
                      static_cast<int>(k), static_cast<int>(k), static_cast<int>(k + n_sections),
                      n_sections * (sections[k] - 1) + k, pairs);
        p->bound[k] = n_sections * sections[k];
      } else {
        p->bound[k] = (k ? p->bound[k - 1] : 0) + sections[k];
      }
    }
  }
  p->direct = !p->pair_table && p->K == 1;
  p->cs_dtype = cos->dtype;
  p->cos = cos->data;
  p->sin = sin->data;
  p->cos_k = kd ? stride_of(cos, 0) : 0;
  p->sin_k = kd ? stride_of(sin, 0) : 0;
  p->cos_b = per_seq ? stride_of(cos, kd) : 0;
  p->cos_s = stride_of(cos, co);
  p->sin_b = per_seq ? stride_of(sin, kd) : 0;
  p->sin_s = stride_of(sin, co);
  // No overflow: a view of no elements has no rows (B * S alone may overflow when N is 0), and
  // otherwise x holds rows * D elements, D >= 1, a count check_view found to fit.
  p->rows = p->B == 0 || p->S == 0 || p->N == 0 ? 0 : p->B * p->S * p->N;
  return FUSELET_OK;
}

}  // namespace

// The checks of the inputs and options alone (the `_check` functions).
fuselet_status check_rope_inputs(const char* entry, const fuselet_tensor* in, const char* in_name,
                                 const fuselet_tensor* cos, const fuselet_tensor* sin, const int64_t* sections,
                                 int32_t n_sections, uint32_t flags, bool backward) {
  return guarded(entry, [&] {
    RopeProblem p;
    if (fuselet_status s = inputs(in, in_name, cos, sin, sections, n_sections, flags, backward, Layout::kAny, &p))
      return s;
    return ok();
  });
}

fuselet_status check_rope(const fuselet_tensor* in, const char* in_name, const fuselet_tensor* cos,
                          const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections, uint32_t flags,
                          fuselet_tensor* out, const char* out_name, bool backward, RopeProblem* p) {
  if (fuselet_status s = inputs(in, in_name, cos, sin, sections, n_sections, flags, backward, Layout::kKernel, p))
    return s;
  char buf[160], buf2[160];
  const int32_t o = in->ndim - 3;
  const int32_t ds = o + (p->bhsd ? 1 : 0), dn = o + (p->bhsd ? 0 : 1);
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
  return ok();
}

}  // namespace fuselet

extern "C" {

fuselet_status fuselet_rope_fwd_check(const fuselet_tensor* x, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                      uint32_t flags) {
  return fuselet::check_rope_inputs("fuselet_rope_fwd_check", x, "x", cos, sin, nullptr, 0, flags, false);
}

fuselet_status fuselet_rope_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* cos, const fuselet_tensor* sin,
                                      uint32_t flags) {
  return fuselet::check_rope_inputs("fuselet_rope_bwd_check", dy, "dy", cos, sin, nullptr, 0, flags, true);
}

fuselet_status fuselet_rope_sections_fwd_check(const fuselet_tensor* x, const fuselet_tensor* cos,
                                               const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections,
                                               uint32_t flags) {
  return fuselet::check_rope_inputs("fuselet_rope_sections_fwd_check", x, "x", cos, sin, sections, n_sections, flags,
                                    false);
}

fuselet_status fuselet_rope_sections_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                               const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections,
                                               uint32_t flags) {
  return fuselet::check_rope_inputs("fuselet_rope_sections_bwd_check", dy, "dy", cos, sin, sections, n_sections, flags,
                                    true);
}

}  // extern "C"
