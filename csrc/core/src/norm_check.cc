// Argument checking shared by the CPU and CUDA normalization entry points, and the
// fuselet_*norm*_check functions of the C ABI (the same checks of the inputs and options).
#include "norm_check.h"

#include <cinttypes>
#include <cmath>

namespace fuselet {
namespace {

// The norm's input: x, or residual_out in the residual add + RMSNorm backward (`xn`, the name
// the messages give it).

// `t` must be read as rows exactly like x (same dtype, same R and H).
fuselet_status same_rows(const fuselet_tensor* t, const char* name, const char* xn, const Rows& x, fuselet_dtype dtype,
                         Rows* out, Layout layout = Layout::kKernel) {
  if (fuselet_status s = as_rows(t, name, out, layout)) return s;
  if (t->dtype != dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of %s), got %s", name,
                dtype_name(dtype), xn, dtype_name(t->dtype));
  if (out->rows != x.rows || out->hidden != x.hidden)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: expected %" PRId64 " rows of %" PRId64 " elements like %s, got %" PRId64 " rows of %" PRId64,
                name, x.rows, x.hidden, xn, out->rows, out->hidden);
  return FUSELET_OK;
}

fuselet_status check_x(const fuselet_tensor* x, const char* xn, Rows* rx, Layout layout) {
  if (fuselet_status s = as_rows(x, xn, rx, layout)) return s;
  if (rx->hidden == 0) {
    char buf[160];
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the hidden size (last dimension) must be > 0, got shape %s", xn,
                shape_string(x, buf, sizeof buf));
  }
  if (rx->hidden > INT32_MAX)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the hidden size must be < 2^31, got %" PRId64, xn, rx->hidden);
  return FUSELET_OK;
}

// A parameter vector [H] (weight, bias or their gradients) of x [..., H] (checked, named `xn`),
// NULL allowed (then *out is NULL). Its dtype must be `*pdtype` when that is set (>= 0: a
// parameter seen before, named `like`), else x's dtype or float32; it then sets `*pdtype`.
fuselet_status check_param(const fuselet_tensor* t, const char* name, const fuselet_tensor* x, const char* xn,
                           int* pdtype, const char* like, void** out, Layout layout = Layout::kKernel) {
  *out = nullptr;
  if (t == nullptr) return FUSELET_OK;
  const fuselet_dtype x_dtype = x->dtype;
  const int64_t hidden = x->shape[x->ndim - 1];
  if (fuselet_status s = check_ndim(t, name)) return s;
  if (t->ndim != 1 || t->shape[0] != hidden) {
    char xs[160], ts[160];
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: expected shape [%" PRId64 "] to match the last dimension of %s %s, got %s", name, hidden, xn,
                shape_string(x, xs, sizeof xs), shape_string(t, ts, sizeof ts));
  }
  const int code = dtype_code(t);
  char buf[32];
  const char* got = dtype_string(code, buf, sizeof buf);
  if (!is_float_dtype(code))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype float32, float16 or bfloat16, got %s", name, got);
  if (*pdtype >= 0 && code != *pdtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of %s), got %s", name,
                dtype_name(static_cast<fuselet_dtype>(*pdtype)), like, got);
  if (*pdtype < 0 && code != x_dtype && code != FUSELET_FLOAT32)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of %s)%s, got %s", name,
                dtype_name(x_dtype), xn, x_dtype == FUSELET_FLOAT32 ? "" : " or float32", got);
  if (fuselet_status s = as_vector(t, name, t->dtype, hidden, out, layout)) return s;
  *pdtype = t->dtype;
  return FUSELET_OK;
}

// flags: known bits only (FUSELET_NORM_GATE_FIRST for the gated RMSNorm only); zero-centered
// gamma needs a weight. Sets p->w_offset and p->gate_first.
fuselet_status check_flags(uint32_t flags, const fuselet_tensor* weight, bool gated, NormProblem* p) {
  const uint32_t known = static_cast<uint32_t>(FUSELET_NORM_ZERO_CENTERED_GAMMA) |
                         (gated ? static_cast<uint32_t>(FUSELET_NORM_GATE_FIRST) : 0u);
  if (flags & ~known)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "flags: unknown bits 0x%x (known: FUSELET_NORM_ZERO_CENTERED_GAMMA%s)",
                static_cast<unsigned>(flags & ~known), gated ? ", FUSELET_NORM_GATE_FIRST" : "");
  const bool zero_centered = flags & FUSELET_NORM_ZERO_CENTERED_GAMMA;
  if (zero_centered && weight == nullptr)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA scales by (1 + weight) and needs a weight, got weight=NULL");
  p->w_offset = zero_centered ? 1.f : 0.f;
  p->gate_first = flags & FUSELET_NORM_GATE_FIRST;
  return FUSELET_OK;
}

