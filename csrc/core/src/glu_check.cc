// Argument checking shared by the CPU and CUDA gated-linear-unit entry points, and the
// fuselet_glu_*_check functions of the C ABI (the same checks of the inputs and options).
#include "glu_check.h"

#include <cinttypes>
#include <cmath>

namespace fuselet {
namespace {

fuselet_status check_options(const fuselet_glu_options* opts, bool ex, GluProblem* p) {
  if (opts == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "opts: expected a fuselet_glu_options, got NULL");
  const int32_t activation = opts->activation;
  if (activation < FUSELET_GLU_SILU || activation > FUSELET_GLU_SILU_CLAMPED)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "activation: expected FUSELET_GLU_SILU, FUSELET_GLU_GELU, FUSELET_GLU_GELU_TANH or "
                "FUSELET_GLU_SILU_CLAMPED, got %d",
                static_cast<int>(activation));
  if (activation == FUSELET_GLU_SILU_CLAMPED && !ex)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "activation: FUSELET_GLU_SILU_CLAMPED takes alpha and limit: call fuselet_glu_fwd_ex / _bwd_ex");
  if (opts->interleaved != 0 && opts->interleaved != 1)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "interleaved: expected 0 or 1, got %d",
                static_cast<int>(opts->interleaved));
  if (activation == FUSELET_GLU_SILU_CLAMPED) {
    char buf[32];
    if (!std::isfinite(opts->alpha))
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "alpha: expected a finite number, got %s",
                  float_string(opts->alpha, buf, sizeof buf));
    if (!std::isfinite(opts->limit) || !(opts->limit > 0.f))
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "limit: expected a finite number > 0, got %s",
                  float_string(opts->limit, buf, sizeof buf));
  }
  p->activation = activation;
  p->interleaved = opts->interleaved == 1;
  p->alpha = opts->alpha;
  p->limit = opts->limit;
  return FUSELET_OK;
}

// The inputs and options of a forward (x, opts) or, with dy, of a backward.
fuselet_status inputs(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_glu_options* opts, bool ex,
                      bool backward, Layout layout, Rows* rx, GluProblem* p) {
  if (fuselet_status s = as_rows(x, "x", rx, layout, "2F")) return s;
  if (rx->hidden == 0 || rx->hidden % 2 != 0) {
    char buf[160];
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "x: expected an even last dimension > 0 (2F: the gate and up halves), got shape %s",
                shape_string(x, buf, sizeof buf));
  }
  if (fuselet_status s = check_options(opts, ex, p)) return s;
  p->dtype = x->dtype;
  p->rows = rx->rows;
  p->half = rx->hidden / 2;
  p->x = rx->data;
  p->x_stride = rx->row_stride;
  if (!backward) return FUSELET_OK;
  Rows rdy;
  if (fuselet_status s = rows_like_x(dy, "dy", x->dtype, rx->rows, p->half, &rdy, layout)) return s;
  p->dy = rdy.data;
  p->dy_stride = rdy.row_stride;
  return FUSELET_OK;
}

// The checks of the inputs and options alone (the `_check` functions).
fuselet_status check_inputs(const char* entry, const fuselet_tensor* dy, const fuselet_tensor* x,
                            const fuselet_glu_options* opts, bool ex, bool backward) {
  return guarded(entry, [&] {
    GluProblem p;
    Rows rx;
    if (fuselet_status s = inputs(dy, x, opts, ex, backward, Layout::kAny, &rx, &p)) return s;
    return ok();
  });
}

}  // namespace

fuselet_status check_glu_fwd(const fuselet_tensor* x, const fuselet_glu_options* opts, bool ex, fuselet_tensor* y,
                             GluProblem* p) {
  Rows rx, ry;
  if (fuselet_status s = inputs(nullptr, x, opts, ex, false, Layout::kKernel, &rx, p)) return s;
  if (fuselet_status s = rows_like_x(y, "y", x->dtype, rx.rows, p->half, &ry)) return s;
  p->y = ry.data;
  p->y_stride = ry.row_stride;
  return ok();
}

fuselet_status check_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_glu_options* opts,
                             bool ex, fuselet_tensor* dx, GluProblem* p) {
  Rows rx, rdx;
  if (fuselet_status s = inputs(dy, x, opts, ex, true, Layout::kKernel, &rx, p)) return s;
  if (fuselet_status s = rows_like_x(dx, "dx", x->dtype, rx.rows, rx.hidden, &rdx)) return s;
  p->dx = rdx.data;
  p->dx_stride = rdx.row_stride;
  return ok();
}

}  // namespace fuselet

extern "C" {

fuselet_status fuselet_glu_fwd_ex_check(const fuselet_tensor* x, const fuselet_glu_options* opts) {
  return fuselet::check_inputs("fuselet_glu_fwd_ex_check", nullptr, x, opts, true, false);
}

fuselet_status fuselet_glu_bwd_ex_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                        const fuselet_glu_options* opts) {
  return fuselet::check_inputs("fuselet_glu_bwd_ex_check", dy, x, opts, true, true);
}

fuselet_status fuselet_glu_fwd_check(const fuselet_tensor* x, int32_t activation) {
  const fuselet_glu_options opts = fuselet::glu_options(activation);
  return fuselet::check_inputs("fuselet_glu_fwd_check", nullptr, x, &opts, false, false);
}

fuselet_status fuselet_glu_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation) {
  const fuselet_glu_options opts = fuselet::glu_options(activation);
  return fuselet::check_inputs("fuselet_glu_bwd_check", dy, x, &opts, false, true);
}

}  // extern "C"
