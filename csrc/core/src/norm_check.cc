// Argument checking shared by the CPU and CUDA normalization entry points.
#include "norm_check.h"

#include <cinttypes>
#include <cmath>

namespace fuselet {
namespace {

// `t` must be read as rows exactly like x (same dtype, same R and H).
fuselet_status same_rows(const fuselet_tensor* t, const char* name, const Rows& x, fuselet_dtype dtype, Rows* out) {
  if (fuselet_status s = as_rows(t, name, out)) return s;
  if (t->dtype != dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of x), got %s", name,
                dtype_name(dtype), dtype_name(t->dtype));
  if (out->rows != x.rows || out->hidden != x.hidden)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: expected %" PRId64 " rows of %" PRId64 " elements like x, got %" PRId64 " rows of %" PRId64, name,
                x.rows, x.hidden, out->rows, out->hidden);
  return FUSELET_OK;
}

fuselet_status check_x(const fuselet_tensor* x, Rows* rx) {
  if (fuselet_status s = as_rows(x, "x", rx)) return s;
  if (rx->hidden == 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "x: the hidden size (last dimension) must be > 0, got 0");
  if (rx->hidden > INT32_MAX)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "x: the hidden size must be < 2^31, got %" PRId64, rx->hidden);
  return FUSELET_OK;
}

// A parameter vector [H] (weight, bias or their gradients), NULL allowed (then *out is NULL).
// Its dtype must be `*pdtype` when that is set (>= 0: a parameter seen before, named `like`),
// else x's dtype or float32; it then sets `*pdtype`.
fuselet_status check_param(const fuselet_tensor* t, const char* name, fuselet_dtype x_dtype, int64_t hidden,
                           int* pdtype, const char* like, void** out) {
  *out = nullptr;
  if (t == nullptr) return FUSELET_OK;
  if (t->ndim != 1) {
    char buf[160];
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected a 1-D tensor of %" PRId64 " elements, got shape %s", name,
                hidden, shape_string(t, buf, sizeof(buf)));
  }
  if (t->shape[0] != hidden)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected %" PRId64 " elements (the hidden size of x), got %" PRId64,
                name, hidden, t->shape[0]);
  const int code = dtype_code(t);
  const char* got = is_float_dtype(code) ? dtype_name(static_cast<fuselet_dtype>(code)) : "an unknown dtype code";
  if (*pdtype >= 0 && code != *pdtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of %s), got %s", name,
                dtype_name(static_cast<fuselet_dtype>(*pdtype)), like, got);
  if (*pdtype < 0 && code != x_dtype && code != FUSELET_FLOAT32)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of x)%s, got %s", name,
                dtype_name(x_dtype), x_dtype == FUSELET_FLOAT32 ? "" : " or float32", got);
  if (fuselet_status s = as_vector(t, name, t->dtype, hidden, out)) return s;
  *pdtype = t->dtype;
  return FUSELET_OK;
}

// flags: known bits only; zero-centered gamma needs a weight. Sets p->w_offset.
fuselet_status check_flags(uint32_t flags, const fuselet_tensor* weight, NormProblem* p) {
  if (flags & ~static_cast<uint32_t>(FUSELET_NORM_ZERO_CENTERED_GAMMA))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "flags: unknown bits 0x%x (known: FUSELET_NORM_ZERO_CENTERED_GAMMA)",
                static_cast<unsigned>(flags & ~static_cast<uint32_t>(FUSELET_NORM_ZERO_CENTERED_GAMMA)));
  const bool zero_centered = flags & FUSELET_NORM_ZERO_CENTERED_GAMMA;
  if (zero_centered && weight == nullptr)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA needs a weight, got NULL");
  p->w_offset = zero_centered ? 1.f : 0.f;
  return FUSELET_OK;
}

}  // namespace

fuselet_status check_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight, const fuselet_tensor* bias,
                              float eps, uint32_t flags, fuselet_tensor* y, fuselet_tensor* mean, fuselet_tensor* rstd,
                              bool layer_norm, NormProblem* p) {
  Rows rx, ry;
  if (fuselet_status s = check_x(x, &rx)) return s;
  p->dtype = x->dtype;
  p->rows = rx.rows;
  p->hidden = rx.hidden;
  int pdtype = -1;
  void* w = nullptr;
  if (fuselet_status s = check_param(weight, "weight", x->dtype, rx.hidden, &pdtype, "", &w)) return s;
  void* b = nullptr;
  if (layer_norm)
    if (fuselet_status s = check_param(bias, "bias", x->dtype, rx.hidden, &pdtype, "weight", &b)) return s;
  if (fuselet_status s = check_flags(flags, weight, p)) return s;
  p->param_dtype = pdtype >= 0 ? static_cast<fuselet_dtype>(pdtype) : x->dtype;
  if (!(std::isfinite(eps) && eps > 0.f))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "eps: expected a finite number > 0, got %g", static_cast<double>(eps));
  if (fuselet_status s = same_rows(y, "y", rx, x->dtype, &ry)) return s;
  void* m = nullptr;
  if (layer_norm)
    if (fuselet_status s = as_vector(mean, "mean", FUSELET_FLOAT32, rx.rows, &m)) return s;
  void* r = nullptr;
  if (fuselet_status s = as_vector(rstd, "rstd", FUSELET_FLOAT32, rx.rows, &r)) return s;
  p->eps = eps;
  p->x = rx.data;
  p->x_stride = rx.row_stride;
  p->y = ry.data;
  p->y_stride = ry.row_stride;
  p->weight = w;
  p->bias = b;
  p->mean = static_cast<float*>(m);
  p->rstd = static_cast<float*>(r);
  return ok();
}