// group_size: 0 (the whole row) or a divisor of the hidden size. Sets p->group.
fuselet_status check_group(int64_t group_size, const char* xn, NormProblem* p) {
  if (group_size < 0 || (group_size > 0 && p->hidden % group_size != 0))
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "group_size: expected 0 (the whole row) or a divisor of %" PRId64
                " (the hidden size of %s), got %" PRId64,
                p->hidden, xn, group_size);
  p->group = group_size > 0 ? group_size : p->hidden;
  return FUSELET_OK;
}

// rstd: one float32 per group of each row.
int64_t stat_count(const NormProblem& p) { return p.rows * (p.hidden / p.group); }

// The inputs and options of a forward: x, weight, bias (NULL for RMSNorm), flags, eps. Sets
// *pdtype as check_param does (-1: no parameter).
fuselet_status fwd_inputs(const fuselet_tensor* x, const fuselet_tensor* weight, const fuselet_tensor* bias, float eps,
                          uint32_t flags, Layout layout, NormProblem* p, Rows* rx, bool gated = false) {
  if (fuselet_status s = check_x(x, "x", rx, layout)) return s;
  p->dtype = x->dtype;
  p->rows = rx->rows;
  p->hidden = p->group = rx->hidden;
  int pdtype = -1;
  void* w = nullptr;
  if (fuselet_status s = check_param(weight, "weight", x, "x", &pdtype, "", &w, layout)) return s;
  void* b = nullptr;
  if (fuselet_status s = check_param(bias, "bias", x, "x", &pdtype, "weight", &b, layout)) return s;
  if (fuselet_status s = check_flags(flags, weight, gated, p)) return s;
  p->param_dtype = pdtype >= 0 ? static_cast<fuselet_dtype>(pdtype) : x->dtype;
  if (!(std::isfinite(eps) && eps > 0.f)) {
    char buf[32];
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "eps: expected a finite number > 0, got %s",
                float_string(eps, buf, sizeof buf));
  }
  p->eps = eps;
  p->x = rx->data;
  p->x_stride = rx->row_stride;
  p->weight = w;
  p->bias = b;
  return FUSELET_OK;
}

// A forward's outputs: y, mean (NULL for RMSNorm), rstd.
fuselet_status fwd_outputs(const fuselet_tensor* x, const Rows& rx, fuselet_tensor* y, fuselet_tensor* mean,
                           fuselet_tensor* rstd, bool layer_norm, NormProblem* p) {
  Rows ry;
  if (fuselet_status s = same_rows(y, "y", "x", rx, x->dtype, &ry)) return s;
  void* m = nullptr;
  if (layer_norm)
    if (fuselet_status s = as_vector(mean, "mean", FUSELET_FLOAT32, rx.rows, &m)) return s;
  void* r = nullptr;
  if (fuselet_status s = as_vector(rstd, "rstd", FUSELET_FLOAT32, stat_count(*p), &r)) return s;
  p->y = ry.data;
  p->y_stride = ry.row_stride;
  p->mean = static_cast<float*>(m);
  p->rstd = static_cast<float*>(r);
  return FUSELET_OK;
}

