// CPU and CUDA implementations of fuselet::softmax_{fwd,bwd}: allocate outputs, hand core
// views to libfuselet (on the current CUDA stream for CUDA tensors).
#include "fuselet/softmax.h"
#include "op.h"

namespace fuselet_torch {
namespace {

Tensor softmax_fwd(const Tensor& x_in, double scale, bool causal) {
  check_x(x_in);
  const Tensor x = x_in.contiguous();
  fuselet_tensor vx = view(x, "x");
  Tensor y = at::empty_like(x);
  fuselet_tensor vy = view(y, "y");
  const uint32_t flags = causal ? FUSELET_SOFTMAX_CAUSAL : 0;
  const float s = static_cast<float>(scale);
  run_on(
      x, [&] { return fuselet_softmax_fwd(&vx, s, flags, &vy); },
      [&](void* stream) { return fuselet_softmax_fwd_cuda(&vx, s, flags, &vy, stream); });
  return y;
}

Tensor softmax_bwd(const Tensor& dy_in, const Tensor& y_in, double scale) {
  check_x(y_in);
  check_same_device(y_in, dy_in, "dy");
  const Tensor dy = dy_in.contiguous(), y = y_in.contiguous();
  fuselet_tensor vdy = view(dy, "dy"), vy = view(y, "y");
  Tensor dx = at::empty_like(y);
  fuselet_tensor vdx = view(dx, "dx");
  const float s = static_cast<float>(scale);
  run_on(
      y, [&] { return fuselet_softmax_bwd(&vdy, &vy, s, &vdx); },
      [&](void* stream) { return fuselet_softmax_bwd_cuda(&vdy, &vy, s, &vdx, stream); });
  return dx;
}

void impls(torch::Library& m) {
  m.impl("softmax_fwd", &softmax_fwd);
  m.impl("softmax_bwd", &softmax_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
