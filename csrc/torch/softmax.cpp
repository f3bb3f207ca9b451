// CPU and CUDA implementations of fuselet::softmax_{fwd,bwd}: allocate outputs, hand core
// views to libfuselet (on the current CUDA stream for CUDA tensors).
#include <cmath>

#include "fuselet/softmax.h"
#include "op.h"

namespace fuselet_torch {
namespace {

// x (y in the backward) [..., K] and scale: checked before any copy.
Rows check_softmax(const Tensor& x, const char* name, double scale) {
  const Rows r = rows_of(x, name, "K");
  FUSELET_CHECK_VALUE(r.cols > 0, name, ": the last dimension (keys) must be > 0, got 0");
  FUSELET_CHECK_VALUE(std::isfinite(static_cast<float>(scale)), "scale: expected a finite number, got ",
                      static_cast<float>(scale));
  return r;
}

Tensor softmax_fwd(const Tensor& x_in, double scale, bool causal) {
  check_softmax(x_in, "x", scale);
  FUSELET_CHECK_VALUE(!causal || x_in.dim() >= 2,
                      "flags: FUSELET_SOFTMAX_CAUSAL needs x of shape [..., Q, K] (2 or more dimensions), got ",
                      x_in.dim());
  const Tensor x = make_contiguous(x_in);
  fuselet_tensor vx = view(x, "x");
  Tensor y = alloc_like(x);
  fuselet_tensor vy = view(y, "y");
  const uint32_t flags = causal ? FUSELET_SOFTMAX_CAUSAL : 0;
  const float s = static_cast<float>(scale);
  run_on(
      x, [&] { return fuselet_softmax_fwd(&vx, s, flags, &vy); },
      [&](void* stream) { return fuselet_softmax_fwd_cuda(&vx, s, flags, &vy, stream); });
  return y;
}

Tensor softmax_bwd(const Tensor& dy_in, const Tensor& y_in, double scale) {
  check_defined(y_in, "y");
  check_same_device(y_in, dy_in, "dy", "y");
  const Rows r = check_softmax(y_in, "y", scale);
  rows_like(dy_in, "dy", y_in, "y", r);
  const Tensor dy = make_contiguous(dy_in), y = make_contiguous(y_in);
  fuselet_tensor vdy = view(dy, "dy"), vy = view(y, "y");
  Tensor dx = alloc_like(y);
  fuselet_tensor vdx = view(dx, "dx");
  const float s = static_cast<float>(scale);
  run_on(
      y, [&] { return fuselet_softmax_bwd(&vdy, &vy, s, &vdx); },
      [&](void* stream) { return fuselet_softmax_bwd_cuda(&vdy, &vy, s, &vdx, stream); });
  return dx;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "softmax_fwd", softmax_fwd);
  FUSELET_IMPL(m, "softmax_bwd", softmax_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
