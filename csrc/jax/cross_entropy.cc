// XLA FFI handlers of the cross-entropy family: fuselet_cross_entropy_{fwd,bwd,fwd_bwd}
// (attributes: the fields of fuselet_cross_entropy_options; grad_scale for fwd_bwd) and
// fuselet_logprobs_{fwd,bwd} (attributes: ignore_index, softcap).
// Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include "fuselet/cross_entropy.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

fuselet_cross_entropy_options options(int64_t ignore_index, float label_smoothing, float z_loss, float softcap) {
  return {ignore_index, label_smoothing, z_loss, softcap};
}

Error CrossEntropyFwd(Where at, AnyBuffer logits, AnyBuffer target, int64_t ignore_index, float label_smoothing,
                      float z_loss, float softcap, Result<AnyBuffer> loss, Result<AnyBuffer> z,
                      Result<AnyBuffer> lse) {
  FUSELET_JAX_VIEW(vx, logits, "logits");
  FUSELET_JAX_INDEX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vl, *loss, "loss");
  FUSELET_JAX_VIEW(vz, *z, "z");
  FUSELET_JAX_VIEW(vlse, *lse, "lse");
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  return run_on(
      at, [&] { return fuselet_cross_entropy_fwd(&vx, &vt, &o, &vl, &vz, &vlse); },
      [&](void* s) { return fuselet_cross_entropy_fwd_cuda(&vx, &vt, &o, &vl, &vz, &vlse, s); });
}

Error CrossEntropyBwd(Where at, AnyBuffer dloss, AnyBuffer logits, AnyBuffer target, AnyBuffer lse,
                      int64_t ignore_index, float label_smoothing, float z_loss, float softcap,
                      Result<AnyBuffer> dlogits) {
  FUSELET_JAX_VIEW(vg, dloss, "dloss");
  FUSELET_JAX_VIEW(vx, logits, "logits");
  FUSELET_JAX_INDEX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vlse, lse, "lse");
  FUSELET_JAX_VIEW(vdx, *dlogits, "dlogits");
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  return run_on(
      at, [&] { return fuselet_cross_entropy_bwd(&vg, &vx, &vt, &vlse, &o, &vdx); },
      [&](void* s) { return fuselet_cross_entropy_bwd_cuda(&vg, &vx, &vt, &vlse, &o, &vdx, s); });
}

Error CrossEntropyFwdBwd(Where at, AnyBuffer logits, AnyBuffer target, int64_t ignore_index, float label_smoothing,
                         float z_loss, float softcap, float grad_scale, Result<AnyBuffer> loss, Result<AnyBuffer> z,
                         Result<AnyBuffer> dlogits) {
  FUSELET_JAX_VIEW(vx, logits, "logits");
  FUSELET_JAX_INDEX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vl, *loss, "loss");
  FUSELET_JAX_VIEW(vz, *z, "z");
  FUSELET_JAX_VIEW(vdx, *dlogits, "dlogits");
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  return run_on(
      at, [&] { return fuselet_cross_entropy_fwd_bwd(&vx, &vt, &o, grad_scale, &vl, &vz, &vdx); },
      [&](void* s) { return fuselet_cross_entropy_fwd_bwd_cuda(&vx, &vt, &o, grad_scale, &vl, &vz, &vdx, s); });
}

// The log-probabilities: every output (the layer drops those not asked for).
Error LogprobsFwd(Where at, AnyBuffer logits, AnyBuffer target, int64_t ignore_index, float softcap,
                  Result<AnyBuffer> logp, Result<AnyBuffer> lse, Result<AnyBuffer> entropy,
                  Result<AnyBuffer> log_sum_sq_probs, Result<AnyBuffer> mean_logits, Result<AnyBuffer> is_top1) {
  FUSELET_JAX_VIEW(vx, logits, "logits");
  FUSELET_JAX_INDEX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vl, *logp, "logp");
  FUSELET_JAX_VIEW(vlse, *lse, "lse");
  FUSELET_JAX_VIEW(ve, *entropy, "entropy");
  FUSELET_JAX_VIEW(vs, *log_sum_sq_probs, "log_sum_sq_probs");
  FUSELET_JAX_VIEW(vm, *mean_logits, "mean_logits");
  FUSELET_JAX_VIEW(vtop, *is_top1, "is_top1");
  const fuselet_cross_entropy_options o = options(ignore_index, 0.f, 0.f, softcap);
  return run_on(
      at, [&] { return fuselet_logprobs_fwd(&vx, &vt, &o, &vl, &vlse, &ve, &vs, &vm, &vtop); },
      [&](void* s) { return fuselet_logprobs_fwd_cuda(&vx, &vt, &o, &vl, &vlse, &ve, &vs, &vm, &vtop, s); });
}

// dlogp and dentropy always given (zeros for none), entropy too.
Error LogprobsBwd(Where at, AnyBuffer dlogp, AnyBuffer dentropy, AnyBuffer logits, AnyBuffer target, AnyBuffer lse,
                  AnyBuffer entropy, int64_t ignore_index, float softcap, Result<AnyBuffer> dlogits) {
  FUSELET_JAX_VIEW(vg, dlogp, "dlogp");
  FUSELET_JAX_VIEW(vh, dentropy, "dentropy");
  FUSELET_JAX_VIEW(vx, logits, "logits");
  FUSELET_JAX_INDEX_VIEW(vt, target, "target");
  FUSELET_JAX_VIEW(vlse, lse, "lse");
  FUSELET_JAX_VIEW(ve, entropy, "entropy");
  FUSELET_JAX_VIEW(vdx, *dlogits, "dlogits");
  const fuselet_cross_entropy_options o = options(ignore_index, 0.f, 0.f, softcap);
  return run_on(
      at, [&] { return fuselet_logprobs_bwd(&vg, &vh, &vx, &vt, &vlse, &ve, &o, &vdx); },
      [&](void* s) { return fuselet_logprobs_bwd_cuda(&vg, &vh, &vx, &vt, &vlse, &ve, &o, &vdx, s); });
}

}  // namespace
}  // namespace fuselet_jax

FUSELET_JAX_HANDLERS(cross_entropy_fwd, fuselet_jax::CrossEntropyFwd, "ignore_index", "label_smoothing", "z_loss",
                     "softcap")
FUSELET_JAX_HANDLERS(cross_entropy_bwd, fuselet_jax::CrossEntropyBwd, "ignore_index", "label_smoothing", "z_loss",
                     "softcap")
FUSELET_JAX_HANDLERS(cross_entropy_fwd_bwd, fuselet_jax::CrossEntropyFwdBwd, "ignore_index", "label_smoothing",
                     "z_loss", "softcap", "grad_scale")
FUSELET_JAX_HANDLERS(logprobs_fwd, fuselet_jax::LogprobsFwd, "ignore_index", "softcap")
FUSELET_JAX_HANDLERS(logprobs_bwd, fuselet_jax::LogprobsBwd, "ignore_index", "softcap")
