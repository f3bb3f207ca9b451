// CPU and CUDA implementations of fuselet::{rms,layer}_norm_{fwd,bwd}: allocate outputs,
// hand core views to libfuselet (on the current CUDA stream for CUDA tensors).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#ifdef FUSELET_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "fuselet/norm.h"
#include "view.h"

namespace fuselet_torch {
namespace {

using at::Tensor;

// Float32 statistics, one per row: shape x.shape[:-1].
Tensor row_stats(const Tensor& x) {
  return at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
}

void check_x(const Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected a tensor of shape [..., H], got a 0-d tensor");
}

#ifdef FUSELET_TORCH_CUDA
void* stream_of(const Tensor& x) { return at::cuda::getCurrentCUDAStream(x.device().index()).stream(); }
Tensor workspace(const Tensor& x) {
  const int64_t hidden = x.size(-1);
  const size_t bytes = fuselet_norm_bwd_workspace_bytes_cuda(hidden ? x.numel() / hidden : 0, hidden);
  return at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
}
#define FUSELET_DEVICE_GUARD(x) const c10::cuda::OptionalCUDAGuard guard(x.is_cuda() ? std::optional<c10::Device>(x.device()) : std::nullopt)
#else
#define FUSELET_DEVICE_GUARD(x) TORCH_CHECK_NOT_IMPLEMENTED(!x.is_cuda(), "fuselet: this fuselet-torch was built without CUDA kernels")
#endif

using OptTensor = std::optional<Tensor>;

uint32_t norm_flags(bool zero_centered_gamma) { return zero_centered_gamma ? FUSELET_NORM_ZERO_CENTERED_GAMMA : 0; }

// An optional parameter made contiguous (on x's device), and its core view (NULL when absent).
struct Param {
  OptTensor t;
  fuselet_tensor v{};
  Param(const Tensor& x, const OptTensor& in, const char* name) {
    if (!in.has_value()) return;
    check_same_device(x, *in, name);
    t = in->contiguous();
    v = view(*t, name);
  }
  fuselet_tensor* ptr() { return t.has_value() ? &v : nullptr; }
  // The gradient of this parameter: like it, or an empty tensor of x's dtype when absent.
  Tensor grad_like(const Tensor& x) const { return t.has_value() ? at::empty_like(*t) : x.new_empty({0}); }
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

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x_in, const OptTensor& weight_in, double eps,
                                        bool zero_centered_gamma) {
  check_x(x_in);
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor x = x_in.contiguous();
  fuselet_tensor vx = view(x, "x");
  Param w(x, weight_in, "weight");
  Tensor y = at::empty_like(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    check(fuselet_rms_norm_fwd_cuda(&vx, w.ptr(), static_cast<float>(eps), flags, &vy, &vr, stream_of(x)));
    return {y, rstd};
  }
#endif
  check(fuselet_rms_norm_fwd(&vx, w.ptr(), static_cast<float>(eps), flags, &vy, &vr));
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                        const Tensor& rstd_in, bool zero_centered_gamma) {
  check_x(x_in);
  check_same_device(x_in, dy_in, "dy");
  check_same_device(x_in, rstd_in, "rstd");
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), rstd = rstd_in.contiguous();
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vr = view(rstd, "rstd");
  Param w(x, weight_in, "weight");
  Tensor dx = at::empty_like(x), dweight = w.grad_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    Tensor ws = workspace(x);
    check(fuselet_rms_norm_bwd_cuda(&vdy, &vx, w.ptr(), &vr, flags, &vdx, vdw.ptr, ws.data_ptr(), ws.numel(),
                                    stream_of(x)));
    return {dx, dweight};
  }
#endif
  check(fuselet_rms_norm_bwd(&vdy, &vx, w.ptr(), &vr, flags, &vdx, vdw.ptr));
  return {dx, dweight};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, double eps, bool zero_centered_gamma) {
  check_x(x_in);
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor x = x_in.contiguous();
  fuselet_tensor vx = view(x, "x");
  Param w(x, weight_in, "weight"), b(x, bias_in, "bias");
  Tensor y = at::empty_like(x), mean = row_stats(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    check(fuselet_layer_norm_fwd_cuda(&vx, w.ptr(), b.ptr(), static_cast<float>(eps), flags, &vy, &vm, &vr,
                                      stream_of(x)));
    return {y, mean, rstd};
  }
#endif
  check(fuselet_layer_norm_fwd(&vx, w.ptr(), b.ptr(), static_cast<float>(eps), flags, &vy, &vm, &vr));
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, const Tensor& mean_in,
                                                  const Tensor& rstd_in, bool zero_centered_gamma) {
  check_x(x_in);
  check_same_device(x_in, dy_in, "dy");
  check_same_device(x_in, mean_in, "mean");
  check_same_device(x_in, rstd_in, "rstd");
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), mean = mean_in.contiguous(),
               rstd = rstd_in.contiguous();
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  Param w(x, weight_in, "weight"), b(x, bias_in, "bias");
  Tensor dx = at::empty_like(x), dweight = w.grad_like(x), dbias = b.grad_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight"), vdb(b, dbias, "dbias");
  const uint32_t flags = norm_flags(zero_centered_gamma);
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    Tensor ws = workspace(x);
    check(fuselet_layer_norm_bwd_cuda(&vdy, &vx, w.ptr(), &vm, &vr, flags, &vdx, vdw.ptr, vdb.ptr, ws.data_ptr(),
                                      ws.numel(), stream_of(x)));
    return {dx, dweight, dbias};
  }
#endif
  check(fuselet_layer_norm_bwd(&vdy, &vx, w.ptr(), &vm, &vr, flags, &vdx, vdw.ptr, vdb.ptr));
  return {dx, dweight, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(fuselet, CPU, m) {
  m.impl("rms_norm_fwd", &rms_norm_fwd);
  m.impl("rms_norm_bwd", &rms_norm_bwd);
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("layer_norm_bwd", &layer_norm_bwd);
}

#ifdef FUSELET_TORCH_CUDA
TORCH_LIBRARY_IMPL(fuselet, CUDA, m) {
  m.impl("rms_norm_fwd", &rms_norm_fwd);
  m.impl("rms_norm_bwd", &rms_norm_bwd);
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("layer_norm_bwd", &layer_norm_bwd);
}
#endif

}  // namespace fuselet_torch
