// XLA FFI handlers of the softmax family: fuselet_softmax_{fwd,bwd} (flags:
// fuselet_softmax_flags). Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include "fuselet/softmax.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error SoftmaxFwd(Where at, AnyBuffer x, float scale, int32_t flags, Result<AnyBuffer> y) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vy, *y, "y");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_softmax_fwd(&vx, scale, f, &vy); },
      [&](void* s) { return fuselet_softmax_fwd_cuda(&vx, scale, f, &vy, s); });
}

Error SoftmaxBwd(Where at, AnyBuffer dy, AnyBuffer y, float scale, Result<AnyBuffer> dx) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vy, y, "y");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  return run_on(
      at, [&] { return fuselet_softmax_bwd(&vdy, &vy, scale, &vdx); },
      [&](void* s) { return fuselet_softmax_bwd_cuda(&vdy, &vy, scale, &vdx, s); });
}

}  // namespace
}  // namespace fuselet_jax

FUSELET_JAX_HANDLERS(softmax_fwd, fuselet_jax::SoftmaxFwd, "scale", "flags")
FUSELET_JAX_HANDLERS(softmax_bwd, fuselet_jax::SoftmaxBwd, "scale")
