// What every op implementation of the torch layer does the same way: run a core entry point
// on the tensor's device (the CPU kernel, or the CUDA kernel on the current stream of x's
// device), optional parameters, float32 per-row outputs.
#pragma once

#include "api.h"
#include "checks.h"
#include "view.h"

namespace fuselet_torch {

// Float32 values, one per row of x: shape x.shape[:-1].
inline Tensor row_stats(const Tensor& x) {
  std::vector<int64_t> shape = shape_of(x);
  shape.pop_back();
  return alloc(x, shape, ScalarType::Float);
}

// Calls the core: cpu() for tensors in host memory, cuda(stream) for CUDA tensors with x's
// device current and its current stream; a failed status raises (see check).
template <typename Cpu, typename Cuda>
void run_on(const Tensor& x, Cpu&& cpu, [[maybe_unused]] Cuda&& cuda) {
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    const CudaScope scope(x);
    check(cuda(scope.stream()));
    return;
  }
#else
  FUSELET_CHECK_NOT_IMPLEMENTED(!x.is_cuda(), "fuselet: this fuselet-torch was built without CUDA kernels");
#endif
  check(cpu());
}

// A tensor argument and its core view: first of the tensor as the caller gave it (its own
// strides), for the core's `_check`, which reads no data; then, after contiguous(), of a
// contiguous copy (the tensor itself when it is contiguous), for the kernel.
// `make`: view, or index_view for class ids.
struct Arg {
  using MakeView = fuselet_tensor (*)(const Tensor&, const char*);
  Tensor t;
  fuselet_tensor v{};
  const char* name;
  MakeView make;
  Arg(const Tensor& in, const char* arg_name, MakeView make_view = view) : t(in), name(arg_name), make(make_view) {
    check_defined(in, arg_name);
    v = make(in, arg_name);
  }
  void contiguous() {
    t = make_contiguous(t);
    v = make(t, name);
  }
};

// An optional parameter (weight, bias) as an Arg: its view is NULL when it is absent.
struct Param {
  OptTensor t;
  fuselet_tensor v{};
  const char* name;
  Param(const OptTensor& in, const char* arg_name) : t(in), name(arg_name) {
    if (t.has_value()) v = view(*t, arg_name);
  }
  void contiguous() {
    if (!t.has_value()) return;
    t = make_contiguous(*t);
    v = view(*t, name);
  }
  fuselet_tensor* ptr() { return t.has_value() ? &v : nullptr; }
  // The gradient of this parameter: like it, or an empty tensor of x's dtype when absent.
  Tensor grad_like(const Tensor& x) const { return t.has_value() ? alloc_like(*t) : alloc(x, {0}, x.scalar_type()); }
};

// View of a gradient output that exists only when its parameter does.
struct GradView {
  fuselet_tensor v{};
  fuselet_tensor* ptr = nullptr;
  GradView(const Param& param, const Tensor& g, const char* name) {
    if (!param.t.has_value()) return;
    v = view(g, name);
    ptr = &v;
  }
};

}  // namespace fuselet_torch
