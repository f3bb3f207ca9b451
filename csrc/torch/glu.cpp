// CPU and CUDA implementations of fuselet::{swiglu,geglu,clamped_swiglu}_{fwd,bwd}: allocate outputs, hand
// core views to libfuselet (on the current CUDA stream for CUDA tensors).
#include <cmath>
#include <string>

#include "fuselet/glu.h"
#include "op.h"

namespace fuselet_torch {
namespace {

int32_t gelu_activation(const std::string& approximate) {
  FUSELET_CHECK_VALUE(approximate == "none" || approximate == "tanh", "approximate: expected 'none' or 'tanh', got '",
                      approximate, "'");
  return approximate == "tanh" ? FUSELET_GLU_GELU_TANH : FUSELET_GLU_GELU;
}

// x [..., 2F]: its rows, checked before any copy.
Rows check_glu_x(const Tensor& x) {
  const Rows r = rows_of(x, "x", "2F");
  FUSELET_CHECK_VALUE(r.cols > 0 && r.cols % 2 == 0,
                      "x: expected an even last dimension > 0 (2F: the gate and up halves), got ", r.cols);
  return r;
}

// y [..., F] of x [..., 2F] (a contiguous x, so that its rows are views of x's).
Tensor glu_fwd(const Tensor& x_in, const fuselet_glu_options& opts) {
  check_glu_x(x_in);
  const Tensor x = make_contiguous(x_in);
  fuselet_tensor vx = view(x, "x");
  std::vector<int64_t> shape = shape_of(x);
  shape.back() /= 2;
  Tensor y = alloc(x, shape, x.scalar_type());
  fuselet_tensor vy = view(y, "y");
  run_on(
      x, [&] { return fuselet_glu_fwd_ex(&vx, &opts, &vy); },
      [&](void* stream) { return fuselet_glu_fwd_ex_cuda(&vx, &opts, &vy, stream); });
  return y;
}

Tensor glu_bwd(const Tensor& dy_in, const Tensor& x_in, const fuselet_glu_options& opts) {
  check_defined(x_in, "x");
  check_same_device(x_in, dy_in, "dy");
  const Rows r = check_glu_x(x_in);
  rows_like(dy_in, "dy", x_in, "x", {r.rows, r.cols / 2});
  const Tensor dy = make_contiguous(dy_in), x = make_contiguous(x_in);
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x");
  Tensor dx = alloc_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  run_on(
      x, [&] { return fuselet_glu_bwd_ex(&vdy, &vx, &opts, &vdx); },
      [&](void* stream) { return fuselet_glu_bwd_ex_cuda(&vdy, &vx, &opts, &vdx, stream); });
  return dx;
}

fuselet_glu_options plain(int32_t activation) { return {activation, 0, 0.f, 0.f}; }

// alpha and limit in float32, checked before x is copied (the core's rule and message).
fuselet_glu_options clamped(double alpha, double limit, bool interleaved) {
  const fuselet_glu_options o{FUSELET_GLU_SILU_CLAMPED, interleaved ? 1 : 0, static_cast<float>(alpha),
                              static_cast<float>(limit)};
  FUSELET_CHECK_VALUE(std::isfinite(o.alpha), "alpha: expected a finite number, got ", o.alpha);
  FUSELET_CHECK_VALUE(std::isfinite(o.limit) && o.limit > 0.f, "limit: expected a finite number > 0, got ", o.limit);
  return o;
}

Tensor swiglu_fwd(const Tensor& x) { return glu_fwd(x, plain(FUSELET_GLU_SILU)); }
Tensor swiglu_bwd(const Tensor& dy, const Tensor& x) { return glu_bwd(dy, x, plain(FUSELET_GLU_SILU)); }
Tensor geglu_fwd(const Tensor& x, const std::string& approximate) {
  return glu_fwd(x, plain(gelu_activation(approximate)));
}
Tensor geglu_bwd(const Tensor& dy, const Tensor& x, const std::string& approximate) {
  return glu_bwd(dy, x, plain(gelu_activation(approximate)));
}
Tensor clamped_swiglu_fwd(const Tensor& x, double alpha, double limit, bool interleaved) {
  return glu_fwd(x, clamped(alpha, limit, interleaved));
}
Tensor clamped_swiglu_bwd(const Tensor& dy, const Tensor& x, double alpha, double limit, bool interleaved) {
  return glu_bwd(dy, x, clamped(alpha, limit, interleaved));
}

void impls(Library& m) {
  FUSELET_IMPL(m, "swiglu_fwd", swiglu_fwd);
  FUSELET_IMPL(m, "swiglu_bwd", swiglu_bwd);
  FUSELET_IMPL(m, "geglu_fwd", geglu_fwd);
  FUSELET_IMPL(m, "geglu_bwd", geglu_bwd);
  FUSELET_IMPL(m, "clamped_swiglu_fwd", clamped_swiglu_fwd);
  FUSELET_IMPL(m, "clamped_swiglu_bwd", clamped_swiglu_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
