// XLA FFI handlers of the gated-linear-unit family: fuselet_glu_{fwd,bwd} (activation: a
// fuselet_glu_activation), used by fuselet.jax.swiglu / geglu. Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include <utility>

#include "fuselet/glu.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error GluFwd(Where at, AnyBuffer x, int32_t activation, Result<AnyBuffer> y) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vy, *y, "y");
  return run_on(
      at, [&] { return fuselet_glu_fwd(&vx, activation, &vy); },
      [&](void* s) { return fuselet_glu_fwd_cuda(&vx, activation, &vy, s); });
}

Error GluBwd(Where at, AnyBuffer dy, AnyBuffer x, int32_t activation, Result<AnyBuffer> dx) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  return run_on(
      at, [&] { return fuselet_glu_bwd(&vdy, &vx, activation, &vdx); },
      [&](void* s) { return fuselet_glu_bwd_cuda(&vdy, &vx, activation, &vdx, s); });
}

template <typename B> auto fwd_args(B b) {
  return std::move(b).template Arg<AnyBuffer>().template Attr<int32_t>("activation").template Ret<AnyBuffer>();
}
template <typename B> auto bwd_args(B b) {
  return std::move(b)
      .template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>()
      .template Attr<int32_t>("activation")
      .template Ret<AnyBuffer>();
}

}  // namespace
}  // namespace fuselet_jax

FUSELET_JAX_HANDLERS(glu_fwd, fuselet_jax::GluFwd, fuselet_jax::fwd_args)
FUSELET_JAX_HANDLERS(glu_bwd, fuselet_jax::GluBwd, fuselet_jax::bwd_args)
