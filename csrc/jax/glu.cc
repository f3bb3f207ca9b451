// XLA FFI handlers of the gated-linear-unit family: fuselet_glu_{fwd,bwd}_ex (the attributes are
// fuselet_glu_options' fields), used by fuselet.jax.swiglu / geglu / clamped_swiglu. Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include "fuselet/glu.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error GluFwd(Where at, AnyBuffer x, int32_t activation, int32_t interleaved, float alpha, float limit,
             Result<AnyBuffer> y) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vy, *y, "y");
  const fuselet_glu_options o{activation, interleaved, alpha, limit};
  return run_on(
      at, [&] { return fuselet_glu_fwd_ex(&vx, &o, &vy); },
      [&](void* s) { return fuselet_glu_fwd_ex_cuda(&vx, &o, &vy, s); });
}

Error GluBwd(Where at, AnyBuffer dy, AnyBuffer x, int32_t activation, int32_t interleaved, float alpha, float limit,
             Result<AnyBuffer> dx) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  const fuselet_glu_options o{activation, interleaved, alpha, limit};
  return run_on(
      at, [&] { return fuselet_glu_bwd_ex(&vdy, &vx, &o, &vdx); },
      [&](void* s) { return fuselet_glu_bwd_ex_cuda(&vdy, &vx, &o, &vdx, s); });
}

}  // namespace
}  // namespace fuselet_jax

// The attributes are fuselet_glu_options' fields.
FUSELET_JAX_HANDLERS(glu_fwd, fuselet_jax::GluFwd, "activation", "interleaved", "alpha", "limit")
FUSELET_JAX_HANDLERS(glu_bwd, fuselet_jax::GluBwd, "activation", "interleaved", "alpha", "limit")
