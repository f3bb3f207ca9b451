// CPU and CUDA implementations of fuselet::softmax_{fwd,bwd}: the core's checks of the inputs as
// given (before any copy), then allocate outputs and hand core views of contiguous inputs to
// libfuselet (on the current CUDA stream for CUDA tensors).
#include "fuselet/softmax.h"
#include "op.h"

namespace fuselet_torch {
namespace {

Tensor softmax_fwd(const Tensor& x_in, double scale, bool causal) {
  Arg x(x_in, "x");
  const uint32_t flags = causal ? FUSELET_SOFTMAX_CAUSAL : 0;
  const float s = static_cast<float>(scale);
  check_args(fuselet_softmax_fwd_check(&x.v, s, flags));
  x.contiguous();
  Tensor y = alloc_like(x.t);
  fuselet_tensor vy = view(y, "y");
  run_on(
      x.t, [&] { return fuselet_softmax_fwd(&x.v, s, flags, &vy); },
      [&](void* stream) { return fuselet_softmax_fwd_cuda(&x.v, s, flags, &vy, stream); });
  return y;
}

Tensor softmax_bwd(const Tensor& dy_in, const Tensor& y_in, double scale) {
  check_devices(y_in, "y", {{"dy", &dy_in}});
  Arg dy(dy_in, "dy"), y(y_in, "y");
  const float s = static_cast<float>(scale);
  check_args(fuselet_softmax_bwd_check(&dy.v, &y.v, s));
  dy.contiguous();
  y.contiguous();
  Tensor dx = alloc_like(y.t);
  fuselet_tensor vdx = view(dx, "dx");
  run_on(
      y.t, [&] { return fuselet_softmax_bwd(&dy.v, &y.v, s, &vdx); },
      [&](void* stream) { return fuselet_softmax_bwd_cuda(&dy.v, &y.v, s, &vdx, stream); });
  return dx;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "softmax_fwd", softmax_fwd);
  FUSELET_IMPL(m, "softmax_bwd", softmax_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
