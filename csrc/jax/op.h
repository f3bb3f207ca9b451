// What every FFI handler of the JAX layer does the same way: run a core entry point on the
// CPU or on XLA's CUDA stream, absent parameters, and the CPU + CUDA handler symbols.
#pragma once

#include "view.h"

#ifdef FUSELET_JAX_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fuselet_jax {

// stream == nullptr: host buffers and CPU kernels; else device buffers on that stream.
struct Where {
  void* stream = nullptr;
};

// cpu() for host buffers, cuda(stream) for device buffers; the status as an ffi::Error.
template <typename Cpu, typename Cuda>
ffi::Error run_on(Where at, Cpu&& cpu, [[maybe_unused]] Cuda&& cuda) {
#ifdef FUSELET_JAX_CUDA
  if (at.stream) return to_error(cuda(at.stream));
#endif
  return to_error(cpu());
}

// A parameter buffer with no elements stands for an absent parameter (x's last dim is > 0,
// so a present one never has 0 elements): NULL for the core.
inline fuselet_tensor* param(fuselet_tensor* v) { return v->ndim == 1 && v->shape[0] == 0 ? nullptr : v; }

}  // namespace fuselet_jax

// Defines the handler symbols fuselet_jax_<op>_cpu and, in CUDA builds, fuselet_jax_<op>_cuda,
// both calling impl(Where, args...) with the arguments bind(binding) declares. The CUDA
// handlers allocate nothing, never synchronize with the host and keep no host-side state:
// they are declared compatible with XLA command buffers (CUDA graphs).
#define FUSELET_JAX_HANDLERS(op, impl, bind)                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_##op##_cpu,                                         \
                                ([](auto... a) { return impl(::fuselet_jax::Where{}, a...); }), \
                                bind(::xla::ffi::Ffi::Bind()));                                 \
  FUSELET_JAX_CUDA_HANDLER(op, impl, bind)

#ifdef FUSELET_JAX_CUDA
#define FUSELET_JAX_CUDA_HANDLER(op, impl, bind)                                                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(fuselet_jax_##op##_cuda,                                                         \
                                ([](cudaStream_t s, auto... a) { return impl(::fuselet_jax::Where{s}, a...); }), \
                                bind(::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()),   \
                                {::xla::ffi::Traits::kCmdBufferCompatible});
#else
#define FUSELET_JAX_CUDA_HANDLER(op, impl, bind)
#endif