// The inputs and options of a backward: dy, x (named xn), weight, bias (the parameter whose gradient dbias
// is: only the _check function takes it, NULL elsewhere), mean (NULL for RMSNorm), rstd, flags.
fuselet_status bwd_inputs(const fuselet_tensor* dy, const fuselet_tensor* x, const char* xn,
                          const fuselet_tensor* weight, const fuselet_tensor* bias, const fuselet_tensor* mean,
                          const fuselet_tensor* rstd, uint32_t flags, bool layer_norm, Layout layout, NormProblem* p,
                          Rows* rx, int* pdtype, bool gated = false, int64_t group_size = 0) {
  Rows rdy;
  if (fuselet_status s = check_x(x, xn, rx, layout)) return s;
  p->dtype = x->dtype;
  p->rows = rx->rows;
  p->hidden = p->group = rx->hidden;
  if (fuselet_status s = same_rows(dy, "dy", xn, *rx, x->dtype, &rdy, layout)) return s;
  *pdtype = -1;
  void* w = nullptr;
  if (fuselet_status s = check_param(weight, "weight", x, xn, pdtype, "", &w, layout)) return s;
  void* b = nullptr;
  if (fuselet_status s = check_param(bias, "bias", x, xn, pdtype, "weight", &b, layout)) return s;
  if (fuselet_status s = check_flags(flags, weight, gated, p)) return s;
  if (gated)
    if (fuselet_status s = check_group(group_size, xn, p)) return s;
  void* m = nullptr;
  if (layer_norm)
    if (fuselet_status s = as_vector(mean, "mean", FUSELET_FLOAT32, rx->rows, &m, layout)) return s;
  void* r = nullptr;
  if (fuselet_status s = as_vector(rstd, "rstd", FUSELET_FLOAT32, stat_count(*p), &r, layout)) return s;
  p->param_dtype = *pdtype >= 0 ? static_cast<fuselet_dtype>(*pdtype) : x->dtype;
  p->x = rx->data;
  p->x_stride = rx->row_stride;
  p->dy = rdy.data;
  p->dy_stride = rdy.row_stride;
  p->weight = w;
  p->mean = static_cast<float*>(m);
  p->rstd = static_cast<float*>(r);
  return FUSELET_OK;
}

// A backward's outputs: dx, dweight (exactly when weight), dbias (NULL for RMSNorm or not asked).
fuselet_status bwd_outputs(const fuselet_tensor* x, const char* xn, const Rows& rx, const fuselet_tensor* weight,
                           fuselet_tensor* dx, fuselet_tensor* dweight, fuselet_tensor* dbias, bool layer_norm,
                           int pdtype, NormProblem* p) {
  Rows rdx;
  if (fuselet_status s = same_rows(dx, "dx", xn, rx, x->dtype, &rdx)) return s;
  if ((weight == nullptr) != (dweight == nullptr))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, weight ? "dweight: expected a tensor (weight is given), got NULL"
                                                     : "dweight: expected NULL (weight is NULL), got a tensor");
  void* dw = nullptr;
  if (fuselet_status s = check_param(dweight, "dweight", x, xn, &pdtype, "weight", &dw)) return s;
  void* db = nullptr;
  if (layer_norm)
    if (fuselet_status s = check_param(dbias, "dbias", x, xn, &pdtype, "weight", &db)) return s;
  p->param_dtype = pdtype >= 0 ? static_cast<fuselet_dtype>(pdtype) : x->dtype;
  p->dx = rdx.data;
  p->dx_stride = rdx.row_stride;
  p->dweight = dw;
  p->dbias = db;
  return FUSELET_OK;
}

// The inputs and options of a residual add + RMSNorm forward.
fuselet_status add_fwd_inputs(const fuselet_tensor* x, const fuselet_tensor* residual, const fuselet_tensor* weight,
                              float eps, uint32_t flags, Layout layout, NormProblem* p, Rows* rx) {
  if (fuselet_status s = fwd_inputs(x, weight, nullptr, eps, flags, layout, p, rx)) return s;
  Rows rr;
  if (fuselet_status s = same_rows(residual, "residual", "x", *rx, x->dtype, &rr, layout)) return s;
  p->res = rr.data;
  p->res_stride = rr.row_stride;
  return FUSELET_OK;
}

// The inputs and options of a residual add + RMSNorm backward (residual_out is the norm's input).
fuselet_status add_bwd_inputs(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                              const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                              const fuselet_tensor* rstd, uint32_t flags, Layout layout, NormProblem* p, Rows* rx,
                              int* pdtype) {
  if (fuselet_status s = bwd_inputs(dy, residual_out, "residual_out", weight, nullptr, nullptr, rstd, flags, false,
                                    layout, p, rx, pdtype))
    return s;
  Rows rd;
  if (fuselet_status s =
          same_rows(dresidual_out, "dresidual_out", "residual_out", *rx, residual_out->dtype, &rd, layout))
    return s;
  p->dres = rd.data;
  p->dres_stride = rd.row_stride;
  return FUSELET_OK;
}

