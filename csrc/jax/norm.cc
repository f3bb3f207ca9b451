// XLA FFI handlers of the normalization family. Target names follow the torch ops:
// fuselet_rms_norm_fwd <-> fuselet::rms_norm_fwd. Symbols: fuselet_jax_<op>_{cpu,cuda}.
// The backward's device workspace is its last output (uint8, sized by the Python layer with
// fuselet_norm_bwd_workspace_bytes_cuda; 0 bytes for the CPU kernels), not a scratch
// allocation, so every CUDA handler is declared compatible with XLA command buffers.
#include "fuselet/norm.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error RmsNormFwd(Where at, AnyBuffer x, AnyBuffer weight, float eps, int32_t flags, Result<AnyBuffer> y,
                 Result<AnyBuffer> rstd) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vy, *y, "y");
  FUSELET_JAX_VIEW(vr, *rstd, "rstd");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_rms_norm_fwd(&vx, param(&vw), eps, f, &vy, &vr); },
      [&](void* s) { return fuselet_rms_norm_fwd_cuda(&vx, param(&vw), eps, f, &vy, &vr, s); });
}

Error RmsNormBwd(Where at, AnyBuffer dy, AnyBuffer x, AnyBuffer weight, AnyBuffer rstd, int32_t flags,
                 Result<AnyBuffer> dx, Result<AnyBuffer> dweight, Result<AnyBuffer> ws) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vr, rstd, "rstd");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  FUSELET_JAX_VIEW(vdw, *dweight, "dweight");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_rms_norm_bwd(&vdy, &vx, param(&vw), &vr, f, &vdx, param(&vdw)); },
      [&](void* s) {
        return fuselet_rms_norm_bwd_cuda(&vdy, &vx, param(&vw), &vr, f, &vdx, param(&vdw), ws->untyped_data(),
                                         ws->size_bytes(), s);
      });
}

Error LayerNormFwd(Where at, AnyBuffer x, AnyBuffer weight, AnyBuffer bias, float eps, int32_t flags,
                   Result<AnyBuffer> y, Result<AnyBuffer> mean, Result<AnyBuffer> rstd) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vb, bias, "bias");
  FUSELET_JAX_VIEW(vy, *y, "y");
  FUSELET_JAX_VIEW(vm, *mean, "mean");
  FUSELET_JAX_VIEW(vr, *rstd, "rstd");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_layer_norm_fwd(&vx, param(&vw), param(&vb), eps, f, &vy, &vm, &vr); },
      [&](void* s) { return fuselet_layer_norm_fwd_cuda(&vx, param(&vw), param(&vb), eps, f, &vy, &vm, &vr, s); });
}

// bias is read for its presence and dtype only (dbias is computed when it is present).
Error LayerNormBwd(Where at, AnyBuffer dy, AnyBuffer x, AnyBuffer weight, AnyBuffer bias, AnyBuffer mean,
                   AnyBuffer rstd, int32_t flags, Result<AnyBuffer> dx, Result<AnyBuffer> dweight,
                   Result<AnyBuffer> dbias, Result<AnyBuffer> ws) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vb, bias, "bias");
  FUSELET_JAX_VIEW(vm, mean, "mean");
  FUSELET_JAX_VIEW(vr, rstd, "rstd");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  FUSELET_JAX_VIEW(vdw, *dweight, "dweight");
  FUSELET_JAX_VIEW(vdb, *dbias, "dbias");
  const uint32_t f = static_cast<uint32_t>(flags);
  fuselet_tensor* db = param(&vb) ? &vdb : nullptr;
  return run_on(
      at, [&] { return fuselet_layer_norm_bwd(&vdy, &vx, param(&vw), &vm, &vr, f, &vdx, param(&vdw), db); },
      [&](void* s) {
        return fuselet_layer_norm_bwd_cuda(&vdy, &vx, param(&vw), &vm, &vr, f, &vdx, param(&vdw), db,
                                           ws->untyped_data(), ws->size_bytes(), s);
      });
}

