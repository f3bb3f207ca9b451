// CPU and CUDA implementations of fuselet::{rms,layer,add_rms}_norm_{fwd,bwd}: allocate outputs,
// hand core views to libfuselet (on the current CUDA stream for CUDA tensors).
#include <torch/library.h>

#include "fuselet/norm.h"
#include "op.h"

namespace fuselet_torch {
namespace {

// Device workspace of the CUDA backward for the rows of x.
Tensor workspace(const Tensor& x) {
  const int64_t hidden = x.size(-1);
  const size_t bytes = fuselet_norm_bwd_workspace_bytes_cuda(hidden ? x.numel() / hidden : 0, hidden);
  return at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
}

uint32_t norm_flags(bool zero_centered_gamma) { return zero_centered_gamma ? FUSELET_NORM_ZERO_CENTERED_GAMMA : 0; }

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x_in, const OptTensor& weight_in, double eps,
                                        bool zero_centered_gamma) {
  check_x(x_in);
  const Tensor x = x_in.contiguous();
  fuselet_tensor vx = view(x, "x");
  Param w(x, weight_in, "weight");
  Tensor y = at::empty_like(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  run_on(
      x, [&] { return fuselet_rms_norm_fwd(&vx, w.ptr(), e, flags, &vy, &vr); },
      [&](void* stream) { return fuselet_rms_norm_fwd_cuda(&vx, w.ptr(), e, flags, &vy, &vr, stream); });
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                        const Tensor& rstd_in, bool zero_centered_gamma) {
  check_x(x_in);
  check_same_device(x_in, dy_in, "dy");
  check_same_device(x_in, rstd_in, "rstd");
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), rstd = rstd_in.contiguous();
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vr = view(rstd, "rstd");
  Param w(x, weight_in, "weight");
  Tensor dx = at::empty_like(x), dweight = w.grad_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  run_on(
      x, [&] { return fuselet_rms_norm_bwd(&vdy, &vx, w.ptr(), &vr, flags, &vdx, vdw.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(x);
        return fuselet_rms_norm_bwd_cuda(&vdy, &vx, w.ptr(), &vr, flags, &vdx, vdw.ptr, ws.data_ptr(), ws.numel(),
                                         stream);
      });
  return {dx, dweight};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, double eps, bool zero_centered_gamma) {
  check_x(x_in);
  const Tensor x = x_in.contiguous();
  fuselet_tensor vx = view(x, "x");
  Param w(x, weight_in, "weight"), b(x, bias_in, "bias");
  Tensor y = at::empty_like(x), mean = row_stats(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  run_on(
      x, [&] { return fuselet_layer_norm_fwd(&vx, w.ptr(), b.ptr(), e, flags, &vy, &vm, &vr); },
      [&](void* stream) {
        return fuselet_layer_norm_fwd_cuda(&vx, w.ptr(), b.ptr(), e, flags, &vy, &vm, &vr, stream);
      });
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, const Tensor& mean_in,
                                                  const Tensor& rstd_in, bool zero_centered_gamma) {
  check_x(x_in);
  check_same_device(x_in, dy_in, "dy");
  check_same_device(x_in, mean_in, "mean");
  check_same_device(x_in, rstd_in, "rstd");
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous(), mean = mean_in.contiguous(),
               rstd = rstd_in.contiguous();
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  Param w(x, weight_in, "weight"), b(x, bias_in, "bias");
  Tensor dx = at::empty_like(x), dweight = w.grad_like(x), dbias = b.grad_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight"), vdb(b, dbias, "dbias");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  run_on(
      x, [&] { return fuselet_layer_norm_bwd(&vdy, &vx, w.ptr(), &vm, &vr, flags, &vdx, vdw.ptr, vdb.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(x);
        return fuselet_layer_norm_bwd_cuda(&vdy, &vx, w.ptr(), &vm, &vr, flags, &vdx, vdw.ptr, vdb.ptr, ws.data_ptr(),
                                           ws.numel(), stream);
      });
  return {dx, dweight, dbias};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd(const Tensor& x_in, const Tensor& residual_in,
                                                    const OptTensor& weight_in, double eps, bool zero_centered_gamma) {
  check_x(x_in);
  check_same_device(x_in, residual_in, "residual");
  const Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  fuselet_tensor vx = view(x, "x"), vres = view(residual, "residual");
  Param w(x, weight_in, "weight");
  Tensor y = at::empty_like(x), h = at::empty_like(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vh = view(h, "residual_out"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  run_on(
      x, [&] { return fuselet_add_rms_norm_fwd(&vx, &vres, w.ptr(), e, flags, &vy, &vh, &vr); },
      [&](void* stream) {
        return fuselet_add_rms_norm_fwd_cuda(&vx, &vres, w.ptr(), e, flags, &vy, &vh, &vr, stream);
      });
  return {y, h, rstd};
}

std::tuple<Tensor, Tensor> add_rms_norm_bwd(const Tensor& dy_in, const Tensor& dh_in, const Tensor& h_in,
                                            const OptTensor& weight_in, const Tensor& rstd_in,
                                            bool zero_centered_gamma) {
  check_x(h_in);
  check_same_device(h_in, dy_in, "dy");
  check_same_device(h_in, dh_in, "dresidual_out");
  check_same_device(h_in, rstd_in, "rstd");
  const Tensor dy = dy_in.contiguous(), dh = dh_in.contiguous(), h = h_in.contiguous(), rstd = rstd_in.contiguous();
  fuselet_tensor vdy = view(dy, "dy"), vdh = view(dh, "dresidual_out"), vh = view(h, "residual_out"),
                 vr = view(rstd, "rstd");
  Param w(h, weight_in, "weight");
  Tensor dx = at::empty_like(h), dweight = w.grad_like(h);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  run_on(
      h, [&] { return fuselet_add_rms_norm_bwd(&vdy, &vdh, &vh, w.ptr(), &vr, flags, &vdx, vdw.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(h);
        return fuselet_add_rms_norm_bwd_cuda(&vdy, &vdh, &vh, w.ptr(), &vr, flags, &vdx, vdw.ptr, ws.data_ptr(),
                                             ws.numel(), stream);
      });
  return {dx, dweight};
}

void impls(torch::Library& m) {
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd);
  m.impl("add_rms_norm_bwd", &add_rms_norm_bwd);
  m.impl("rms_norm_fwd", &rms_norm_fwd);
  m.impl("rms_norm_bwd", &rms_norm_bwd);
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("layer_norm_bwd", &layer_norm_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
