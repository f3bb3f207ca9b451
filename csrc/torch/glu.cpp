// CPU and CUDA implementations of fuselet::{swiglu,geglu,clamped_swiglu}_{fwd,bwd}: the core's checks of the
// inputs as given (before any copy), then allocate outputs and hand core views of contiguous inputs to
// libfuselet (on the current CUDA stream for CUDA tensors).
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

// y [..., F] of x [..., 2F] (a contiguous x, so that its rows are views of x's).
Tensor glu_fwd(const Tensor& x_in, const fuselet_glu_options& opts) {
  Arg x(x_in, "x");
  check_args(fuselet_glu_fwd_ex_check(&x.v, &opts));
  x.contiguous();
  std::vector<int64_t> shape = shape_of(x.t);
  shape.back() /= 2;
  Tensor y = alloc(x.t, shape, x.t.scalar_type());
  fuselet_tensor vy = view(y, "y");
  run_on(
      x.t, [&] { return fuselet_glu_fwd_ex(&x.v, &opts, &vy); },
      [&](void* stream) { return fuselet_glu_fwd_ex_cuda(&x.v, &opts, &vy, stream); });
  return y;
}

Tensor glu_bwd(const Tensor& dy_in, const Tensor& x_in, const fuselet_glu_options& opts) {
  check_devices(x_in, "x", {{"dy", &dy_in}});
  Arg dy(dy_in, "dy"), x(x_in, "x");
  check_args(fuselet_glu_bwd_ex_check(&dy.v, &x.v, &opts));
  dy.contiguous();
  x.contiguous();
  Tensor dx = alloc_like(x.t);
  fuselet_tensor vdx = view(dx, "dx");
  run_on(
      x.t, [&] { return fuselet_glu_bwd_ex(&dy.v, &x.v, &opts, &vdx); },
      [&](void* stream) { return fuselet_glu_bwd_ex_cuda(&dy.v, &x.v, &opts, &vdx, stream); });
  return dx;
}

fuselet_glu_options plain(int32_t activation) { return {activation, 0, 0.f, 0.f}; }

// alpha and limit in float32 (the core checks them).
fuselet_glu_options clamped(double alpha, double limit, bool interleaved) {
  return {FUSELET_GLU_SILU_CLAMPED, interleaved ? 1 : 0, static_cast<float>(alpha), static_cast<float>(limit)};
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
