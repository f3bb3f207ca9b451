// XLA FFI handlers of the divergence family: fuselet_divergence_{fwd,bwd} (attributes: the
// fields of fuselet_divergence_options; the backward's wrt_target: 0 writes the gradient of
// input, 1 that of target). Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include "fuselet/divergence.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error DivergenceFwd(Where at, AnyBuffer input, AnyBuffer target, int32_t kind, int32_t log_target, float beta,
                    Result<AnyBuffer> loss) {
  FUSELET_JAX_VIEW(vx, input, "input");
  FUSELET_JAX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vl, *loss, "loss");
  const fuselet_divergence_options o{kind, log_target, beta};
  return run_on(
      at, [&] { return fuselet_divergence_fwd(&vx, &vt, &o, &vl); },
      [&](void* s) { return fuselet_divergence_fwd_cuda(&vx, &vt, &o, &vl, s); });
}

Error DivergenceBwd(Where at, AnyBuffer dloss, AnyBuffer input, AnyBuffer target, int32_t kind, int32_t log_target,
                    float beta, int32_t wrt_target, Result<AnyBuffer> grad) {
  FUSELET_JAX_VIEW(vg, dloss, "dloss");
  FUSELET_JAX_VIEW(vx, input, "input");
  FUSELET_JAX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vd, *grad, wrt_target ? "dtarget" : "dinput");
  const fuselet_divergence_options o{kind, log_target, beta};
  fuselet_tensor* dx = wrt_target ? nullptr : &vd;
  fuselet_tensor* dt = wrt_target ? &vd : nullptr;
  return run_on(
      at, [&] { return fuselet_divergence_bwd(&vg, &vx, &vt, &o, dx, dt); },
      [&](void* s) { return fuselet_divergence_bwd_cuda(&vg, &vx, &vt, &o, dx, dt, s); });
}

}  // namespace
}  // namespace fuselet_jax

FUSELET_JAX_HANDLERS(divergence_fwd, fuselet_jax::DivergenceFwd, "kind", "log_target", "beta")
FUSELET_JAX_HANDLERS(divergence_bwd, fuselet_jax::DivergenceBwd, "kind", "log_target", "beta", "wrt_target")