// The inputs and options of a gated RMSNorm forward.
fuselet_status gated_fwd_inputs(const fuselet_tensor* x, const fuselet_tensor* z, const fuselet_tensor* weight,
                                float eps, int64_t group_size, uint32_t flags, Layout layout, NormProblem* p,
                                Rows* rx) {
  if (fuselet_status s = fwd_inputs(x, weight, nullptr, eps, flags, layout, p, rx, true)) return s;
  Rows rz;
  if (fuselet_status s = same_rows(z, "z", "x", *rx, x->dtype, &rz, layout)) return s;
  if (fuselet_status s = check_group(group_size, "x", p)) return s;
  p->z = rz.data;
  p->z_stride = rz.row_stride;
  return FUSELET_OK;
}

// The inputs and options of a gated RMSNorm backward.
fuselet_status gated_bwd_inputs(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* z,
                                const fuselet_tensor* weight, const fuselet_tensor* rstd, int64_t group_size,
                                uint32_t flags, Layout layout, NormProblem* p, Rows* rx, int* pdtype) {
  if (fuselet_status s = bwd_inputs(dy, x, "x", weight, nullptr, nullptr, rstd, flags, false, layout, p, rx, pdtype,
                                    true, group_size))
    return s;
  Rows rz;
  if (fuselet_status s = same_rows(z, "z", "x", *rx, x->dtype, &rz, layout)) return s;
  p->z = rz.data;
  p->z_stride = rz.row_stride;
  return FUSELET_OK;
}

}  // namespace

fuselet_status check_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight, const fuselet_tensor* bias,
                              float eps, uint32_t flags, fuselet_tensor* y, fuselet_tensor* mean, fuselet_tensor* rstd,
                              bool layer_norm, NormProblem* p) {
  Rows rx;
  if (fuselet_status s = fwd_inputs(x, weight, layer_norm ? bias : nullptr, eps, flags, Layout::kKernel, p, &rx))
    return s;
  if (fuselet_status s = fwd_outputs(x, rx, y, mean, rstd, layer_norm, p)) return s;
  return ok();
}

fuselet_status check_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                              const fuselet_tensor* mean, const fuselet_tensor* rstd, uint32_t flags,
                              fuselet_tensor* dx, fuselet_tensor* dweight, fuselet_tensor* dbias, bool layer_norm,
                              NormProblem* p) {
  Rows rx;
  int pdtype = -1;
  if (fuselet_status s =
          bwd_inputs(dy, x, "x", weight, nullptr, mean, rstd, flags, layer_norm, Layout::kKernel, p, &rx, &pdtype))
    return s;
  if (fuselet_status s = bwd_outputs(x, "x", rx, weight, dx, dweight, dbias, layer_norm, pdtype, p)) return s;
  return ok();
}

fuselet_status check_add_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* residual,
                                  const fuselet_tensor* weight, float eps, uint32_t flags, fuselet_tensor* y,
                                  fuselet_tensor* residual_out, fuselet_tensor* rstd, NormProblem* p) {
  Rows rx, rh;
  if (fuselet_status s = add_fwd_inputs(x, residual, weight, eps, flags, Layout::kKernel, p, &rx)) return s;
  if (fuselet_status s = fwd_outputs(x, rx, y, nullptr, rstd, false, p)) return s;
  if (fuselet_status s = same_rows(residual_out, "residual_out", "x", rx, x->dtype, &rh)) return s;
  p->hout = rh.data;
  p->hout_stride = rh.row_stride;
  return ok();
}

fuselet_status check_add_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                  const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                  const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                  fuselet_tensor* dweight, NormProblem* p) {
  Rows rx;
  int pdtype = -1;
  if (fuselet_status s =
          add_bwd_inputs(dy, dresidual_out, residual_out, weight, rstd, flags, Layout::kKernel, p, &rx, &pdtype))
    return s;
  if (fuselet_status s = bwd_outputs(residual_out, "residual_out", rx, weight, dx, dweight, nullptr, false, pdtype, p))
    return s;
  return ok();
}

fuselet_status check_gated_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* z, const fuselet_tensor* weight,
                                    float eps, int64_t group_size, uint32_t flags, fuselet_tensor* y,
                                    fuselet_tensor* rstd, NormProblem* p) {
  Rows rx;
  if (fuselet_status s = gated_fwd_inputs(x, z, weight, eps, group_size, flags, Layout::kKernel, p, &rx)) return s;
  if (fuselet_status s = fwd_outputs(x, rx, y, nullptr, rstd, false, p)) return s;
  return ok();
}

