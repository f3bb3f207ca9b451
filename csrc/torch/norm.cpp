// CPU and CUDA implementations of fuselet::{rms,layer}_norm_{fwd,bwd}: allocate outputs,
// hand core views to libfuselet (on the current CUDA stream for CUDA tensors).
#include <ATen/ATen.h>
#include <torch/library.h>

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

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x_in, const Tensor& weight_in, double eps) {
  check_x(x_in);
  check_same_device(x_in, weight_in, "weight");
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  Tensor y = at::empty_like(x), rstd = row_stats(x);
  fuselet_tensor vx = view(x, "x"), vw = view(weight, "weight"), vy = view(y, "y"), vr = view(rstd, "rstd");
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    check(fuselet_rms_norm_fwd_cuda(&vx, &vw, static_cast<float>(eps), &vy, &vr, stream_of(x)));
    return {y, rstd};
  }
#endif
  check(fuselet_rms_norm_fwd(&vx, &vw, static_cast<float>(eps), &vy, &vr));
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const Tensor& weight_in,
                                        const Tensor& rstd_in) {
  check_x(x_in);
  check_same_device(x_in, dy_in, "dy");
  check_same_device(x_in, weight_in, "weight");
  check_same_device(x_in, rstd_in, "rstd");
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), weight = weight_in.contiguous(),
               rstd = rstd_in.contiguous();
  Tensor dx = at::empty_like(x), dweight = at::empty_like(weight);
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vw = view(weight, "weight"), vr = view(rstd, "rstd"),
                 vdx = view(dx, "dx"), vdw = view(dweight, "dweight");
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    Tensor ws = workspace(x);
    check(fuselet_rms_norm_bwd_cuda(&vdy, &vx, &vw, &vr, &vdx, &vdw, ws.data_ptr(), ws.numel(), stream_of(x)));
    return {dx, dweight};
  }
#endif
  check(fuselet_rms_norm_bwd(&vdy, &vx, &vw, &vr, &vdx, &vdw));
  return {dx, dweight};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                                                  double eps) {
  check_x(x_in);
  check_same_device(x_in, weight_in, "weight");
  check_same_device(x_in, bias_in, "bias");
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous(), bias = bias_in.contiguous();
  Tensor y = at::empty_like(x), mean = row_stats(x), rstd = row_stats(x);
  fuselet_tensor vx = view(x, "x"), vw = view(weight, "weight"), vb = view(bias, "bias"), vy = view(y, "y"),
                 vm = view(mean, "mean"), vr = view(rstd, "rstd");
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    check(fuselet_layer_norm_fwd_cuda(&vx, &vw, &vb, static_cast<float>(eps), &vy, &vm, &vr, stream_of(x)));
    return {y, mean, rstd};
  }
#endif
  check(fuselet_layer_norm_fwd(&vx, &vw, &vb, static_cast<float>(eps), &vy, &vm, &vr));
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const Tensor& weight_in,
                                                  const Tensor& mean_in, const Tensor& rstd_in) {
  check_x(x_in);
  check_same_device(x_in, dy_in, "dy");
  check_same_device(x_in, weight_in, "weight");
  check_same_device(x_in, mean_in, "mean");
  check_same_device(x_in, rstd_in, "rstd");
  FUSELET_DEVICE_GUARD(x_in);
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), weight = weight_in.contiguous(),
               mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  Tensor dx = at::empty_like(x), dweight = at::empty_like(weight), dbias = at::empty_like(weight);
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vw = view(weight, "weight"), vm = view(mean, "mean"),
                 vr = view(rstd, "rstd"), vdx = view(dx, "dx"), vdw = view(dweight, "dweight"),
                 vdb = view(dbias, "dbias");
#ifdef FUSELET_TORCH_CUDA
  if (x.is_cuda()) {
    Tensor ws = workspace(x);
    check(fuselet_layer_norm_bwd_cuda(&vdy, &vx, &vw, &vm, &vr, &vdx, &vdw, &vdb, ws.data_ptr(), ws.numel(),
                                      stream_of(x)));
    return {dx, dweight, dbias};
  }
#endif
  check(fuselet_layer_norm_bwd(&vdy, &vx, &vw, &vm, &vr, &vdx, &vdw, &vdb));
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
