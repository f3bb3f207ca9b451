// XLA FFI handlers of the divergence family: fuselet_divergence_{fwd,bwd} (attributes: the
// fields of fuselet_divergence_options; the backward's wrt_target: 0 writes the gradient of
// input, 1 that of target) and fuselet_divergence_logits (the same, and scale: its dinput result
// is the logits' gradient, written over a copy of input, or over input itself where XLA aliases
// them). Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include <cstring>

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

Error DivergenceLogits(Where at, AnyBuffer input, AnyBuffer target, AnyBuffer dloss, int32_t kind, int32_t log_target,
                       float beta, float scale, Result<AnyBuffer> loss, Result<AnyBuffer> dinput) {
  FUSELET_JAX_VIEW(vx, input, "input");
  FUSELET_JAX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vg, dloss, "dloss");
  FUSELET_JAX_VIEW(vl, *loss, "loss");
  FUSELET_JAX_VIEW(vd, *dinput, "input");
  const fuselet_divergence_options o{kind, log_target, beta};
  if (fuselet_divergence_logits_check(&vx, &vt, &vg, &o, scale) != FUSELET_OK)
    return to_error(FUSELET_ERR_INVALID_ARGUMENT);
  const size_t bytes = input.size_bytes();
  return run_on(
      at,
      [&] {
        if (vd.data != vx.data && bytes) std::memcpy(vd.data, vx.data, bytes);
        return fuselet_divergence_logits(&vd, &vt, &vg, &o, scale, &vl);
      },
      [&](void* s) {
#ifdef FUSELET_JAX_CUDA
        if (vd.data != vx.data && bytes &&
            cudaMemcpyAsync(vd.data, vx.data, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)) !=
                cudaSuccess)
          return FUSELET_ERR_INTERNAL;
#endif
        return fuselet_divergence_logits_cuda(&vd, &vt, &vg, &o, scale, &vl, s);
      });
}

}  // namespace
}  // namespace fuselet_jax

FUSELET_JAX_HANDLERS(divergence_fwd, fuselet_jax::DivergenceFwd, "kind", "log_target", "beta")
FUSELET_JAX_HANDLERS(divergence_bwd, fuselet_jax::DivergenceBwd, "kind", "log_target", "beta", "wrt_target")
FUSELET_JAX_HANDLERS(divergence_logits, fuselet_jax::DivergenceLogits, "kind", "log_target", "beta", "scale")
