// XLA FFI handlers of the normalization family. Target names follow the torch ops:
// fuselet_rms_norm_fwd <-> fuselet::rms_norm_fwd. Symbols: fuselet_jax_<op>_{cpu,cuda}.
// The backward's device workspace is its last output (uint8, sized by the Python layer with
// fuselet_norm_bwd_workspace_bytes_cuda; 0 bytes for the CPU kernels), not a scratch
// allocation, so every CUDA handler is declared compatible with XLA command buffers.
#include <utility>

#include "fuselet/norm.h"
#include "view.h"

#ifdef FUSELET_JAX_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

// stream == nullptr: host buffers and CPU kernels; else device buffers on that stream.
struct Where {
  void* stream = nullptr;
};

// A parameter buffer with no elements stands for an absent parameter (x's hidden size is > 0,
// so a present one never has 0 elements): NULL for the core.
fuselet_tensor* param(fuselet_tensor* v) { return v->ndim == 1 && v->shape[0] == 0 ? nullptr : v; }

Error RmsNormFwd([[maybe_unused]] Where at, AnyBuffer x, AnyBuffer weight, float eps, int32_t flags,
                 Result<AnyBuffer> y, Result<AnyBuffer> rstd) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vy, *y, "y");
  FUSELET_JAX_VIEW(vr, *rstd, "rstd");
  const uint32_t f = static_cast<uint32_t>(flags);
#ifdef FUSELET_JAX_CUDA
  if (at.stream) return to_error(fuselet_rms_norm_fwd_cuda(&vx, param(&vw), eps, f, &vy, &vr, at.stream));
#endif
  return to_error(fuselet_rms_norm_fwd(&vx, param(&vw), eps, f, &vy, &vr));
}

Error RmsNormBwd([[maybe_unused]] Where at, AnyBuffer dy, AnyBuffer x, AnyBuffer weight, AnyBuffer rstd,
                 int32_t flags, Result<AnyBuffer> dx, Result<AnyBuffer> dweight,
                 [[maybe_unused]] Result<AnyBuffer> ws) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vr, rstd, "rstd");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  FUSELET_JAX_VIEW(vdw, *dweight, "dweight");
  const uint32_t f = static_cast<uint32_t>(flags);
#ifdef FUSELET_JAX_CUDA
  if (at.stream)
    return to_error(fuselet_rms_norm_bwd_cuda(&vdy, &vx, param(&vw), &vr, f, &vdx, param(&vdw), ws->untyped_data(),
                                              ws->size_bytes(), at.stream));
#endif
  return to_error(fuselet_rms_norm_bwd(&vdy, &vx, param(&vw), &vr, f, &vdx, param(&vdw)));
}

Error LayerNormFwd([[maybe_unused]] Where at, AnyBuffer x, AnyBuffer weight, AnyBuffer bias, float eps,
                   int32_t flags, Result<AnyBuffer> y, Result<AnyBuffer> mean, Result<AnyBuffer> rstd) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vw, weight, "weight");
  FUSELET_JAX_VIEW(vb, bias, "bias");
  FUSELET_JAX_VIEW(vy, *y, "y");
  FUSELET_JAX_VIEW(vm, *mean, "mean");
  FUSELET_JAX_VIEW(vr, *rstd, "rstd");
  const uint32_t f = static_cast<uint32_t>(flags);
#ifdef FUSELET_JAX_CUDA
  if (at.stream)
    return to_error(fuselet_layer_norm_fwd_cuda(&vx, param(&vw), param(&vb), eps, f, &vy, &vm, &vr, at.stream));
#endif
  return to_error(fuselet_layer_norm_fwd(&vx, param(&vw), param(&vb), eps, f, &vy, &vm, &vr));
}

// bias is read for its presence and dtype only (dbias is computed when it is present).
Error LayerNormBwd([[maybe_unused]] Where at, AnyBuffer dy, AnyBuffer x, AnyBuffer weight, AnyBuffer bias,
                   AnyBuffer mean, AnyBuffer rstd, int32_t flags, Result<AnyBuffer> dx, Result<AnyBuffer> dweight,
                   Result<AnyBuffer> dbias, [[maybe_unused]] Result<AnyBuffer> ws) {
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
#ifdef FUSELET_JAX_CUDA
  if (at.stream)
    return to_error(fuselet_layer_norm_bwd_cuda(&vdy, &vx, param(&vw), &vm, &vr, f, &vdx, param(&vdw), db,
                                                ws->untyped_data(), ws->size_bytes(), at.stream));
#endif
  return to_error(fuselet_layer_norm_bwd(&vdy, &vx, param(&vw), &vm, &vr, f, &vdx, param(&vdw), db));
}

