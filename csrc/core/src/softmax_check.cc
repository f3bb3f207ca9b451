// Argument checking shared by the CPU and CUDA softmax entry points, and the
// fuselet_softmax_*_check functions of the C ABI (the same checks of the inputs and options).
#include "softmax_check.h"

#include <cmath>

namespace fuselet {
namespace {

// x (y in the backward: `name`) and scale.
fuselet_status check_rows(const fuselet_tensor* x, const char* name, float scale, Layout layout, Rows* rx,
                          SoftmaxProblem* p) {
  if (fuselet_status s = as_rows(x, name, rx, layout, "K")) return s;
  char buf[160];
  if (rx->hidden == 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the last dimension (keys) must be > 0, got shape %s", name,
                shape_string(x, buf, sizeof buf));
  if (!std::isfinite(scale))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "scale: expected a finite number, got %s",
                float_string(scale, buf, sizeof buf));
  p->dtype = x->dtype;
  p->rows = rx->rows;
  p->keys = rx->hidden;
  p->scale = scale;
  p->x = rx->data;
  p->x_stride = rx->row_stride;
  return FUSELET_OK;
}

// The inputs and options of a forward.
fuselet_status fwd_inputs(const fuselet_tensor* x, float scale, uint32_t flags, Layout layout, Rows* rx,
                          SoftmaxProblem* p) {
  if (fuselet_status s = check_rows(x, "x", scale, layout, rx, p)) return s;
  if (flags & ~static_cast<uint32_t>(FUSELET_SOFTMAX_CAUSAL))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "flags: unknown bits 0x%x (known: FUSELET_SOFTMAX_CAUSAL)",
                static_cast<unsigned>(flags & ~static_cast<uint32_t>(FUSELET_SOFTMAX_CAUSAL)));
  if (flags & FUSELET_SOFTMAX_CAUSAL) {
    if (x->ndim < 2) {
      char buf[160];
      return fail(
          FUSELET_ERR_INVALID_ARGUMENT,
          "flags: FUSELET_SOFTMAX_CAUSAL needs x of shape [..., Q, K] with at least 2 dimensions, got shape %s",
          shape_string(x, buf, sizeof buf));
    }
    p->causal = true;
    p->queries = x->shape[x->ndim - 2] > 0 ? x->shape[x->ndim - 2] : 1;
    p->shift = rx->hidden - x->shape[x->ndim - 2];
  }
  return FUSELET_OK;
}

// The inputs and options of a backward.
fuselet_status bwd_inputs(const fuselet_tensor* dy, const fuselet_tensor* y, float scale, Layout layout, Rows* ry,
                          SoftmaxProblem* p) {
  Rows rdy;
  if (fuselet_status s = check_rows(y, "y", scale, layout, ry, p)) return s;
  if (fuselet_status s = rows_like_x(dy, "dy", y->dtype, ry->rows, ry->hidden, &rdy, layout)) return s;
  p->dy = rdy.data;
  p->dy_stride = rdy.row_stride;
  return FUSELET_OK;
}

}  // namespace

fuselet_status check_softmax_fwd(const fuselet_tensor* x, float scale, uint32_t flags, fuselet_tensor* y,
                                 SoftmaxProblem* p) {
  Rows rx, ry;
  if (fuselet_status s = fwd_inputs(x, scale, flags, Layout::kKernel, &rx, p)) return s;
  if (fuselet_status s = rows_like_x(y, "y", x->dtype, rx.rows, rx.hidden, &ry)) return s;
  p->out = ry.data;
  p->out_stride = ry.row_stride;
  return ok();
}

fuselet_status check_softmax_bwd(const fuselet_tensor* dy, const fuselet_tensor* y, float scale, fuselet_tensor* dx,
                                 SoftmaxProblem* p) {
  Rows ry, rdx;
  if (fuselet_status s = bwd_inputs(dy, y, scale, Layout::kKernel, &ry, p)) return s;
  if (fuselet_status s = rows_like_x(dx, "dx", y->dtype, ry.rows, ry.hidden, &rdx)) return s;
  p->out = rdx.data;
  p->out_stride = rdx.row_stride;
  return ok();
}

}  // namespace fuselet

extern "C" {

fuselet_status fuselet_softmax_fwd_check(const fuselet_tensor* x, float scale, uint32_t flags) {
  return fuselet::guarded("fuselet_softmax_fwd_check", [&] {
    fuselet::SoftmaxProblem p;
    fuselet::Rows rx;
    if (fuselet_status s = fuselet::fwd_inputs(x, scale, flags, fuselet::Layout::kAny, &rx, &p)) return s;
    return fuselet::ok();
  });
}

fuselet_status fuselet_softmax_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* y, float scale) {
  return fuselet::guarded("fuselet_softmax_bwd_check", [&] {
    fuselet::SoftmaxProblem p;
    fuselet::Rows ry;
    if (fuselet_status s = fuselet::bwd_inputs(dy, y, scale, fuselet::Layout::kAny, &ry, &p)) return s;
    return fuselet::ok();
  });
}

}  // extern "C"
