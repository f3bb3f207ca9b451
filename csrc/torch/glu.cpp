// CPU and CUDA implementations of fuselet::{swiglu,geglu}_{fwd,bwd}: allocate outputs, hand
// core views to libfuselet (on the current CUDA stream for CUDA tensors).
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
Tensor glu_fwd(const Tensor& x_in, int32_t activation) {
  check_glu_x(x_in);
  const Tensor x = make_contiguous(x_in);
  fuselet_tensor vx = view(x, "x");
  std::vector<int64_t> shape = shape_of(x);
  shape.back() /= 2;
  Tensor y = alloc(x, shape, x.scalar_type());
  fuselet_tensor vy = view(y, "y");
  run_on(
      x, [&] { return fuselet_glu_fwd(&vx, activation, &vy); },
      [&](void* stream) { return fuselet_glu_fwd_cuda(&vx, activation, &vy, stream); });
  return y;
}

Tensor glu_bwd(const Tensor& dy_in, const Tensor& x_in, int32_t activation) {
  check_defined(x_in, "x");
  check_same_device(x_in, dy_in, "dy");
  const Rows r = check_glu_x(x_in);
  rows_like(dy_in, "dy", x_in, "x", {r.rows, r.cols / 2});
  const Tensor dy = make_contiguous(dy_in), x = make_contiguous(x_in);
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x");
  Tensor dx = alloc_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  run_on(
      x, [&] { return fuselet_glu_bwd(&vdy, &vx, activation, &vdx); },
      [&](void* stream) { return fuselet_glu_bwd_cuda(&vdy, &vx, activation, &vdx, stream); });
  return dx;
}

Tensor swiglu_fwd(const Tensor& x) { return glu_fwd(x, FUSELET_GLU_SILU); }
Tensor swiglu_bwd(const Tensor& dy, const Tensor& x) { return glu_bwd(dy, x, FUSELET_GLU_SILU); }
Tensor geglu_fwd(const Tensor& x, const std::string& approximate) { return glu_fwd(x, gelu_activation(approximate)); }
Tensor geglu_bwd(const Tensor& dy, const Tensor& x, const std::string& approximate) {
  return glu_bwd(dy, x, gelu_activation(approximate));
}

void impls(Library& m) {
  FUSELET_IMPL(m, "swiglu_fwd", swiglu_fwd);
  FUSELET_IMPL(m, "swiglu_bwd", swiglu_bwd);
  FUSELET_IMPL(m, "geglu_fwd", geglu_fwd);
  FUSELET_IMPL(m, "geglu_bwd", geglu_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