fuselet_status check_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                              const fuselet_tensor* mean, const fuselet_tensor* rstd, uint32_t flags,
                              fuselet_tensor* dx, fuselet_tensor* dweight, fuselet_tensor* dbias, bool layer_norm,
                              NormProblem* p) {
  Rows rx, rdy, rdx;
  if (fuselet_status s = check_x(x, &rx)) return s;
  p->dtype = x->dtype;
  p->rows = rx.rows;
  p->hidden = rx.hidden;
  if (fuselet_status s = same_rows(dy, "dy", rx, x->dtype, &rdy)) return s;
  int pdtype = -1;
  void* w = nullptr;
  if (fuselet_status s = check_param(weight, "weight", x->dtype, rx.hidden, &pdtype, "", &w)) return s;
  if (fuselet_status s = check_flags(flags, weight, p)) return s;
  void* m = nullptr;
  if (layer_norm)
    if (fuselet_status s = as_vector(mean, "mean", FUSELET_FLOAT32, rx.rows, &m)) return s;
  void* r = nullptr;
  if (fuselet_status s = as_vector(rstd, "rstd", FUSELET_FLOAT32, rx.rows, &r)) return s;
  if (fuselet_status s = same_rows(dx, "dx", rx, x->dtype, &rdx)) return s;
  if ((weight == nullptr) != (dweight == nullptr))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, weight ? "dweight: expected a tensor (weight is given), got NULL"
                                                     : "dweight: expected NULL (weight is NULL), got a tensor");
  void* dw = nullptr;
  if (fuselet_status s = check_param(dweight, "dweight", x->dtype, rx.hidden, &pdtype, "weight", &dw)) return s;
  void* db = nullptr;
  if (layer_norm)
    if (fuselet_status s = check_param(dbias, "dbias", x->dtype, rx.hidden, &pdtype, "weight", &db)) return s;
  p->param_dtype = pdtype >= 0 ? static_cast<fuselet_dtype>(pdtype) : x->dtype;
  p->x = rx.data;
  p->x_stride = rx.row_stride;
  p->dy = rdy.data;
  p->dy_stride = rdy.row_stride;
  p->dx = rdx.data;
  p->dx_stride = rdx.row_stride;
  p->weight = w;
  p->mean = static_cast<float*>(m);
  p->rstd = static_cast<float*>(r);
  p->dweight = dw;
  p->dbias = db;
  return ok();
}

fuselet_status check_add_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* residual,
                                  const fuselet_tensor* weight, float eps, uint32_t flags, fuselet_tensor* y,
                                  fuselet_tensor* residual_out, fuselet_tensor* rstd, NormProblem* p) {
  if (fuselet_status s = check_norm_fwd(x, weight, nullptr, eps, flags, y, nullptr, rstd, false, p)) return s;
  Rows rx, rr, rh;
  if (fuselet_status s = as_rows(x, "x", &rx)) return s;
  if (fuselet_status s = same_rows(residual, "residual", rx, x->dtype, &rr)) return s;
  if (fuselet_status s = same_rows(residual_out, "residual_out", rx, x->dtype, &rh)) return s;
  p->res = rr.data;
  p->res_stride = rr.row_stride;
  p->hout = rh.data;
  p->hout_stride = rh.row_stride;
  return ok();
}

fuselet_status check_add_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                  const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                  const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                  fuselet_tensor* dweight, NormProblem* p) {
  if (fuselet_status s =
          check_norm_bwd(dy, residual_out, weight, nullptr, rstd, flags, dx, dweight, nullptr, false, p))
    return s;
  Rows rx, rd;
  if (fuselet_status s = as_rows(residual_out, "residual_out", &rx)) return s;
  if (fuselet_status s = same_rows(dresidual_out, "dresidual_out", rx, residual_out->dtype, &rd)) return s;
  p->dres = rd.data;
  p->dres_stride = rd.row_stride;
  return ok();
}

}  // namespace fuselet