// Argument lists shared by the CPU and CUDA bindings (flags: fuselet_norm_flags; the backward's
// last result is its workspace).
template <typename B> auto rms_fwd_args(B b) {
  return std::move(b).template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Attr<float>("eps")
      .template Attr<int32_t>("flags").template Ret<AnyBuffer>().template Ret<AnyBuffer>();
}
template <typename B> auto rms_bwd_args(B b) {
  return std::move(b).template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Arg<AnyBuffer>()
      .template Attr<int32_t>("flags").template Ret<AnyBuffer>().template Ret<AnyBuffer>().template Ret<AnyBuffer>();
}
template <typename B> auto layer_fwd_args(B b) {
  return std::move(b).template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Attr<float>("eps")
      .template Attr<int32_t>("flags").template Ret<AnyBuffer>().template Ret<AnyBuffer>().template Ret<AnyBuffer>();
}
template <typename B> auto layer_bwd_args(B b) {
  return std::move(b).template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Arg<AnyBuffer>()
      .template Arg<AnyBuffer>().template Arg<AnyBuffer>().template Attr<int32_t>("flags").template Ret<AnyBuffer>()
      .template Ret<AnyBuffer>().template Ret<AnyBuffer>().template Ret<AnyBuffer>();
}

}  // namespace
}  // namespace fuselet_jax

using namespace fuselet_jax;  // NOLINT: handler definitions below

XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_rms_norm_fwd_cpu,
                              ([](AnyBuffer x, AnyBuffer w, float eps, int32_t f, Result<AnyBuffer> y,
                                  Result<AnyBuffer> r) { return RmsNormFwd(Where{}, x, w, eps, f, y, r); }),
                              rms_fwd_args(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_rms_norm_bwd_cpu,
                              ([](AnyBuffer dy, AnyBuffer x, AnyBuffer w, AnyBuffer r, int32_t f, Result<AnyBuffer> dx,
                                  Result<AnyBuffer> dw, Result<AnyBuffer> ws) {
                                return RmsNormBwd(Where{}, dy, x, w, r, f, dx, dw, ws);
                              }),
                              rms_bwd_args(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_layer_norm_fwd_cpu,
                              ([](AnyBuffer x, AnyBuffer w, AnyBuffer b, float eps, int32_t f, Result<AnyBuffer> y,
                                  Result<AnyBuffer> m, Result<AnyBuffer> r) {
                                return LayerNormFwd(Where{}, x, w, b, eps, f, y, m, r);
                              }),
                              layer_fwd_args(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_layer_norm_bwd_cpu,
                              ([](AnyBuffer dy, AnyBuffer x, AnyBuffer w, AnyBuffer b, AnyBuffer m, AnyBuffer r,
                                  int32_t f, Result<AnyBuffer> dx, Result<AnyBuffer> dw, Result<AnyBuffer> db,
                                  Result<AnyBuffer> ws) {
                                return LayerNormBwd(Where{}, dy, x, w, b, m, r, f, dx, dw, db, ws);
                              }),
                              layer_bwd_args(ffi::Ffi::Bind()));

#ifdef FUSELET_JAX_CUDA
using Stream = ffi::PlatformStream<cudaStream_t>;
// No allocation, host synchronization or host-side state in any of them: capturable in a
// command buffer (CUDA graph).
#define FUSELET_JAX_CUDA_TRAITS {ffi::Traits::kCmdBufferCompatible}
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_rms_norm_fwd_cuda,
                              ([](cudaStream_t s, AnyBuffer x, AnyBuffer w, float eps, int32_t f, Result<AnyBuffer> y,
                                  Result<AnyBuffer> r) { return RmsNormFwd(Where{s}, x, w, eps, f, y, r); }),
                              rms_fwd_args(ffi::Ffi::Bind().Ctx<Stream>()), FUSELET_JAX_CUDA_TRAITS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_rms_norm_bwd_cuda,
                              ([](cudaStream_t s, AnyBuffer dy, AnyBuffer x, AnyBuffer w, AnyBuffer r, int32_t f,
                                  Result<AnyBuffer> dx, Result<AnyBuffer> dw, Result<AnyBuffer> ws) {
                                return RmsNormBwd(Where{s}, dy, x, w, r, f, dx, dw, ws);
                              }),
                              rms_bwd_args(ffi::Ffi::Bind().Ctx<Stream>()), FUSELET_JAX_CUDA_TRAITS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_layer_norm_fwd_cuda,
                              ([](cudaStream_t s, AnyBuffer x, AnyBuffer w, AnyBuffer b, float eps, int32_t f,
                                  Result<AnyBuffer> y, Result<AnyBuffer> m, Result<AnyBuffer> r) {
                                return LayerNormFwd(Where{s}, x, w, b, eps, f, y, m, r);
                              }),
                              layer_fwd_args(ffi::Ffi::Bind().Ctx<Stream>()), FUSELET_JAX_CUDA_TRAITS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_layer_norm_bwd_cuda,
                              ([](cudaStream_t s, AnyBuffer dy, AnyBuffer x, AnyBuffer w, AnyBuffer b, AnyBuffer m,
                                  AnyBuffer r, int32_t f, Result<AnyBuffer> dx, Result<AnyBuffer> dw,
                                  Result<AnyBuffer> db, Result<AnyBuffer> ws) {
                                return LayerNormBwd(Where{s}, dy, x, w, b, m, r, f, dx, dw, db, ws);
                              }),
                              layer_bwd_args(ffi::Ffi::Bind().Ctx<Stream>()), FUSELET_JAX_CUDA_TRAITS);
#endif