fuselet_status check_gated_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* z,
                                    const fuselet_tensor* weight, const fuselet_tensor* rstd, int64_t group_size,
                                    uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dz, fuselet_tensor* dweight,
                                    NormProblem* p) {
  Rows rx, rdz;
  int pdtype = -1;
  if (fuselet_status s = gated_bwd_inputs(dy, x, z, weight, rstd, group_size, flags, Layout::kKernel, p, &rx, &pdtype))
    return s;
  if (fuselet_status s = bwd_outputs(x, "x", rx, weight, dx, dweight, nullptr, false, pdtype, p)) return s;
  if (fuselet_status s = same_rows(dz, "dz", "x", rx, x->dtype, &rdz)) return s;
  p->dz = rdz.data;
  p->dz_stride = rdz.row_stride;
  return ok();
}

}  // namespace fuselet

using fuselet::Layout;
using fuselet::NormProblem;
using fuselet::Rows;

extern "C" {

fuselet_status fuselet_rms_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* weight, float eps,
                                          uint32_t flags) {
  return fuselet::guarded("fuselet_rms_norm_fwd_check", [&] {
    NormProblem p;
    Rows rx;
    if (fuselet_status s = fuselet::fwd_inputs(x, weight, nullptr, eps, flags, Layout::kAny, &p, &rx)) return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_rms_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                          const fuselet_tensor* weight, const fuselet_tensor* rstd, uint32_t flags) {
  return fuselet::guarded("fuselet_rms_norm_bwd_check", [&] {
    NormProblem p;
    Rows rx;
    int pdtype;
    if (fuselet_status s = fuselet::bwd_inputs(dy, x, "x", weight, nullptr, nullptr, rstd, flags, false, Layout::kAny,
                                               &p, &rx, &pdtype))
      return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_layer_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* weight,
                                            const fuselet_tensor* bias, float eps, uint32_t flags) {
  return fuselet::guarded("fuselet_layer_norm_fwd_check", [&] {
    NormProblem p;
    Rows rx;
    if (fuselet_status s = fuselet::fwd_inputs(x, weight, bias, eps, flags, Layout::kAny, &p, &rx)) return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_layer_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                            const fuselet_tensor* weight, const fuselet_tensor* bias,
                                            const fuselet_tensor* mean, const fuselet_tensor* rstd, uint32_t flags) {
  return fuselet::guarded("fuselet_layer_norm_bwd_check", [&] {
    NormProblem p;
    Rows rx;
    int pdtype;
    if (fuselet_status s =
            fuselet::bwd_inputs(dy, x, "x", weight, bias, mean, rstd, flags, true, Layout::kAny, &p, &rx, &pdtype))
      return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_add_rms_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* residual,
                                              const fuselet_tensor* weight, float eps, uint32_t flags) {
  return fuselet::guarded("fuselet_add_rms_norm_fwd_check", [&] {
    NormProblem p;
    Rows rx;
    if (fuselet_status s = fuselet::add_fwd_inputs(x, residual, weight, eps, flags, Layout::kAny, &p, &rx)) return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_add_rms_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                              const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                              const fuselet_tensor* rstd, uint32_t flags) {
  return fuselet::guarded("fuselet_add_rms_norm_bwd_check", [&] {
    NormProblem p;
    Rows rx;
    int pdtype;
    if (fuselet_status s = fuselet::add_bwd_inputs(dy, dresidual_out, residual_out, weight, rstd, flags, Layout::kAny,
                                                   &p, &rx, &pdtype))
      return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_gated_rms_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* z,
                                                const fuselet_tensor* weight, float eps, int64_t group_size,
                                                uint32_t flags) {
  return fuselet::guarded("fuselet_gated_rms_norm_fwd_check", [&] {
    NormProblem p;
    Rows rx;
    if (fuselet_status s = fuselet::gated_fwd_inputs(x, z, weight, eps, group_size, flags, Layout::kAny, &p, &rx))
      return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_gated_rms_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                const fuselet_tensor* z, const fuselet_tensor* weight,
                                                const fuselet_tensor* rstd, int64_t group_size, uint32_t flags) {
  return fuselet::guarded("fuselet_gated_rms_norm_bwd_check", [&] {
    NormProblem p;
    Rows rx;
    int pdtype;
    if (fuselet_status s =
            fuselet::gated_bwd_inputs(dy, x, z, weight, rstd, group_size, flags, Layout::kAny, &p, &rx, &pdtype))
      return s;
    return fuselet::ok();
  });
}

}  // extern "C"