Error AddRmsNormFwd(Where at, AnyBuffer x, AnyBuffer residual, AnyBuffer weight, float eps, int32_t flags,
                    Result<AnyBuffer> y, Result<AnyBuffer> residual_out, Result<AnyBuffer> rstd) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vres, residual, "residual");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vy, *y, "y");
  FUSELET_JAX_VIEW(vh, *residual_out, "residual_out");
  FUSELET_JAX_VIEW(vr, *rstd, "rstd");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_add_rms_norm_fwd(&vx, &vres, param(&vw), eps, f, &vy, &vh, &vr); },
      [&](void* s) { return fuselet_add_rms_norm_fwd_cuda(&vx, &vres, param(&vw), eps, f, &vy, &vh, &vr, s); });
}

Error AddRmsNormBwd(Where at, AnyBuffer dy, AnyBuffer dresidual_out, AnyBuffer residual_out, AnyBuffer weight,
                    AnyBuffer rstd, int32_t flags, Result<AnyBuffer> dx, Result<AnyBuffer> dweight,
                    Result<AnyBuffer> ws) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vdh, dresidual_out, "dresidual_out");
  FUSELET_JAX_VIEW(vh, residual_out, "residual_out");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vr, rstd, "rstd");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  FUSELET_JAX_VIEW(vdw, *dweight, "dweight");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_add_rms_norm_bwd(&vdy, &vdh, &vh, param(&vw), &vr, f, &vdx, param(&vdw)); },
      [&](void* s) {
        return fuselet_add_rms_norm_bwd_cuda(&vdy, &vdh, &vh, param(&vw), &vr, f, &vdx, param(&vdw),
                                             ws->untyped_data(), ws->size_bytes(), s);
      });
}

Error GatedRmsNormFwd(Where at, AnyBuffer x, AnyBuffer z, AnyBuffer weight, float eps, int64_t group_size,
                      int32_t flags, Result<AnyBuffer> y, Result<AnyBuffer> rstd) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vz, z, "z");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vy, *y, "y");
  FUSELET_JAX_VIEW(vr, *rstd, "rstd");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_gated_rms_norm_fwd(&vx, &vz, param(&vw), eps, group_size, f, &vy, &vr); },
      [&](void* s) { return fuselet_gated_rms_norm_fwd_cuda(&vx, &vz, param(&vw), eps, group_size, f, &vy, &vr, s); });
}

Error GatedRmsNormBwd(Where at, AnyBuffer dy, AnyBuffer x, AnyBuffer z, AnyBuffer weight, AnyBuffer rstd,
                      int64_t group_size, int32_t flags, Result<AnyBuffer> dx, Result<AnyBuffer> dz,
                      Result<AnyBuffer> dweight, Result<AnyBuffer> ws) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vz, z, "z");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vr, rstd, "rstd");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  FUSELET_JAX_VIEW(vdz, *dz, "dz");
  FUSELET_JAX_VIEW(vdw, *dweight, "dweight");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at,
      [&] {
        return fuselet_gated_rms_norm_bwd(&vdy, &vx, &vz, param(&vw), &vr, group_size, f, &vdx, &vdz, param(&vdw));
      },
      [&](void* s) {
        return fuselet_gated_rms_norm_bwd_cuda(&vdy, &vx, &vz, param(&vw), &vr, group_size, f, &vdx, &vdz, param(&vdw),
                                               ws->untyped_data(), ws->size_bytes(), s);
      });
}

}  // namespace
}  // namespace fuselet_jax

// flags: fuselet_norm_flags; the backward's last result is its workspace.
FUSELET_JAX_HANDLERS(rms_norm_fwd, fuselet_jax::RmsNormFwd, "eps", "flags")
FUSELET_JAX_HANDLERS(rms_norm_bwd, fuselet_jax::RmsNormBwd, "flags")
FUSELET_JAX_HANDLERS(layer_norm_fwd, fuselet_jax::LayerNormFwd, "eps", "flags")
FUSELET_JAX_HANDLERS(layer_norm_bwd, fuselet_jax::LayerNormBwd, "flags")
FUSELET_JAX_HANDLERS(add_rms_norm_fwd, fuselet_jax::AddRmsNormFwd, "eps", "flags")
FUSELET_JAX_HANDLERS(add_rms_norm_bwd, fuselet_jax::AddRmsNormBwd, "flags")
FUSELET_JAX_HANDLERS(gated_rms_norm_fwd, fuselet_jax::GatedRmsNormFwd, "eps", "group_size", "flags")
FUSELET_JAX_HANDLERS(gated_rms_norm_bwd, fuselet_jax::GatedRmsNormBwd, "group_size", "flags")
