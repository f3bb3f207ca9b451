// What every FFI handler of the JAX layer does the same way: run a core entry point on the
// CPU or on XLA's CUDA stream, absent parameters, and the CPU + CUDA handler symbols.
#pragma once

#include <tuple>
#include <type_traits>

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

// The XLA FFI binding of a handler impl(Where, P...), read off its parameters in order: an
// AnyBuffer is an operand (Arg), a Result<AnyBuffer> a result (Ret), any other type an
// attribute (Attr), named by the next of `names` (the Python layer passes attributes by name).
// Built as one chain of calls on temporaries from start() (ffi::Binding cannot be moved).
template <typename... P>
struct Params {
  template <typename T>
  static constexpr bool kBuffer = std::is_same_v<T, ffi::AnyBuffer> || std::is_same_v<T, ffi::Result<ffi::AnyBuffer>>;
  static constexpr size_t kAttrs = (0 + ... + (kBuffer<P> ? 0 : 1));

  // The number of attributes among the first n parameters.
  static constexpr size_t attrs_before(size_t n) {
    constexpr bool attr[] = {!kBuffer<P>..., false};
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) count += attr[i] ? 1 : 0;
    return count;
  }

  // The binding of the first N parameters.
  template <size_t N, typename Start>
  static auto bind(Start start, const char* const* names) {
    if constexpr (N == 0) {
      return start();
    } else {
      using T = std::tuple_element_t<N - 1, std::tuple<P...>>;
      if constexpr (std::is_same_v<T, ffi::AnyBuffer>)
        return bind<N - 1>(start, names).template Arg<ffi::AnyBuffer>();
      else if constexpr (std::is_same_v<T, ffi::Result<ffi::AnyBuffer>>)
        return bind<N - 1>(start, names).template Ret<ffi::AnyBuffer>();
      else
        return bind<N - 1>(start, names).template Attr<T>(names[attrs_before(N - 1)]);
    }
  }
};

template <typename... P, typename Start, typename... Names>
auto bind_handler(ffi::Error (*)(Where, P...), Start start, Names... names) {
  static_assert(Params<P...>::kAttrs == sizeof...(Names), "one name per attribute of the handler");
  const char* const list[] = {names...};
  return Params<P...>::template bind<sizeof...(P)>(start, list);
}

}  // namespace fuselet_jax

// Defines the handler symbols fuselet_jax_<op>_cpu and, in CUDA builds, fuselet_jax_<op>_cuda,
// both calling impl(Where, args...), bound by bind_handler: the names that follow impl are those
// of its attributes, in order. The CUDA handlers allocate nothing, never synchronize with the
// host and keep no host-side state: they are declared compatible with XLA command buffers
// (CUDA graphs).
#define FUSELET_JAX_HANDLERS(op, impl, ...)                                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      fuselet_jax_##op##_cpu, ([](auto... a) { return impl(::fuselet_jax::Where{}, a...); }),   \
      ::fuselet_jax::bind_handler(&impl, [] { return ::xla::ffi::Ffi::Bind(); }, __VA_ARGS__)); \
  FUSELET_JAX_CUDA_HANDLER(op, impl, __VA_ARGS__)

#ifdef FUSELET_JAX_CUDA
#define FUSELET_JAX_CUDA_HANDLER(op, impl, ...)                                                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                                \
      fuselet_jax_##op##_cuda, ([](cudaStream_t s, auto... a) { return impl(::fuselet_jax::Where{s}, a...); }), \
      ::fuselet_jax::bind_handler(                                                                              \
          &impl, [] { return ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>(); },        \
          __VA_ARGS__),                                                                                         \
      {::xla::ffi::Traits::kCmdBufferCompatible});
#else
#define FUSELET_JAX_CUDA_HANDLER(op, impl, ...)
#endif
